"""Connections survive a change of next hops (issue 9, point 8): node-side flow handover.

When a router's ECMP set changes (a node drained, added or back), the router rehashes and some
established connections arrive at a node that does not know them; that node's TCP answers with
a reset. Here every node instead copies such a segment at layer 2 to the other nodes and drops
it: the node that holds the connection takes it (its conntrack knows the flow), the others drop
their copy silently. A drained node keeps the VIP on ``lo`` and its connections finish on it,
while new connections (SYN) go where the router sends them. The node label
``nocloud.io/bgp-flow-handover=off`` turns it off on that node.

Rules (one nftables table per family, replaced in one ``nft -f``)::

    table ip nocloudlb_bgp_flows {
      set peers { type ether_addr; elements = { <the other nodes' MACs> } }
      chain pre {
        type filter hook prerouting priority -140; policy accept;   # after conntrack (-200)
        ip daddr @vips tcp flags & syn == 0 ct state new goto unknown
        ip daddr @vips tcp flags & (fin|rst) != 0 tcp flags & syn == 0 ct state invalid goto unknown
      }
      chain unknown {                                                # a segment of a flow not ours
        ether saddr @peers drop                                      # a peer's copy: not ours either
        limit rate R/second burst B packets dup to A device D ... drop
        drop                                                         # over the limit: never a reset
      }
    }

``ct state new`` on a segment without SYN is a mid-stream segment of a flow this node never saw
(conntrack's default ``nf_conntrack_tcp_loose=1`` picks it up as new); a FIN or RST of such a
flow is ``invalid`` instead (conntrack never picks a flow up from them), and is handed over too,
so that a connection of a drained node also closes on it (a half-close waits for its answer).
Copies go only to peers on the same link (``ip route get`` without a gateway) whose MAC the
neighbour table knows. The rate limit bounds what a flood of spoofed segments can make a node
send; its burst is one second of it, since a rehash moves many flows at the same instant (with
nft's default burst of 5 segments, 12 segments in 0.4 ms after a drain went over it, and the
segments over the limit were answered with resets: the drained node's connections that broke).
Over the limit a segment is dropped, not reset: its sender sends it again and the copy goes then.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nocloudlb.core.schema import FLOW_HANDOVER_RATE

from .. import logs

log = logging.getLogger("nocloudlb.bgp")

FLOW_TABLE = "nocloudlb_bgp_flows"
DEFAULT_RATE = FLOW_HANDOVER_RATE  # copied segments per second, per family (speaker config bgp.flowHandover)
DEFAULT_BURST = DEFAULT_RATE  # copied at once after a quiet time (one second's worth)
REAPPLY = 30.0  # seconds: the tables are written again even when unchanged
# a node label that turns the handover off on that node (any other value, or none: on)
OFF_LABEL = "nocloud.io/bgp-flow-handover"


@dataclass(frozen=True)
class Peer:
    address: str
    mac: str
    device: str


def flow_rules(vips: Iterable[str], peers: Iterable[Peer], rate: int = DEFAULT_RATE,
               burst: int | None = None) -> str:
    """The nft script that (re)creates the flow-handover tables for ``vips`` (and removes them when
    there is nothing to hand over: no VIP or no peer of that family). ``burst`` defaults to ``rate``."""
    burst = rate if burst is None else burst
    if rate < 1 or burst < 1:
        raise ValueError(f"flow handover: rate {rate} and burst {burst} must be at least 1")
    vip_list = sorted({str(ipaddress.ip_address(v)) for v in vips}, key=lambda a: ipaddress.ip_address(a).packed)
    peer_list = sorted(set(peers), key=lambda p: (ipaddress.ip_address(p.address).version,
                                                  ipaddress.ip_address(p.address).packed))
    out = []
    for family, version, l3 in (("ip", 4, "ip"), ("ip6", 6, "ip6")):
        out += [f"table {family} {FLOW_TABLE} {{}}", f"delete table {family} {FLOW_TABLE}"]
        fam_vips = [v for v in vip_list if ipaddress.ip_address(v).version == version]
        fam_peers = [p for p in peer_list if ipaddress.ip_address(p.address).version == version]
        if not fam_vips or not fam_peers:
            continue
        addr_type = "ipv4_addr" if version == 4 else "ipv6_addr"
        dups = " ".join(f'dup to {p.address} device "{p.device}"' for p in fam_peers)
        macs = ", ".join(sorted({p.mac for p in fam_peers}))
        out.append(
            f"table {family} {FLOW_TABLE} {{\n"
            f"  set vips {{ type {addr_type}; elements = {{ {', '.join(fam_vips)} }} }}\n"
            f"  set peers {{ type ether_addr; elements = {{ {macs} }} }}\n"
            "  chain pre {\n"
            "    type filter hook prerouting priority -140; policy accept;\n"
            f"    {l3} daddr @vips tcp flags & syn == 0 ct state new goto unknown\n"
            f"    {l3} daddr @vips tcp flags & (fin | rst) != 0 tcp flags & syn == 0 ct state invalid goto unknown\n"
            "  }\n"
            "  chain unknown {\n"
            "    ether saddr @peers counter drop\n"
            f"    limit rate {rate}/second burst {burst} packets counter {dups} drop\n"
            "    counter drop\n"
            "  }\n}")
    return "\n".join(out) + "\n"


def resolve_peers(addresses: Iterable[str], run: Callable[[list[str]], str]) -> tuple[list[Peer], list[str]]:
    """The on-link peers among ``addresses`` with their MAC and device (``run``: argv -> stdout of
    ``ip -j ...``), and why the others were left out."""
    peers, skipped = [], []
    for address in addresses:
        try:
            route = (json.loads(run(["ip", "-j", "route", "get", address]) or "[]") or [{}])[0]
        except (ValueError, OSError) as exc:
            skipped.append(f"{address}: {exc}")
            continue
        device = route.get("dev", "")
        if route.get("gateway") or not device or device == "lo":
            skipped.append(f"{address}: not on a link of this node (route {route})")
            continue
        try:
            neigh = json.loads(run(["ip", "-j", "neigh", "show", address, "dev", device]) or "[]")
        except (ValueError, OSError) as exc:
            skipped.append(f"{address}: {exc}")
            continue
        mac = next((n.get("lladdr") for n in neigh if n.get("lladdr") and "FAILED" not in (n.get("state") or [])),
                   None)
        if not mac:
            skipped.append(f"{address}: no neighbour entry yet")
            continue
        peers.append(Peer(address, mac, device))
    return peers, skipped


class FlowHandover:
    """Keeps the flow-handover tables in line with the VIPs this node serves and its peers."""

    def __init__(self, peers: Iterable[str], run: Callable[[list[str], str | None], str],
                 rate: int = DEFAULT_RATE, burst: int | None = None) -> None:
        self.addresses = list(dict.fromkeys(peers))
        self.run = run  # (argv, stdin) -> stdout; raises on failure
        self.rate = rate
        self.burst = rate if burst is None else burst
        self.applied = ""
        self.applied_at = 0.0
        self.error = ""
        self.peers: list[Peer] = []
        self.skipped: list[str] = []

    def refresh(self, vips: Iterable[str]) -> None:
        if not self.addresses:
            return
        peers, skipped = resolve_peers(self.addresses, lambda argv: self.run(argv, None))
        script = flow_rules(vips, peers, self.rate, self.burst)
        if script == self.applied and time.monotonic() - self.applied_at < REAPPLY:
            return  # unchanged; put back every REAPPLY s all the same (`nft flush ruleset` elsewhere)
        try:
            self.run(["nft", "-f", "-"], script)
        except Exception as exc:  # noqa: BLE001 - logged, retried at the next refresh
            if str(exc) != self.error:
                logs.event(log, "bgpFlowHandoverFailed", str(exc)[:500], logging.ERROR)
            self.error = str(exc)
            return
        changed = script != self.applied
        self.applied, self.applied_at, self.error = script, time.monotonic(), ""
        self.peers, self.skipped = peers, skipped
        if changed:
            logs.event(log, "bgpFlowHandover", peers=[p.address for p in peers], skipped=skipped[:10])

    def clear(self) -> None:
        if self.applied:
            try:
                self.run(["nft", "-f", "-"], flow_rules([], []))
            except Exception as exc:  # noqa: BLE001
                logs.event(log, "bgpFlowHandoverFailed", str(exc)[:500], logging.ERROR)
            self.applied = ""

    def status(self) -> dict:
        return {"peers": [p.address for p in self.peers], "skipped": self.skipped, "error": self.error,
                "active": bool(self.applied and self.peers and "dup to" in self.applied),
                "rate": self.rate, "burst": self.burst}
