"""The layer-2 mode's first step: from the election's answer for each class of VIPs (election.py),
the rows (who leads each VIP and why), what this node would announce and on which interfaces,
what it holds on lo, and which VIPs it gains from a member (no RFC 5227 check; a planned move gets
handover forwarding). Rows are reused by class while the class is decided the same way.

One group of VIPs whose step fails never takes the others with it: it keeps what this node
announced of it for GROUP_FAIL_BOUND s (its peers still elect it from an unchanged view), then it
is withdrawn (reason ``stepFailed``) and decided again next time.

Part of the layer-2 mode (mode.py), used on its decision thread; the mode then applies the plan
(fail closed, the wire rule, lo, handover, announce) and ``commit``s it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from nocloudlb.core.election import NodeView

from .. import logs
from .election import Election, VipClass
from .forwarding import SUSPECT_WAIT
from .rows import VipRow

log = logging.getLogger("nocloudlb.speaker")

GROUP_ERRORS = Counter("nocloudlb_layer2_group_errors", "Groups of VIPs whose part of a layer-2 apply failed")
GROUP_FAIL_BOUND = 3.0  # seconds a failing group of VIPs keeps what it announced before it is withdrawn


@dataclass
class Plan:
    """One apply's decision; ``demote`` turns rows this node won into not announced (and built again)."""

    entries: Any
    rows: list[VipRow]
    changed: list[VipRow] = field(default_factory=list)  # rows new or different from the last apply's
    decided_now: list[tuple[VipClass, tuple]] = field(default_factory=list)
    announce: dict[str, list[str] | None] = field(default_factory=dict)
    lo: set[str] = field(default_factory=set)
    skip: set[str] = field(default_factory=set)  # no RFC 5227 check: gained from a member seen leading it
    handed: dict[str, str] = field(default_factory=dict)  # planned moves: ip -> the member it comes from
    handed_wait: dict[str, float] = field(default_factory=dict)
    candidates: dict[str, list[str]] = field(default_factory=dict)
    new_stale: set[int] = field(default_factory=set)  # rows changed in place: built again next time

    def demote(self, hit: Callable[[VipRow], bool], reason: Callable[[VipRow], str]) -> None:
        for i, r in enumerate(self.rows):
            if r.announcing and hit(r):
                r.announcing, r.reason = False, reason(r)
                self.new_stale.add(i)  # decided again next time (rows are reused only unchanged)
                self.changed.append(r)


