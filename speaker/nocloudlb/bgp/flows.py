"""Connections survive a change of next hops: node-side flow handover.

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
Copies go only to peers on the same link (a route lookup without a gateway) whose MAC the
neighbour table knows; both are asked over netlink from this process (pyroute2), so a refresh
starts no process per peer (two ``ip`` processes per peer and refresh before: about 600 a second
at 300 nodes). The rate limit bounds what a flood of spoofed segments can make a node
send; its burst is one second of it, since a rehash moves many flows at the same instant (with
nft's default burst of 5 segments, 12 segments in 0.4 ms after a drain went over it, and the
segments over the limit were answered with resets: the drained node's connections that broke).
Over the limit a segment is dropped, not reset: its sender sends it again and the copy goes then.

Each peer is resolved on its own (one blackholed peer's failing route lookup once stopped every
refresh, and flows toward the other peers were no longer handed over). A peer whose
resolution fails (an error, or no answer within ``PEER_DEADLINE``) is logged with its address
(``bgpFlowPeerFailed``, once per new error; ``bgpFlowPeerRecovered``), counted and backed off on its
own ``Backoff`` (``nocloudlb_backoff_*{tool="bgp-flows-peer ADDRESS"}``, ``peerErrors`` in the status),
keeps the entry it last resolved to, if any; the others are written at once.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ndmsg import NUD_FAILED

from nocloudlb.core.schema import FLOW_HANDOVER_RATE

from .. import logs
from ..backoff import Backoff, BackoffCollector, backoff_metrics

log = logging.getLogger("nocloudlb.bgp")

FLOW_TABLE = "nocloudlb_bgp_flows"
DEFAULT_RATE = FLOW_HANDOVER_RATE  # copied segments per second, per family (speaker config bgp.flowHandover)
DEFAULT_BURST = DEFAULT_RATE  # copied at once after a quiet time (one second's worth)
REAPPLY = 30.0  # seconds: the tables are written again even when unchanged
# a node label that turns the handover off on that node (any other value, or none: on)
OFF_LABEL = "nocloud.io/bgp-flow-handover"
PEER_DEADLINE = 1.0  # seconds a refresh waits for one peer's resolution; a later answer counts at the next one
NEIGHBOURS_MAX_AGE = 0.2  # seconds a dump of the neighbour table serves the lookups of one refresh
RTN_UNICAST = 1  # a route's type (linux/rtnetlink.h): local, blackhole, unreachable... are others
PEER_BACKOFF_BASE, PEER_BACKOFF_CEILING = 1.0, 60.0  # a failing peer: tried again after 0.5-1 s, ..., at most 60 s


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


Resolve = Callable[[str], tuple[Peer | None, str]]


def netlink_resolver(netns: str | None = None, max_age: float = NEIGHBOURS_MAX_AGE) -> Resolve:
    """A ``Resolve``: ``address`` as an on-link peer with its MAC and device, or (None, why it is left out)
    when it is not one (yet): behind a gateway, local, no neighbour entry. Asks the kernel over netlink
    (the network namespace ``netns``, default this process's): a route lookup per address, and the
    neighbour table and link names dumped once for all the peers of a refresh (at most ``max_age``
    seconds old; the kernel has no working lookup of one neighbour through pyroute2, and filtering a
    dump per peer costs a dump per peer). Raises when the kernel refuses the lookup (no route, a
    blackhole: "route lookup of ADDRESS: Invalid argument"). Safe to call from several threads."""
    lock = threading.Lock()
    snapshot: dict[str, Any] = {"at": -1e9, "neigh": {}, "links": {}}

    def tables(ipr: IPRoute) -> tuple[dict[tuple[str, int], str], dict[int, str]]:
        with lock:
            if time.monotonic() - snapshot["at"] > max_age:
                snapshot["neigh"] = {(n.get("NDA_DST"), n["ifindex"]): n.get("NDA_LLADDR")
                                     for n in ipr.get_neighbours()
                                     if n.get("NDA_LLADDR") and not n["state"] & NUD_FAILED}
                snapshot["links"] = {link["index"]: link.get("IFLA_IFNAME", "") for link in ipr.get_links()}
                snapshot["at"] = time.monotonic()
            return snapshot["neigh"], snapshot["links"]

    def resolve(address: str) -> tuple[Peer | None, str]:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        # flags=0: a namespace that is gone is an error here, never made anew (pyroute2 creates it by default)
        with (IPRoute(netns=netns, flags=0) if netns else IPRoute()) as ipr:
            try:
                route = ipr.route("get", dst=address, family=family)[0]
            except NetlinkError as exc:
                raise OSError(f"route lookup of {address}: {os.strerror(exc.code)}") from None
            neigh, links = tables(ipr)
        index = route.get("RTA_OIF")
        device = links.get(index, "") if index else ""
        gateway = route.get("RTA_GATEWAY")
        if gateway or not device or device == "lo" or route.get("type") != RTN_UNICAST:
            return None, f"{address}: not on a link of this node (route via {gateway or '-'} dev {device or '-'})"
        mac = neigh.get((str(ipaddress.ip_address(address)), index))
        if not mac:
            return None, f"{address}: no neighbour entry yet"
        return Peer(address, mac, device), ""

    return resolve


def resolve_peers(addresses: Iterable[str], resolve: Resolve) -> tuple[list[Peer], list[str]]:
    """The on-link peers among ``addresses`` (one by one, see ``netlink_resolver``), and why the others were
    left out; one that fails is left out with its error, never the others."""
    peers, skipped = [], []
    for address in addresses:
        try:
            peer, why = resolve(address)
        except Exception as exc:  # noqa: BLE001 - this peer's failure, not the others'
            peer, why = None, f"{address}: {exc}"
        if peer is None:
            skipped.append(why)
        else:
            peers.append(peer)
    return peers, skipped


class PeerResolver:
    """Resolves every peer on its own, in parallel, each under a deadline and a back-off of its own."""

    def __init__(self, addresses: list[str], resolve: Resolve, metrics: BackoffCollector | None,
                 deadline: float = PEER_DEADLINE) -> None:
        self.addresses = addresses
        self.resolve_one = resolve
        self.deadline = deadline
        self.backoffs = {a: self._backoff(a) for a in addresses}
        if metrics is not None:
            for b in self.backoffs.values():
                metrics.add(b)
        self.last: dict[str, Peer] = {}  # the last good resolution of each peer: kept while it fails
        self._pending: dict[str, Future] = {}
        self._late: set[str] = set()  # pending past a deadline (counted once)
        self._pool: ThreadPoolExecutor | None = None

    @staticmethod
    def _backoff(address: str) -> Backoff:
        return Backoff(f"bgp-flows-peer {address}", base=PEER_BACKOFF_BASE, ceiling=PEER_BACKOFF_CEILING)

    def resolve(self) -> tuple[list[Peer], list[str]]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=min(8, len(self.addresses)) or 1,
                                            thread_name_prefix="bgp-flows-peer")
        for address in self.addresses:
            if address not in self._pending and self.backoffs[address].ready():
                self._pending[address] = self._pool.submit(self.resolve_one, address)
        # a peer already late is not waited for again: its answer is taken when it comes
        wait_futures([f for a, f in self._pending.items() if a not in self._late], timeout=self.deadline)
        peers, skipped = [], []
        for address in self.addresses:
            peer, why = self._outcome(address)
            if peer is not None:
                peers.append(peer)
            if why:
                skipped.append(why)
        return peers, skipped

    def _outcome(self, address: str) -> tuple[Peer | None, str]:
        """This peer's entry for the rules (its last good one while it fails) and why it is left out, if it is."""
        backoff, future = self.backoffs[address], self._pending.get(address)
        if future is not None and not future.done():
            if address not in self._late:
                self._late.add(address)
                self._failed(address, f"no answer within {self.deadline:g}s")
        elif future is not None:
            del self._pending[address]
            self._late.discard(address)
            try:
                peer, why = future.result()
            except Exception as exc:  # noqa: BLE001 - this peer's failure, not the others'
                self._failed(address, str(exc).strip()[:300] or type(exc).__name__)
            else:
                self._succeeded(address)
                if peer is None:
                    self.last.pop(address, None)
                    return None, why
                self.last[address] = peer
                return peer, ""
        last = self.last.get(address)
        if backoff.backing_off:
            return last, f"{address}: {backoff.error} (try {backoff.failures}, next in {backoff.remaining():.1f}s)"
        return last, "" if last else f"{address}: not resolved yet"

    def _failed(self, address: str, error: str) -> None:
        backoff = self.backoffs[address]
        new = error != backoff.error or not backoff.backing_off
        wait = backoff.failed(error)
        if new:
            logs.event(log, "bgpFlowPeerFailed", f"flow handover: peer {address}: {error}", logging.WARNING,
                       peer=address, error=error, failures=backoff.failures, nextTrySeconds=round(wait, 3))

    def _succeeded(self, address: str) -> None:
        backoff = self.backoffs[address]
        if backoff.backing_off:
            logs.event(log, "bgpFlowPeerRecovered", f"flow handover: peer {address} resolved again",
                       peer=address, failures=backoff.failures)
        backoff.succeeded()

    def errors(self) -> dict[str, dict[str, Any]]:
        return {a: b.state() for a, b in self.backoffs.items() if b.backing_off}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._pending.clear()
        self._late.clear()


class FlowHandover:
    """Keeps the flow-handover tables in line with the VIPs this node serves and its peers."""

    def __init__(self, peers: Iterable[str], run: Callable[[list[str], str | None], str],
                 rate: int = DEFAULT_RATE, burst: int | None = None,
                 metrics: BackoffCollector | None = None, deadline: float = PEER_DEADLINE,
                 resolve: Resolve | None = None) -> None:
        self.addresses = list(dict.fromkeys(peers))
        self.run = run  # (argv, stdin) -> stdout; raises on failure
        self.rate = rate
        self.burst = rate if burst is None else burst
        self.applied = ""
        self.applied_at = 0.0
        self.error = ""
        self.peers: list[Peer] = []
        self.skipped: list[str] = []
        self.resolver = PeerResolver(self.addresses, resolve or netlink_resolver(),
                                     backoff_metrics() if metrics is None else metrics, deadline)

    def refresh(self, vips: Iterable[str]) -> None:
        if not self.addresses:
            return
        peers, skipped = self.resolver.resolve()
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
        self.resolver.close()

    def status(self) -> dict:
        return {"peers": [p.address for p in self.peers], "skipped": self.skipped, "error": self.error,
                "peerErrors": self.resolver.errors(),
                "active": bool(self.applied and self.peers and "dup to" in self.applied),
                "rate": self.rate, "burst": self.burst}
