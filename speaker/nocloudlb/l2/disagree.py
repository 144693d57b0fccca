"""Layer 2 when nodes disagree: take only with quorum, and the wire as the last word.

The rule is written in nocloudlb.core.quorum (pure); this class carries it out for the layer-2
mode, between the election and the announcer:

- ``hold_back(...)``: of the VIPs the election gives this node, the ones it may not announce
  now: each one it does not announce already while it has no quorum (``noQuorum``), and each
  one it yielded on the wire and may not take back yet (``yieldedOnWire``).
- ``contest(ip, mac)`` (from the announcer's thread): another member's MAC announced a VIP this
  node announces (a gratuitous ARP or unsolicited NA seen by the responder). Queued; the next
  ``hold_back`` judges it with ``contest_yields``: without quorum, or to a candidate ranked
  before this node, the VIP is yielded at once and counted; otherwise it is kept (the other
  side yields by the same rule).

A VIP yielded on the wire is taken back once this node may take again and either the member it
yielded to is no longer a candidate here (unreachable, without quorum, drained, gone) or
``CONTEST_HOLD`` seconds have passed (the election, computed alike on both sides, decides then:
with quorum this node yields only to a candidate it ranks first, which the election then elects).

Settling: a node that gains quorum back (not at start) takes over no VIP from a member it does not
see alive for ``settle`` seconds (the daemon sets it to a few heartbeat timeouts): right after a
partition heals its view of the others is stale (gossip still holds some of them dead), and a
takeover from that view would take VIPs from members that are alive and about to be heard. What it
keeps, and what a member it sees alive hands over to it (the election's planned moves: the old
leader back), it takes at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import Counter

from nocloudlb.core.election import election_order
from nocloudlb.core.quorum import REASON_NO_QUORUM, REASON_SETTLING, REASON_YIELDED_ON_WIRE, contest_yields

from .. import logs

log = logging.getLogger("nocloudlb.speaker")

CONTESTS = Counter("nocloudlb_layer2_contests", "Another member announced a VIP this node announced, by outcome",
                   ["outcome"])

CONTEST_MEMORY = 5.0  # seconds a contest kept (with quorum) is judged again at each apply: quorum may go soon after
CONTEST_HOLD = 0.2  # seconds a VIP yielded on the wire stays yielded at least (a flickering quorum: no flip-flop)
MAX_PENDING = 4096  # contests queued between two applies (a flood of forged frames is bounded)


class WireRule:
    """See the module docstring. ``member_of(mac)`` -> the member that published ``mac``, or None."""

    def __init__(self, member_of: Callable[[bytes], str | None], post: Callable[[], None]) -> None:
        self.member_of = member_of
        self.post = post
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str]] = []  # (ip, member) seen on the wire, not judged yet
        self.yielded: dict[str, tuple[str, float]] = {}  # ip -> (member yielded to, when)
        self.kept: dict[str, tuple[str, float]] = {}  # ip -> (member it was kept against, when seen)
        self.counts = {"yielded": 0, "kept": 0, "foreign": 0}
        self.settle = 0.0  # seconds after quorum is gained back during which nothing new is taken
        self._had_quorum: bool | None = None  # None: no apply yet
        self._ever_quorum = False  # had quorum once (before that, e.g. at start, there is nothing to settle)
        self._quorum_since = -1e9

    def contest(self, ip: str, mac: bytes) -> None:
        """Called from the announcer's thread for each frame of another MAC announcing ``ip``."""
        member = self.member_of(mac)
        if member is None:
            self.counts["foreign"] += 1  # not a member: an RFC 5227 matter, reported, never fought
            return
        with self._lock:
            if len(self._pending) < MAX_PENDING:
                self._pending.append((ip, member))
        self.post()

    def pending(self) -> bool:
        return bool(self._pending)

    def hold_back(self, me: str, quorum: bool, final: Mapping[str, object], announced: Iterable[str],
                  candidates: Mapping[str, list[str]], leaders: Mapping[str, str],
                  handed: Callable[[], Iterable[str]] = tuple) -> dict[str, str]:
        """ip -> reason, for each VIP of ``final`` (what the election gives this node) not to announce now.
        ``handed()``: the VIPs of ``final`` last led by a member this node sees alive, or by this node itself
        (a planned move to it, or its own back): taken even while settling (called only then)."""
        with self._lock:
            pending, self._pending = self._pending, []
        announced = set(announced)
        now = time.monotonic()
        if quorum and self._had_quorum is False and self._ever_quorum:
            self._quorum_since = now  # gained back (not the first time: at start): settle before taking
        self._had_quorum = quorum
        self._ever_quorum = self._ever_quorum or quorum
        settling = quorum and self.settling(now)
        # a contest kept with quorum is judged again while recent: the other side's announcement may have
        # come a moment before this node lost quorum (both follow the same cut), and its next round is a
        # gratuitous-ARP interval away
        self.kept = {ip: (m, at) for ip, (m, at) in self.kept.items() if now - at < CONTEST_MEMORY and ip in announced}
        again = [(ip, m) for ip, (m, _at) in self.kept.items() if (ip, m) not in pending]
        for ip, member in [*dict.fromkeys(pending), *again]:
            if ip not in announced or ip in self.yielded:
                continue  # not ours (any more): nothing to yield
            cands = list(candidates.get(ip, ()))
            order = election_order(sorted(set(cands) | {me, member}), ip)
            lead = leaders.get(ip)
            if lead in order:  # the current leader first: the election's own ranking (scores included)
                order.remove(lead)
                order.insert(0, lead)
            fresh = (ip, member) in pending
            if contest_yields(me, member, quorum, order, cands):
                self.kept.pop(ip, None)
                self.yielded[ip] = (member, now)
                self.counts["yielded"] += 1
                CONTESTS.labels("yielded").inc()
                logs.event(log, "vipContested", "another member announces this VIP: yielding it (the wire is the "
                           "last word)", logging.WARNING, ip=ip, member=member, quorum=quorum, outcome="yielded")
            elif fresh:
                self.kept[ip] = (member, now)
                self.counts["kept"] += 1
                CONTESTS.labels("kept").inc()
                logs.event(log, "vipContested", "another member announces this VIP: keeping it (it yields by the "
                           "same rule)", logging.INFO, ip=ip, member=member, quorum=quorum, outcome="kept")
        for ip in list(self.yielded):
            member, at = self.yielded[ip]
            if ip not in final:
                del self.yielded[ip]  # the election moved it anyway
            elif quorum and (member not in candidates.get(ip, ()) or now - at >= CONTEST_HOLD):
                del self.yielded[ip]  # the election decides again, from a view with quorum
        out = {ip: REASON_YIELDED_ON_WIRE for ip in self.yielded if ip in final}
        if not quorum:
            out.update((ip, REASON_NO_QUORUM) for ip in final if ip not in announced and ip not in out)
        elif settling:
            given = set(handed())
            out.update((ip, REASON_SETTLING) for ip in final if ip not in announced and ip not in out
                       and ip not in given)
        return out

    def settling(self, now: float | None = None) -> bool:
        """Quorum was gained back less than ``settle`` seconds ago: nothing new is taken yet."""
        return (time.monotonic() if now is None else now) - self._quorum_since < self.settle

    def next_deadline(self) -> float | None:
        """When a yielded VIP may be taken back (monotonic), for the decision loop's next wake-up."""
        return min((at + CONTEST_HOLD for _m, at in self.yielded.values()), default=None)

    def status(self) -> dict:
        return {"yielded": {ip: m for ip, (m, _at) in sorted(self.yielded.items())}, "counts": dict(self.counts)}
