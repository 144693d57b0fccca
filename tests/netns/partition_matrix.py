"""The partition matrix's harness: faults where nodes disagree, made with nftables inside the nodes'
namespaces, run against real speakers while a client samples who answers ARP for every VIP.

Used by tests/netns/test_partition_matrix.py (asserts the bounds of :data:`ROWS`) and by
benchmarks/partitions.py (the same rows for the ``fast`` and ``lan`` profiles, written into
docs/chaos.md). No tests here.

A :class:`Matrix` is one segment with N speakers (one VIP led by each node, ``spread_vips``) and
the client running :mod:`arp_sampler` (one broadcast ARP request per VIP every 0.1 s, every MAC that
answers recorded). :func:`run_row` brings the cluster to a steady state (every VIP answered by
its elected node alone for a second, full membership everywhere), makes the row's fault, holds
it :data:`HOLD` seconds, heals it, watches until every VIP is answered by its elected node alone
(or :data:`AFTER_MAX` seconds), and computes the figures from the samples.

Faults are rules in one nftables table, ``inet nocloudlb_fault``, in the namespace of the node
they isolate, matching the peers' IPv4 addresses (the gossip on 7946 TCP+UDP and the heartbeats on
7946 + heartbeatPortOffset run between those addresses, nothing else does): ``in`` drops what the
node receives from them (input hook), ``out`` what it sends to them (output hook). ARP and NDP
are no IP traffic and stay untouched, and so does the client's traffic (its own address). Healing
deletes the table; :meth:`Matrix.heal_all` deletes it on every node and is called after every row,
failed or not.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import arp_sampler
from netns import Segment, make_segment
from nocloudlb.core.election import election_order
from nocloudlb.membership import PROFILES
from speaker_harness import SpeakerCluster, pool_docs, service_doc, spread_vips

NFT_TABLE = "nocloudlb_fault"
GOSSIP_PORT = 7946
HEARTBEAT_PORT = GOSSIP_PORT + int(PROFILES["fast"]["heartbeat_port_offset"])  # the same in both profiles
INTERVAL, WINDOW = 0.1, 0.08  # the sampler: a round every 0.1 s, replies collected for 0.08 s
HOLD = 10.0  # every fault is held this long
BEFORE = 1.0  # samples kept before the fault (the timelines show the steady state it started from)
AFTER_MIN, AFTER_MAX, STEADY = 4.0, 8.0, 1.5  # watched after healing: at least / at most; steady stretch
SETTLE_TIMEOUT = 12.0  # a cluster not steady by then is restarted before the next row
SAMPLER = Path(__file__).resolve().parent / "arp_sampler.py"


def witness_problem(witness: str = "198.51.100.2") -> str:
    """Why this build's config refuses ``memberlist.witness`` ("" when it accepts it)."""
    from nocloudlb.config import parse  # noqa: PLC0415
    from nocloudlb.core.errors import ConfigError  # noqa: PLC0415

    doc = {"node": {"name": "n1"}, "memberlist": {"bind": "198.51.100.11:7946", "join": ["198.51.100.12:7946"],
                                                  "keyFile": "/etc/nocloudlb/memberlist.key", "profile": "fast",
                                                  "witness": witness},
           "resources": pool_docs()}
    try:
        parse(doc)
    except ConfigError as exc:
        return str(exc).splitlines()[0].split(" (timing fields")[0]
    return ""


