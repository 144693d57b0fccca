"""The heartbeat's suspicion and quorum rule (pure, driven by the caller's clock): what this node
knows of each live member from its datagrams, and what it concludes from that (HeartbeatView). The
rule itself is described in heartbeat.py's module docstring; the caller holds its lock around
every call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nocloudlb.core.quorum import has_quorum, quorum_total

from .heartbeat_wire import Packet

#: heartbeat timeouts a member must keep saying it has no quorum before it is left out of the election
NO_QUORUM_HOLD = 3


@dataclass
class Peer:
    addr: tuple[str, int]
    gossip_state: str
    added: float
    heard: float = -1e9  # monotonic time of the last accepted packet
    heard_once: bool = False
    boot: int = -1
    seq: int = -1
    suspects_me: bool = False
    my_suspicions: int = 0  # times this node suspected it
    their_suspicions: int = 0  # times it suspected this node (last value seen)
    meta_seq: int = -1  # the sender's latest meta seq
    meta: tuple[int, dict[str, str]] | None = None  # (seq, meta) received by heartbeat
    missing: frozenset[str] = frozenset()  # the members it misses (its latest datagram)
    missing_seen: dict[str, float] = field(default_factory=dict)  # names of its cut (partial) lists, when seen
    deaf: bool = True  # its latest datagram says it does not hear this node (F_DEAF); True until one says not
    no_quorum: bool = False  # its latest datagram says it has no quorum (F_NO_QUORUM)
    no_quorum_since: float = 0.0  # since when its datagrams say so


@dataclass(frozen=True)
class HeartbeatView:
    suspected: frozenset[str] = frozenset()  # live members this node suspects (ineligible)
    suspecters: frozenset[str] = frozenset()  # members that suspect this node (none while cut off)
    cut_off: bool = False
    metas: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # current meta received by heartbeat
    # quorum (nocloudlb.core.quorum): False until the first evaluation, so nothing is taken before it
    quorum: bool = False
    connected: frozenset[str] = frozenset()  # members heard that hear this node (the votes beside its own)
    no_quorum: frozenset[str] = frozenset()  # members heard whose datagrams say they have no quorum (ineligible)
    deaf_to: frozenset[str] = frozenset()  # members heard that say they do not hear this node (inbound loss there)
    votes: int = 1
    total: int = 1


class Verdict(NamedTuple):
    """One evaluation of the rule."""

    view: HeartbeatView
    missing: frozenset[str]  # members this node misses now (raw, before the rule)
    heard: frozenset[str]  # members heard (F_DEAF for the others)
    deadline: float  # monotonic time by which a heard member's timeout may end: evaluate again then


class PeerTable:
    """The live members (name -> Peer, ``peers``) as their datagrams describe them, and the rule
    evaluated over them. ``timeout`` is ``interval x miss``."""

    def __init__(self, interval: float, timeout: float) -> None:
        self.interval = interval
        self.timeout = timeout
        self.peers: dict[str, Peer] = {}

    def take(self, pkt: Packet, now: float) -> tuple[tuple[str, str] | None, bool, bool]:
        """Take one verified datagram addressed to this node, arrived at ``now``: ``(refused, dirty,
        changed)``, ``refused`` the reason and detail when it is dropped, ``dirty`` when the rule must be
        evaluated again, ``changed`` when it changed a meta this node reports."""
        p = self.peers.get(pkt.sender)
        if p is None:  # not a live member (yet): gossip decides membership
            return ("unknownSender", f"from {pkt.sender[:64]!r}, not a live member"), False, False
        if (pkt.boot, pkt.seq) <= (p.boot, p.seq):
            return ("oldBoot" if pkt.boot < p.boot else "replay", f"from {pkt.sender[:64]!r}"), False, False
        dirty = False
        if pkt.boot != p.boot:
            p.meta, p.meta_seq = None, -1  # a restarted member: its old meta means nothing
        if not p.heard_once or now - p.heard > self.timeout or p.suspects_me != pkt.suspect_you:
            dirty = True  # heard again (or for the first time), or its suspicion of this node changed
        p.boot, p.seq = pkt.boot, pkt.seq
        p.heard, p.heard_once = max(p.heard, now), True
        p.suspects_me = pkt.suspect_you
        p.their_suspicions = pkt.suspicions
        if p.deaf != pkt.deaf or p.no_quorum != pkt.no_quorum:
            if pkt.no_quorum and not p.no_quorum:
                p.no_quorum_since = now
            p.deaf, p.no_quorum = pkt.deaf, pkt.no_quorum
            dirty = True
        changed = False
        if pkt.partial:  # a part of its list: the parts seen lately together (names rotate per packet)
            keep = now - max(2 * self.timeout, 20 * self.interval)
            p.missing_seen = {n: t for n, t in p.missing_seen.items() if t >= keep}
            p.missing_seen.update(dict.fromkeys(pkt.missing, now))
            missing = frozenset(p.missing_seen)
        else:
            p.missing_seen = {}
            missing = frozenset(pkt.missing)
        if missing != p.missing:
            p.missing = missing
            changed = dirty = True
        if pkt.meta is not None and (p.meta is None or p.meta[0] != pkt.meta_seq):
            p.meta = (pkt.meta_seq, pkt.meta)
            changed = True
        if pkt.meta_seq != p.meta_seq:
            p.meta_seq = pkt.meta_seq
            changed = True
        return None, dirty, changed

    def evaluate(self, now: float, old: HeartbeatView, confirmations: int, configured: int, known: int,
                 witness: Callable[[], bool] | None) -> Verdict:
        """The rule at ``now`` (``old``: the view of the last evaluation; ``confirmations``: the members
        heard that must miss a member too; ``configured``, ``known`` and ``witness``: the quorum's basis)."""
        live = self.peers
        heard = {n for n, p in live.items() if p.heard_once and now - p.heard <= self.timeout}
        if old.cut_off and heard:
            # back from a cut-off: the members not heard again yet get a fresh timeout (not suspected
            # for being heard last before it) and count as suspecting this node until their next
            # packet says otherwise (they likely do: they did not hear it either)
            for n, p in live.items():
                if p.heard_once and n not in heard:
                    p.heard, p.suspects_me = now, True
                    heard.add(n)
        missing = frozenset(n for n, p in live.items() if p.heard_once and n not in heard)
        cut_off = len(live) >= 2 and any(p.heard_once for p in live.values()) and not heard
        suspected = set()
        need = min(confirmations, len(heard))  # the other opinions a suspicion needs (0: gossip's alone)
        for n in () if cut_off else missing:  # cut off: this node cannot judge anyone, it grabs nothing
            if live[n].gossip_state == "suspect" or (
                    need and sum(1 for r in heard if n in live[r].missing) >= need):
                suspected.add(n)
        # a cut-off node keeps what it holds and takes nothing (no quorum): it does not yield to anyone
        # it cannot hear; the majority's new owner announcing on the wire makes it yield (l2/mode.py)
        suspecters = set() if cut_off else {n for n in heard if live[n].suspects_me}
        # a live member never heard by heartbeat (just joined, or it runs without heartbeats) counts on
        # gossip's word until its first datagram: gossip reached it, and a heartbeat will soon say more
        connected = frozenset(n for n in heard if not live[n].deaf) | frozenset(
            n for n, p in live.items() if not p.heard_once and p.gossip_state == "alive")
        deaf_to = frozenset(n for n in heard if live[n].deaf)
        # reported without quorum for NO_QUORUM_HOLD timeouts: a blip under loss (both links missing four
        # datagrams at once) does not move its VIPs; a node really cut off, or deaf, is left out soon
        hold = NO_QUORUM_HOLD * self.timeout
        no_quorum = frozenset(n for n in heard if live[n].no_quorum and now - live[n].no_quorum_since >= hold)
        witness_up = bool(witness()) if witness is not None else False
        known = max(known, 1 + len(live))
        total = quorum_total(configured, known, witness is not None)
        quorum = has_quorum(len(connected), configured, known, witness is not None, witness_up)
        votes = 1 + len(connected) + (1 if witness_up else 0)
        for n in suspected - old.suspected:
            live[n].my_suspicions += 1
        metas = {n: p.meta[1] for n, p in live.items() if p.meta is not None and p.meta[0] == p.meta_seq}
        ends = [p.heard + self.timeout for p in live.values() if p.heard_once and p.heard + self.timeout > now]
        ends += [p.no_quorum_since + hold for p in live.values() if p.no_quorum and p.no_quorum_since + hold > now]
        deadline = min(ends) + 0.001 if ends else now + 1.0
        view = HeartbeatView(frozenset(suspected), frozenset(suspecters), cut_off, metas, quorum, connected,
                             no_quorum, deaf_to, votes, total)
        return Verdict(view, missing, frozenset(heard), deadline)

    def quiet(self, late: float) -> bool:
        """Every member heard since ``late``, none missed, suspected, deaf or without quorum as far as
        their datagrams say (and at least one member)."""
        if not self.peers:
            return False
        for p in self.peers.values():
            if not p.heard_once or p.heard < late or p.missing or p.suspects_me or p.deaf or p.no_quorum:
                return False
        return True

    def status(self, now: float, suspected: frozenset[str]) -> dict[str, dict[str, Any]]:
        """Each member as the status shows it."""
        return {n: {"heardMsAgo": round((now - p.heard) * 1000) if p.heard_once else None,
                    "suspected": n in suspected, "suspectsMe": p.suspects_me,
                    "hearsMe": p.heard_once and not p.deaf, "quorum": not p.no_quorum}
                for n, p in sorted(self.peers.items())}