class Planner:
    """The election, and the last apply's rows kept for reuse by class."""

    def __init__(self, led_off_wire: Callable[[str, str], bool] = lambda member, ip: False) -> None:
        self.election = Election()
        self.led_off_wire = led_off_wire  # (member, ip): it leads ip without answering it (metadata "x")
        # the last apply's rows, one per entry of the election's plan (``_rows_for``), reused by class
        self._rows_idx: list[VipRow] = []
        self._rows_for: Any = None
        self._stale: set[int] = set()  # rows the last apply changed in place (notOnLo...): built again
        self.group_failing: dict[str, float] = {}  # first VIP of a group whose apply fails -> since when
        self._group_logged = -1e9
        self._failed_now: set[str] = set()

    def plan(self, me: str, nodes: list[NodeView], parsed: Any, states: dict[str, str], gate: str,
             suspecters: frozenset[str], announced: dict[str, list[str]], on_lo: set[str],
             leaders: dict[str, str], yielded: set[str]) -> Plan:
        """Decide every class of VIPs. ``announced``: what the announcer was given last; ``on_lo``: the
        VIPs on lo; ``leaders``: each VIP's leader as last seen; ``yielded``: VIPs given up to a member."""
        decisions = self.election.classes(me, nodes, parsed)
        entries = self.election.entries  # (re)planned for this config
        reuse = self._rows_for is entries
        p = Plan(entries, list(self._rows_idx) if reuse else [None] * len(entries))  # type: ignore[list-item]
        rows, announce = p.rows, p.announce
        stale = self._stale if reuse else set()  # rows changed in place by the last apply: built again
        self._failed_now = set()
        for cls, leader, reason, g in decisions:
            try:  # one group of VIPs that fails never takes the others with it (_group_failed)
                if g is None:
                    decided: tuple = (None, reason)
                    if not reuse or cls.decided != decided:
                        for i in cls.idxs:
                            ip, svc = entries[i][0], entries[i][1]
                            rows[i] = VipRow(ip, svc.key, "", None, False, reason, [], False)
                            p.changed.append(rows[i])
                    p.decided_now.append((cls, decided))
                    continue
                if reason == "":
                    p.candidates.update(dict.fromkeys(cls.ips, g.candidates))
                    if suspecters:
                        # a member that stopped hearing this node takes what it would lead without it:
                        # yield that VIP (one owner); take it back when it hears this node again
                        nxt = self.election.class_runner_up(me, g, cls)
                        if nxt in suspecters:
                            leader, reason = nxt, "suspectedByPeer"
                if reason == "" and gate:
                    reason = gate
                if reason == "":
                    self._gained(me, cls, states, announced, leaders, yielded, p, self.led_off_wire)
                ifaces = g.ifaces
                if g.mine:
                    p.lo.update(cls.ips)
                if reason == "":
                    if announce.keys().isdisjoint(cls.ipset):
                        announce.update(dict.fromkeys(cls.ips, ifaces))
                    else:  # a VIP shared with services of another kind: every interface either asks for
                        for ip in cls.ips:
                            prev = announce.get(ip)
                            if prev is None:
                                announce[ip] = ifaces
                            elif prev and ifaces:
                                announce[ip] = sorted(set(prev) | set(ifaces))
                            else:
                                announce[ip] = []
                decided = (leader, reason, ifaces, g.mine)
                if reuse and cls.decided == decided:
                    redo: Any = stale.intersection(cls.idxs) if stale else ()  # rows unchanged: reused, not built
                else:
                    redo = cls.idxs
                for i in redo:
                    ip, svc, pool = entries[i][0], entries[i][1], entries[i][2]
                    rows[i] = VipRow(ip, svc.key, pool or "", leader, reason == "", reason, ifaces, g.mine)
                    p.changed.append(rows[i])
                p.decided_now.append((cls, decided))
            except Exception as exc:  # noqa: BLE001 - the barrier of one group of VIPs
                self._group_failed(me, cls, p, announced, on_lo, exc)
        self.group_failing = {k: v for k, v in self.group_failing.items() if k in self._failed_now}
        return p

    @staticmethod
    def _gained(me: str, cls: VipClass, states: dict[str, str], announced: dict[str, list[str]],
                leaders: dict[str, str], yielded: set[str], p: Plan,
                led_off_wire: Callable[[str, str], bool]) -> None:
        # only the VIPs this node did not announce before: gained from a member we saw lead it
        # (failover, drain, leave): skip the RFC 5227 check, it would only cost failover time.
        # Otherwise (first start, a new VIP, a restart that preempts) check: a member's MAC
        # answering is one handing over, waited out until it is silent (is_peer_mac), any
        # other MAC is a conflict and never fought.
        for ip in cls.ipset.difference(announced):
            before = leaders.get(ip)
            if ip in yielded:
                # taken back after a yield or a false suspicion: the member it went to answers
                # until it hears this node again, at about the moment this node decides. The
                # check waits for that member's silence (announcer: member_wait), so the two
                # never answer at once; no forwarding: its connections never left this node
                continue
            if before and before != me:
                if led_off_wire(before, ip):
                    # it led the VIP without answering it (its own check ran, or another MAC answers: it said so
                    # in its metadata): checked as on a first start, so this node does not fight that host
                    continue
                p.skip.add(ip)
                if states.get(before) == "alive":
                    p.handed[ip] = before  # a planned move: its in-flight connections go on there
                elif states.get(before) == "unreachable":
                    # only suspected (heartbeats stopped, gossip not sure): forward toward it too,
                    # so a false suspicion resets nothing; wait less for the forwarding
                    p.handed[ip] = before
                    p.handed_wait[ip] = SUSPECT_WAIT

    def _group_failed(self, me: str, cls: Any, p: Plan, announced: dict[str, list[str]], on_lo: set[str],
                      exc: Exception) -> None:
        """One group of VIPs failed in ``plan``: keep what this node announced of it (its peers still elect
        it from an unchanged view) for GROUP_FAIL_BOUND s, then withdraw it; log and count; decide it again
        next time (``cls.decided`` cleared)."""
        now = time.monotonic()
        self._failed_now.add(cls.ips[0])
        first = self.group_failing.setdefault(cls.ips[0], now)
        keep = now - first < GROUP_FAIL_BOUND
        GROUP_ERRORS.inc()
        if now - self._group_logged >= 10.0:
            self._group_logged = now
            logs.event(log, "vipStepFailed", f"{type(exc).__name__}: {exc}"[:300], logging.ERROR,
                       ips=list(cls.ips)[:10], keeping=keep)
        cls.decided = None
        for i in cls.idxs:
            ip, svc, pool = p.entries[i][0], p.entries[i][1], p.entries[i][2]
            held = keep and ip in announced
            p.rows[i] = VipRow(ip, svc.key, pool or "", me if held else None, held,
                               "" if held else "stepFailed", list(announced.get(ip, [])), ip in on_lo)
            p.changed.append(p.rows[i])
            if held:
                p.announce[ip] = announced[ip]
                p.lo.add(ip)

    def commit(self, p: Plan) -> None:
        """The plan was applied: its rows are the ones reused next time, its classes decided."""
        self._rows_idx, self._rows_for, self._stale = p.rows, p.entries, p.new_stale
        for cls, decided in p.decided_now:
            cls.decided = decided
