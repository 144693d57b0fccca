"""BGP flow handover: resolving the peers of one refresh, at the size of a large cluster.

A node of BGP mode hands segments of flows it does not know to its on-link peers (the other
members), so every refresh finds out which peers are on a link and their MACs. This script
builds a namespace of its own with one link and N peers in its neighbour table (documentation
addresses, static entries, no traffic), then resolves all N peers the two ways, side by side
in one run:

* ``ip`` commands: two processes per peer (``ip -j route get`` and ``ip -j neigh show``), as
  the speaker did before;
* netlink: ``nocloudlb.bgp.flows.netlink_resolver``, route and neighbour lookups from this
  process (pyroute2), as the speaker does now.

It prints, per way: the processes started per refresh and the time of one refresh (median and
worst of ``--refreshes``, each resolving every peer one after another), measured from inside the
namespace as the speaker runs on its node. Both ways must find the same peers, or the script fails.

Run (root): ``.venv/bin/python benchmarks/flow_peers.py --peers 300`` (well under a minute).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speaker"))

from nocloudlb.bgp.flows import Peer, netlink_resolver  # noqa: E402


def by_commands():
    """The previous way: two ``ip`` processes per peer."""
    def run(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    def resolve(address: str) -> tuple[Peer | None, str]:
        route = (json.loads(run(["ip", "-j", "route", "get", address]) or "[]") or [{}])[0]
        device = route.get("dev", "")
        if route.get("gateway") or not device or device == "lo":
            return None, f"{address}: not on a link"
        neigh = json.loads(run(["ip", "-j", "neigh", "show", address, "dev", device]) or "[]")
        mac = next((n["lladdr"] for n in neigh if n.get("lladdr")), None)
        return (Peer(address, mac, device), "") if mac else (None, f"{address}: no neighbour entry")
    return resolve


def peer_address(i: int) -> str:
    return f"198.51.100.{i + 1}" if i < 250 else f"2001:db8:1::{i + 1:x}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--peers", type=int, default=300)
    ap.add_argument("--refreshes", type=int, default=5)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)  # the measuring run, in the namespace
    args = ap.parse_args()
    if args.inside:
        return measure(args)
    ns = f"nfp-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        setup = ["link set lo up", "link add fp0 type veth peer name fp1", "link set fp0 up", "link set fp1 up",
                 "addr add 198.51.100.254/24 dev fp0", "addr add 2001:db8:1::fffe/64 dev fp0 nodad"]
        setup += [f"neigh replace {peer_address(i)} lladdr 02:00:00:00:{i >> 8:02x}:{i & 255:02x} dev fp0"
                  for i in range(args.peers)]
        subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(setup) + "\n", text=True, check=True)
        # measured from inside the namespace, as the speaker runs on its node
        return subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "--inside",
                               "--peers", str(args.peers), "--refreshes", str(args.refreshes)], check=False).returncode
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def measure(args: argparse.Namespace) -> int:
    addresses = [peer_address(i) for i in range(args.peers)]
    found: dict[str, list] = {}
    print(f"resolving {args.peers} on-link peers, {args.refreshes} refreshes per way")
    print(f"{'way':<14} {'processes/refresh':>17} {'refresh median':>15} {'worst':>9}")
    for name, resolve, procs in (("ip commands", by_commands(), 2 * args.peers), ("netlink", netlink_resolver(), 0)):
        times = []
        for _r in range(args.refreshes):
            t0 = time.perf_counter()
            found[name] = [resolve(a)[0] for a in addresses]
            times.append(time.perf_counter() - t0)
        print(f"{name:<14} {procs:>17} {statistics.median(times) * 1000:>12.1f} ms {max(times) * 1000:>6.1f} ms")
    if found["ip commands"] != found["netlink"] or None in found["netlink"]:
        print("the two ways found different peers", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
