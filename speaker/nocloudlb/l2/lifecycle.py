"""The timed life of each address the announcer was given (see announcer.py's module docstring):
the RFC 5227 check (probes, then a decision), the gratuitous ARP/NA rounds of an address being
announced, and the re-check of an address in conflict, on one timer heap; and the deadline of each
hand-off (vips.py), ended here when the member taking the address never announced it.

Part of the announcer, run by its event loop with its lock held: ``run_timers`` does what is due,
queueing probes and gratuitous frames on the interfaces' transmit queues (sent by pacing.py).
Every timer names the address's generation, so a withdrawn (or re-added) address's timers do
nothing.

A planned take (``announce(take=True)``: the daemon takes the address from a member it sees alive, which
answers it until it hears this node's announcement, vips.py ``hand_off``) is not answered at once: on each
interface its gratuitous round goes as one ``take`` entry of the queue, and when pacing lets it leave the
responder child announces, then answers (``T``, responder.py). So the two never answer one request
together for longer than the announcement takes to cross the wire. A ``take`` that never leaves (dropped
from a full queue, its interface closed, the lease run out) is answered after ``TAKE_MAX`` s anyway
(``takes_late``), well inside the giver's hand-off bound.
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import Any

from prometheus_client import Counter

from . import arp, ndp
from .links import Links
from .tables import Iface, Vip
from .vips import VipTable

TAKE_MAX = 0.5  # seconds a planned take may wait for its announcement to leave before it is answered anyway

HANDOFFS = Counter("nocloudlb_layer2_handoffs", "Addresses handed off in a planned move, by how the hand-off ended "
                   "(announced: the taker announced it; otherAnnounced: another MAC did; timeout: nobody did within "
                   "the bound; withdrawn: this node withdrew everything)", ["outcome"])


class Lifecycle:
    """The timer heap and the state changes of each address: checking -> announcing | conflict."""

    def __init__(self, log: logging.Logger, metrics: Any, table: VipTable, links: Links, *, check_probes: int,
                 check_interval: float, check_wait: float, garp_rounds: int, garp_interval: float,
                 conflict_retry: float, member_wait: float, max_queue: int) -> None:
        self.log = log
        self.metrics = metrics
        self.table = table
        self.links = links
        self.check_probes = check_probes
        self.check_interval = check_interval
        self.check_wait = check_wait
        self.garp_rounds = garp_rounds
        self.garp_interval = garp_interval
        self.conflict_retry = conflict_retry
        self.member_wait = member_wait
        self.max_queue = max_queue
        self.member_waits = 0  # probes repeated because a member still answered (stats()["member_waits"])
        self.takes_late = 0  # planned takes answered at TAKE_MAX: their announcement had not left
        self.heap: list[tuple[float, int, str, str, int, tuple]] = []
        self._seq = 0

    def next_due(self) -> float | None:
        due = self.heap[0][0] if self.heap else None
        if self.table.handing:
            until = self.table.handoff_due()
            due = until if due is None or (until is not None and until < due) else due
        return due

    def schedule(self, due: float, action: str, vip: Vip, arg: tuple = ()) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (due, self._seq, action, vip.ip, vip.gen, arg))

    # -- state changes ---------------------------------------------------------------------
    def begin_check(self, vip: Vip, now: float) -> None:
        vip.state = "checking"
        vip.conflict = None
        vip.check_started = now
        vip.member_answered = False
        self.table.checking[vip.packed] = vip
        self.schedule(now, "probe", vip, (0,))

    def announce(self, vip: Vip, now: float, urgent: bool = False, take: bool = False) -> None:
        """Start answering and announcing ``vip``; ``urgent``: it was taken over (its first round goes
        before any queued re-announcement); ``take``: a planned take, answered once announced (module docstring)."""
        vip.state = "announcing"
        self.table.checking.pop(vip.packed, None)
        if self.table.conflicts.pop(vip.ip, None) is not None:
            self.log.info("ipConflictCleared", extra={"event": "ipConflictCleared", "ip": vip.ip})
        if take:
            vip.taking = set(vip.ifaces)
            self.schedule(now + TAKE_MAX, "answer", vip)
        else:
            for name in vip.ifaces:
                self.table.start_answering(vip, name)
        self.start_series(vip, now, urgent)

    def start_series(self, vip: Vip, now: float, urgent: bool = False) -> None:
        """A new gratuitous schedule on every interface of ``vip``; the rounds still due of any earlier one
        are dropped, and so are its frames still queued (they would only repeat the new schedule's).
        ``urgent``: its first round goes in the urgent queue."""
        vip.series += 1
        self.schedule(now, "garp", vip, (0, tuple(sorted(vip.ifaces)), vip.series, urgent))

    def apply_ifaces(self, vip: Vip, new: set[str], now: float) -> None:
        old = vip.ifaces
        vip.ifaces = new
        if vip.state != "announcing":
            return
        for name in old - new:
            vip.taking.discard(name)
            self.table.stop_answering(vip, name)
        added = new - old
        for name in added:
            self.table.start_answering(vip, name)
        if added:
            self.schedule(now, "garp", vip, (0, tuple(sorted(added)), vip.series))

    def reresolve(self, now: float) -> None:
        """The interfaces changed (links.py): resolve every address's interfaces again."""
        for vip in self.table.vips.values():
            self.apply_ifaces(vip, set(self.links.resolve(vip)), now)
            if vip.state == "announcing":  # re-add answers on re-opened interfaces
                for name in vip.ifaces - vip.taking:
                    if name in self.links.ifaces and vip.packed not in self.links.ifaces[name].answer:
                        self.table.start_answering(vip, name)

    def _on_conflict(self, vip: Vip, now: float) -> None:
        vip.state = "conflict"
        self.table.checking.pop(vip.packed, None)
        first = vip.ip not in self.table.conflicts
        self.table.conflicts[vip.ip] = dict(vip.conflict or {})
        self.metrics.conflicts.labels(vip.ip).inc()
        if first:
            self.log.warning("ipConflict", extra={"event": "ipConflict", **(vip.conflict or {})})
        if self.conflict_retry > 0:
            self.schedule(now + self.conflict_retry, "recheck", vip)

    # -- the timers ------------------------------------------------------------------------
    def run_timers(self) -> None:
        now = time.monotonic()
        while self.heap and self.heap[0][0] <= now:
            _when, _seq, action, ip, gen, arg = heapq.heappop(self.heap)
            vip = self.table.current(ip, gen)
            if vip is None:
                continue
            if action == "probe" and vip.state == "checking":
                self._probe(vip, arg[0], now)
            elif action == "decide" and vip.state == "checking":
                if vip.conflict is None and vip.member_answered and now - vip.check_started < self.member_wait:
                    vip.member_answered = False  # a member still answers: probe again, announce at its silence
                    self.member_waits += 1
                    self.schedule(now, "probe", vip, (max(0, self.check_probes - 1),))
                elif vip.conflict is None:
                    self.announce(vip, now)
                else:
                    self._on_conflict(vip, now)
            elif action == "recheck" and vip.state == "conflict":
                self.begin_check(vip, now)
            elif action == "garp" and vip.state == "announcing":
                self._garp(vip, arg, now)
            elif action == "answer" and vip.state == "announcing" and vip.taking:
                self.takes_late += len(vip.taking)  # its announcement never left: answered all the same
                for name in sorted(vip.taking):
                    self.table.start_answering(vip, name)
                vip.taking.clear()
        if self.table.handing:
            self.table.expire_handoffs(now)
        self.log_handoffs()

    def log_handoffs(self) -> None:
        """Log and count the hand-offs that ended since the last call."""
        ended, self.table.handoffs_ended = self.table.handoffs_ended, []
        for ip, how, took in ended:
            HANDOFFS.labels(how).inc()
            self.log.log(logging.INFO if how != "timeout" else logging.WARNING, "vipHandedOff",
                         extra={"event": "vipHandedOff", "ip": ip, "outcome": how, "ms": round(took * 1000, 1)})

    def _probe(self, vip: Vip, n: int, now: float) -> None:
        vip.probe_no = n
        vip.probes_pending = 0
        for name in sorted(vip.ifaces):
            iface = self.links.ifaces.get(name)
            if iface is None:
                continue
            frame = (arp.probe(iface.mac, vip.packed) if vip.version == 4
                     else ndp.solicitation(iface.mac, vip.packed))
            iface.queue.append((vip.ip, vip.gen, frame, "probe", 0))
            vip.probes_pending += 1
        if vip.probes_pending == 0:
            self.probe_sent(vip, now)

    def _garp(self, vip: Vip, arg: tuple, now: float) -> None:
        rnd, names, series = arg[:3]
        urgent = rnd == 0 and len(arg) > 3 and arg[3]
        if series != vip.series:
            return  # replaced by a newer schedule (reannounce)
        for name in names:
            iface = self.links.ifaces.get(name)
            if iface is None or name not in vip.ifaces:
                continue
            frames = (arp.gratuitous(iface.mac, vip.packed) if vip.version == 4
                      else [ndp.unsolicited_na(iface.mac, vip.packed)])
            if urgent:  # a takeover displaces queued re-announcements (newest first)
                self._make_room(iface, len(frames), now)
            if len(iface.queue) + len(iface.urgent) + len(frames) > self.max_queue:
                # bounded: a round that does not fit is dropped (the next round comes anyway)
                iface.dropped += len(frames)
                continue
            target = iface.urgent if urgent else iface.queue
            if name in vip.taking:  # not answered yet: the round leaves as one entry, then it is (pacing.py)
                target.append((vip.ip, vip.gen, frames, "take", series))
                continue
            for frame in frames:
                target.append((vip.ip, vip.gen, frame, "gratuitous", series))
        if rnd + 1 < self.garp_rounds:
            self.schedule(now + self.garp_interval, "garp", vip, (rnd + 1, names, series))

    def _make_room(self, iface: Iface, frames: int, now: float) -> None:
        """Drop queued non-urgent frames, newest first, until ``frames`` more fit in ``max_queue``."""
        while iface.queue and len(iface.queue) + len(iface.urgent) + frames > self.max_queue:
            ip, gen, _frame, kind, _series = iface.queue.pop()
            iface.dropped += 1
            vip = self.table.current(ip, gen)
            if kind == "probe" and vip is not None and vip.state == "checking":
                vip.probes_pending -= 1  # a probe that will never leave: do not stall the check
                if vip.probes_pending <= 0:
                    self.probe_sent(vip, now)

    def queue_lost(self, iface: Iface, now: float) -> None:
        """``iface`` closed: its queued probes will never leave, so their checks go on without them."""
        for ip, gen, _frame, kind, _series in iface.queue:
            if kind == "mcast":
                continue
            vip = self.table.current(ip, gen)
            if kind == "probe" and vip is not None and vip.state == "checking":
                vip.probes_pending -= 1
                if vip.probes_pending <= 0:
                    self.probe_sent(vip, now)

    def probe_sent(self, vip: Vip, now: float) -> None:
        """All frames of probe ``vip.probe_no`` left (pacing may delay them): time the next step from now."""
        if vip.probe_no + 1 < self.check_probes:
            self.schedule(now + self.check_interval, "probe", vip, (vip.probe_no + 1,))
        else:
            self.schedule(now + self.check_wait, "decide", vip)