class Matrix:
    """A segment with ``nodes`` speakers, a VIP led by each, and the client's sampler (see module doc)."""

    def __init__(self, workdir: Path, nodes: int = 3, profile: str = "fast", witness: bool = False,
                 prefix: str = "npm") -> None:
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.vips = spread_vips(self.names)  # ip -> leader
        self.profile = profile
        self.seg: Segment = make_segment(prefix, hosts=nodes)
        try:
            docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(self.vips))]
            extra = {"witness": self.seg.client.ipv4} if witness else {}
            self.c = SpeakerCluster(self.seg, workdir, profile=profile, resources=docs, memberlist_extra=extra)
            self.c.start_all(timeout=30)
            self.samples = workdir / "samples.jsonl"
            fh = open(self.samples, "w")  # noqa: SIM115 - handed to the child
            self.sampler = self.seg.popen(self.seg.client.ns, [sys.executable, "-u", str(SAMPLER), "eth0",
                                                               str(INTERVAL), str(WINDOW), *sorted(self.vips)],
                                          stdout=fh)
            fh.close()
            self.stopped: set[str] = set()  # speakers SIGSTOPped by a row (continued by heal_all)
            self.down: set[str] = set()  # speakers not running (killed by a row)
        except BaseException:
            self.seg.close()
            raise

    def close(self) -> None:
        self.heal_all()
        self.seg.close()

    # -- faults ----------------------------------------------------------------------------------
    def isolate(self, node: str, peers: list[str], inbound: bool = True, outbound: bool = True,
                verdict: str = "drop") -> None:
        """Drop IPv4 between ``node`` and ``peers`` inside ``node``'s namespace: what it receives from
        them (``inbound``) and/or what it sends to them (``outbound``, with ``verdict``: ``drop``, or
        ``reject``, which fails its connection attempts at once as an unreachable network does)."""
        addrs = ", ".join(self.c.host(p).ipv4 for p in peers)
        chains = []
        if inbound:
            chains.append(f"  chain in {{\n    type filter hook input priority -300; policy accept;\n"
                          f"    ip saddr {{ {addrs} }} counter drop\n  }}\n")
        if outbound:
            chains.append(f"  chain out {{\n    type filter hook output priority -300; policy accept;\n"
                          f"    ip daddr {{ {addrs} }} counter {verdict}\n  }}\n")
        rules = f"table inet {NFT_TABLE} {{\n{''.join(chains)}}}\n"
        self.seg.run(self.c.host(node).ns, ["nft", "-f", "-"], input=rules)

    def heal(self, node: str) -> None:
        self.seg.run(self.c.host(node).ns, ["nft", "delete", "table", "inet", NFT_TABLE], check=False)

    def heal_all(self) -> None:
        """Every fault undone: the fault table deleted on every node, stopped speakers continued."""
        for name in self.names:
            self.heal(name)
        for name in list(self.stopped):
            try:
                self.c.send_signal(name, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.stopped.discard(name)

    def freeze(self, node: str) -> float:
        """SIGSTOP of the speaker's own process only (its responder child keeps running)."""
        self.stopped.add(node)
        return self.c.send_signal(node, signal.SIGSTOP)

    def thaw(self, node: str) -> float:
        self.stopped.discard(node)
        return self.c.send_signal(node, signal.SIGCONT)

    # -- observing -------------------------------------------------------------------------------
    def live(self) -> list[str]:
        return [n for n in self.names if n not in self.down]

    def leaders(self, live: list[str] | None = None) -> dict[str, str]:
        """VIP -> MAC of the node that must answer when ``live`` (default: every running node) agree."""
        live = live or self.live()
        return {ip: self.c.mac(election_order(live, ip)[0]) for ip in self.vips}

    def load(self, since: float, until: float = float("inf")) -> dict[str, list[arp_sampler.Sample]]:
        return arp_sampler.load(self.samples, since, until)

    def steady(self, leaders: dict[str, str], hold: float) -> bool:
        """The last ``hold`` seconds of samples show exactly the leader for every VIP."""
        now = time.time()
        got = self.load(now - hold - INTERVAL)
        for ip, mac in leaders.items():
            s = got.get(ip, [])
            if len(s) < int(hold / INTERVAL) - 2 or any(macs != (mac,) for _t, macs in s):
                return False
        return True

    def settled(self, hold: float = 1.0) -> bool:
        live = self.live()
        return all(self.c.members_alive(n) == set(live) for n in live) and self.steady(self.leaders(), hold)

    def restart_all(self) -> None:
        """Every speaker killed and started again (a row left the cluster in disagreement)."""
        self.heal_all()
        for name in self.names:
            proc = self.c.procs.get(name)
            if proc is not None and proc.poll() is None:
                self.c.stop(name, signal.SIGKILL)
        self.down.clear()
        self.c.start_all(timeout=30)

    def settle(self) -> float:
        """Wait until steady (restart every speaker if not within SETTLE_TIMEOUT); seconds it took."""
        t = time.time()
        try:
            self.c.wait(self.settled, SETTLE_TIMEOUT, "one owner per VIP and full membership", step=0.2)
        except AssertionError:
            print(f"  cluster not steady after {SETTLE_TIMEOUT:.0f} s: restarting every speaker")
            self.restart_all()
            self.c.wait(self.settled, SETTLE_TIMEOUT, "one owner per VIP after a restart of every speaker", step=0.2)
        return time.time() - t

    def owner(self, index: int = 0) -> str:
        """The node leading the ``index``-th VIP (sorted)."""
        return self.vips[sorted(self.vips)[index]]

    def name_of(self, mac: str) -> str:
        return self.c.owner_of(mac) or mac


# -- rows -------------------------------------------------------------------------------------------

@dataclass
class Row:
    key: str
    title: str
    nodes: int
    two_owner: float  # bound on the longest two-owner window (s)
    no_owner: float | None  # bound on the longest no-owner window; None: not bounded
    healed: float | None  # bound on the time to one owner after healing; None: not bounded
    run: Callable[[Matrix], dict[str, Any]]  # makes the fault, holds it, heals: {"fault": t, "heal": t, ...}
    witness: bool = False


def _hold_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def inbound_drop(m: Matrix) -> dict[str, Any]:
    x = m.owner()
    t_fault = time.time()
    m.isolate(x, [p for p in m.names if p != x], inbound=True, outbound=False)
    _hold_until(t_fault + HOLD)
    t_heal = time.time()
    m.heal(x)
    return {"fault": t_fault, "heal": t_heal, "node": x}


def cut_both_ways(m: Matrix) -> dict[str, Any]:
    x = m.owner()
    t_fault = time.time()
    m.isolate(x, [p for p in m.names if p != x])
    _hold_until(t_fault + HOLD)
    t_heal = time.time()
    m.heal(x)
    return {"fault": t_fault, "heal": t_heal, "node": x}


def partial_partition(m: Matrix) -> dict[str, Any]:
    """a<->b and a<->c cut, d hears everyone: a leads the first VIP, b is next in its order (the node
    that would take it), c the one after, d the last."""
    ip = sorted(m.vips)[0]
    a, b, c, d = election_order(m.names, ip)
    t_fault = time.time()
    m.isolate(a, [b, c])
    _hold_until(t_fault + HOLD)
    t_heal = time.time()
    m.heal(a)
    return {"fault": t_fault, "heal": t_heal, "node": f"a={a} b={b} c={c} d={d}"}


def every_pair_cut(m: Matrix) -> dict[str, Any]:
    t_fault = time.time()
    for n in m.names:
        m.isolate(n, [p for p in m.names if p != n])
    _hold_until(t_fault + HOLD)
    t_heal = time.time()
    for n in m.names:
        m.heal(n)
    return {"fault": t_fault, "heal": t_heal, "node": "all"}


def isolated_boot(m: Matrix) -> dict[str, Any]:
    """The owner of the first VIP stopped (SIGTERM: its peers take its VIP), cut from its peers, started
    again; the fault (and the measurement) begins when it starts. What it sends to them is rejected,
    not dropped: its join then fails at once (as with an unreachable network) instead of waiting out
    the TCP timeout (about 10 s, as long as the fault), so the node's own decision shows."""
    x = m.owner()
    m.c.stop(x, signal.SIGTERM)
    m.down.add(x)
    m.c.wait(lambda: m.steady(m.leaders(), 0.5), 10, f"the others serve {x}'s VIP", step=0.1)
    m.isolate(x, [p for p in m.names if p != x], verdict="reject")
    t_fault = time.time()
    m.c.start(x)
    m.down.discard(x)
    _hold_until(t_fault + HOLD)
    t_heal = time.time()
    m.heal(x)
    return {"fault": t_fault, "heal": t_heal, "node": x}


def frozen_daemon(m: Matrix) -> dict[str, Any]:
    x = m.owner()
    t_fault = m.freeze(x)
    _hold_until(t_fault + HOLD)
    t_heal = m.thaw(x)
    return {"fault": t_fault, "heal": t_heal, "node": x}


def two_node_kill(m: Matrix) -> dict[str, Any]:
    x = m.owner()
    t_fault = m.c.stop(x, signal.SIGKILL)
    m.down.add(x)
    _hold_until(t_fault + HOLD)
    return {"fault": t_fault, "heal": None, "node": x}


ROWS: list[Row] = [
    Row("inbound-drop", "owner drops everything it receives from its peers", 3, 1.0, 1.5, 3.0, inbound_drop),
    Row("cut-both-ways", "owner cut from its peers both ways, client segment intact", 3, 1.0, 1.5, 3.0,
        cut_both_ways),
    Row("partial-partition", "partial partition a<->b, a<->c (4 nodes)", 4, 1.0, 1.5, 3.0, partial_partition),
    Row("every-pair-cut", "every pair of nodes cut, every node still reaches the client", 3, 1.0, 1.5, 3.0,
        every_pair_cut),
    Row("isolated-boot", "one node boots while cut from its peers", 3, 0.0, None, 3.0, isolated_boot),
    Row("frozen-daemon", "daemon frozen (SIGSTOP of the daemon, not of its children)", 3, 1.0, 1.5, None,
        frozen_daemon),
    Row("two-node-kill", "two-node cluster: one node kill -9'd", 2, 0.0, 1.5, None, two_node_kill, witness=True),
]


@dataclass
class RowResult:
    row: Row
    profile: str
    two_owner: float
    no_owner: float
    healed: float | None  # None: no steady single owner by the end (or no healing in this row)
    during: arp_sampler.Figures
    after: arp_sampler.Figures | None
    seconds: float  # the row's duration, settling before it included
    settle: float
    info: dict[str, Any]
    timeline: dict[str, list[tuple[float, list[str]]]] = field(default_factory=dict)  # vip -> (t - fault, names)
    witness: str = ""  # the two-node row: what served as witness

    def owners(self) -> dict[str, list[str]]:
        """Per VIP, the nodes whose MAC answered from the fault to the end."""
        return {ip: sorted({n for t, names in tl if t >= 0 for n in names}) for ip, tl in self.timeline.items()}

    def problems(self) -> list[str]:
        r, out = self.row, []
        expected = len(self.info.get("leaders", {})) * (self.info["end"] - self.info["fault"]) / INTERVAL
        if self.during.samples + (self.after.samples if self.after else 0) < 0.8 * expected:
            out.append(f"only {self.during.samples + (self.after.samples if self.after else 0)} samples of "
                       f"{expected:.0f} expected: the sampler fell behind or died")
        if self.two_owner > r.two_owner + 1e-9:
            out.append(f"two owners for {self.two_owner:.2f} s (bound {r.two_owner:g} s)")
        if r.no_owner is not None and self.no_owner > r.no_owner + 1e-9:
            out.append(f"no owner for {self.no_owner:.2f} s (bound {r.no_owner:g} s)")
        if r.healed is not None and (self.healed is None or self.healed > r.healed + 1e-9):
            got = "never" if self.healed is None else f"after {self.healed:.2f} s"
            out.append(f"one owner again {got} (bound {r.healed:g} s)")
        return out

    def line(self) -> str:
        healed = "-" if self.info.get("heal") is None else ("never" if self.healed is None else f"{self.healed:.2f} s")
        after = self.after.two_owner if self.after else 0.0
        return (f"{self.profile:4} {self.row.key:17} two owners {self.two_owner:5.2f} s "
                f"(fault {self.during.two_owner:.2f}, after healing {after:.2f})  no owner {self.no_owner:5.2f} s  "
                f"one owner after healing {healed}  [{self.seconds:.0f} s incl. {self.settle:.1f} s settling; "
                f"{self.info.get('node')}]")


def run_row(m: Matrix, row: Row) -> RowResult:
    t0 = time.time()
    settle = m.settle()
    try:
        info = row.run(m)
    finally:
        m.heal_all()
    t_fault, t_heal = info["fault"], info["heal"]
    leaders = m.leaders()
    if t_heal is not None:
        end = t_heal + AFTER_MAX
        while time.time() < end:
            if time.time() >= t_heal + AFTER_MIN and m.steady(leaders, STEADY):
                break
            time.sleep(0.2)
    t_end = time.time()
    samples = m.load(t_fault - BEFORE, t_end)
    during = arp_sampler.figures(samples, t_fault, t_heal if t_heal is not None else t_end)
    after = arp_sampler.figures(samples, t_heal, t_end, heal=t_heal, leaders=leaders) if t_heal is not None else None
    whole = arp_sampler.figures(samples, t_fault, t_end)
    timeline = {ip: [(round(t - t_fault, 3), [m.name_of(x) for x in macs]) for t, macs in s]
                for ip, s in samples.items()}
    info["leaders"] = {ip: m.name_of(mac) for ip, mac in leaders.items()}
    info["end"] = t_end
    return RowResult(row, m.profile, whole.two_owner, whole.no_owner, after.healed_after if after else None,
                     during, after, time.time() - t0, settle, info, timeline)
