"""Planned moves under load: TCP connections reset with handover forwarding on and off, in one run.

Three speakers and a client on a bridge in network namespaces (fast profile). Every node runs an
HTTP server whose answers take 50 ms, so a connection is nearly always in flight; the client GETs
the VIP back to back; the VIP's leader is drained and undrained ``--cycles`` times. Each drain
and each undrain flips the client's ARP entry. Printed per mode: owner changes the client saw,
requests, failed requests and their errors, and the time from each label change (sent on the
control socket, as ``node_drain`` / ``drain.yml`` do) to the new owner's first gratuitous ARP.
``handover.grace: 30`` is the default; ``0`` is what the speaker did before handover forwarding
(and what keepalived or MetalLB do on a move).

    sudo .venv/bin/python benchmarks/handover.py --cycles 5
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "netns"))

from netns import make_segment  # noqa: E402
from nocloudlb.core.control_client import request  # noqa: E402
from nocloudlb.core.election import DRAIN_LABEL, election_order  # noqa: E402
from speaker_harness import (  # noqa: E402
    Capture,
    HttpPoller,
    SpeakerCluster,
    pool_docs,
    service_doc,
    spread_vips,
    start_slow_http,
)

NODES = ["n1", "n2", "n3"]


def run(grace: float, cycles: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="nlb-handover-") as tmp, make_segment("nhb", hosts=3) as seg:
        vips = spread_vips(NODES)
        docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
        c = SpeakerCluster(seg, Path(tmp), profile="fast", resources=docs)
        for name in c.names:
            c.write_config(name, c.config(name, handover={"grace": grace}))
        c.start_all()
        ip = next(iter(vips))
        first, second = election_order(NODES, ip)[:2]
        start_slow_http(c)
        url = f"http://{ip}:8090/"
        c.wait(lambda: seg.run(seg.client.ns, ["curl", "-s", "-m", "2", url], check=False).stdout.strip() == first,
               10, "slow HTTP served by the leader")
        cap = Capture(seg, Path(tmp) / "cap.txt", expr="arp")
        poll = HttpPoller(seg, url, cycles * 10 + 30)
        to_garp: list[float] = []
        for _dummy_cycle in range(cycles):
            for req, owner in (({"set": {DRAIN_LABEL: "true"}}, second), ({"unset": [DRAIN_LABEL]}, first)):
                t = time.time()
                assert request(c.sock(first), {"cmd": "label", **req}).get("ok")
                g = c.wait(lambda t=t, owner=owner: cap.gratuitous(ip, c.mac(owner), t), 15, f"{owner}'s GARP")
                to_garp.append(g[0]["ts"] - t)
                c.wait(lambda t=t, owner=owner: poll.served_by(owner, t), 15, f"{owner} serving")
                time.sleep(1.5)
        poll.stop()
        errors = collections.Counter(s["body"].split(":")[0] for s in poll.failed)
        ms = sorted(v * 1000 for v in to_garp)
        return {"grace": grace, "moves": poll.moves, "requests": len(poll.samples), "failed": len(poll.failed),
                "errors": dict(errors), "label_to_garp_ms": {"p50": ms[len(ms) // 2], "max": ms[-1], "all": ms}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5, help="drain + undrain rounds per mode")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    rows = []
    for grace in (30.0, 0.0):
        print(f"handover.grace={grace:g}: {a.cycles} drains and undrains under a client ...", file=sys.stderr,
              flush=True)
        rows.append(run(grace, a.cycles))
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'handover forwarding':<26} {'moves':>6} {'requests':>9} {'failed':>7} {'label->GARP p50/max ms':>23}"
          "  errors")
    for r in rows:
        label = f"on (grace {r['grace']:g} s)" if r["grace"] else "off (grace 0)"
        g = r["label_to_garp_ms"]
        print(f"{label:<26} {r['moves']:>6} {r['requests']:>9} {r['failed']:>7} "
              f"{g['p50']:>11.0f} / {g['max']:<9.0f}  {r['errors'] or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
