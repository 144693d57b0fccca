"""The membership event thread: turns kinship's events into the daemon's callbacks (a change, a heal,
a user message), the join state and push-pulls (memberheal.py), and watches what kinship only counts:
refutations of this node's death, gossip this node cannot decrypt, and pauses of the process."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kinship
from kinship.blocking import Cluster

from .healsync import heal_sync
from .logs import event
from .memberheal import RECONNECT_SLOW, HealSync
from .memberjoin import Joiner
from .memberview import MemberView, member_view

_EVENT_NAMES = {
    kinship.MemberJoined: ("nodeJoined", logging.INFO),
    kinship.MemberSuspect: ("nodeSuspect", logging.WARNING),
    kinship.MemberRecovered: ("nodeRecovered", logging.INFO),
    kinship.MemberDead: ("nodeFailed", logging.WARNING),
    kinship.MemberLeft: ("nodeLeft", logging.INFO),
    kinship.MemberUpdated: ("nodeUpdated", logging.DEBUG),
}


class EventPump:
    """The event thread's loop (``run``) for node ``name``: ``known`` (the members ever heard of,
    guarded by ``lock``) grows with each event; a process late by more than ``pause_threshold`` s is
    a heal. The callbacks are membership's: ``on_change()``, ``on_heal(reason, node)``, ``on_message()``
    (the user-message handler now, or None) and ``on_closed()`` (kinship stopped on its own)."""

    def __init__(self, name: str, cluster: Callable[[], Cluster | None], stats: Callable[[], dict[str, int]],
                 members: Callable[[], list[MemberView]], joiner: Joiner, heal: HealSync, *,
                 known: set[str], lock: threading.Lock, stop: threading.Event, pause_threshold: float,
                 on_change: Callable[[], None], on_heal: Callable[[str, str], None],
                 on_message: Callable[[], Callable[[str, bytes], None] | None], on_closed: Callable[[], None],
                 log: logging.Logger) -> None:
        self.name = name
        self._cluster = cluster
        self._stats = stats
        self._members = members
        self._joiner = joiner
        self._heal = heal
        self._known = known
        self._lock = lock
        self._stop = stop
        self.pause_threshold = pause_threshold
        self._on_change = on_change
        self._on_heal = on_heal
        self._on_message = on_message
        self._on_closed = on_closed
        self.log = log
        self._refutations = 0
        self._decrypt_seen = 0
        self._next_reconnect = 0.0

    def run(self) -> None:
        cluster = self._cluster()
        assert cluster is not None
        last_check = 0.0
        wait = 0.25
        last_wake = time.monotonic()
        try:
            self._refutations = self._stats().get("refutations", 0)
            for ev in cluster.events(timeout=wait):
                if self._stop.is_set():
                    return
                now = time.monotonic()
                late = now - last_wake - wait
                last_wake = now
                if late > self.pause_threshold:
                    event(self.log, "speakerResumed", "this process did not run for a while (stopped, paused "
                          "or starved): peers may have declared it dead", logging.WARNING, paused=round(late, 3))
                    self._on_heal("resumed", self.name)
                    self._heal.sync([m for m in self._members() if m.name != self.name
                                     and m.state in ("alive", "suspect")], why="resumed")
                if ev is not None:
                    self._handle(ev)
                self._check_refuted()
                if now >= self._next_reconnect:
                    self._next_reconnect = now + 0.5
                    self._heal.reconnect_dead(now)
                if now - last_check > 5.0:
                    last_check = now
                    self._check_decrypt()
            if not self._stop.is_set():  # the event stream ended: kinship closed on its own
                event(self.log, "memberlistClosed", "membership stopped on an internal error", logging.ERROR)
                self._on_closed()
        except kinship.KinshipClosed:
            if not self._stop.is_set():
                event(self.log, "memberlistClosed", "membership stopped on an internal error", logging.ERROR)
                self._on_closed()
        except Exception:  # keep the daemon informed, never die silently
            self.log.exception("membership event thread failed")
            if not self._stop.is_set():
                self._on_closed()  # no more events: the view would go stale, so it is unknown

    def _handle(self, ev: Any) -> None:
        if isinstance(ev, kinship.EventsLost):
            event(self.log, "memberlistEventsLost", count=ev.count, level=logging.WARNING)
            self._on_change()
            return
        if isinstance(ev, kinship.UserMessage):
            on_message = self._on_message()
            if on_message is not None and ev.sender is not None:
                try:
                    on_message(ev.sender.name, bytes(ev.data))
                except Exception:  # noqa: BLE001 - a bad message never stops the event thread
                    self.log.debug("user message handler failed", exc_info=True)
            return
        member = getattr(ev, "member", None)
        if isinstance(ev, kinship.NameConflict):
            event(self.log, "nodeNameConflict", "two nodes claim the same name", logging.ERROR,
                  node=member.name if member else None, otherAddr=ev.other_addr)
            return
        if member is None:
            return
        with self._lock:
            self._known.add(member.name)
        name, level = _EVENT_NAMES.get(type(ev), ("nodeEvent", logging.DEBUG))
        event(self.log, name, level=level, node=member.name, addr=member.addr)
        if isinstance(ev, kinship.MemberJoined) and self._joiner.join_state != "joined":
            self._joiner.joined()
        self._on_change()
        if isinstance(ev, kinship.MemberDead):
            self._heal.dead(member.name)
        elif isinstance(ev, (kinship.MemberJoined, kinship.MemberRecovered, kinship.MemberLeft)):
            self._heal.back(member.name)
        if member.name != self.name and isinstance(ev, (kinship.MemberJoined, kinship.MemberRecovered)):
            self._on_heal("memberJoined" if isinstance(ev, kinship.MemberJoined) else "memberRecovered", member.name)
            # an exchange only on MemberJoined (kinship: alive again after unknown, dead or left; a refuted
            # suspicion is MemberRecovered, and nobody held that member dead), and only between the few
            # members healsync.py pairs: never one per member (a storm)
            if self._joiner.first_join_done.is_set() and isinstance(ev, kinship.MemberJoined):
                # suspect members count: a peer briefly suspected here would otherwise change this node's
                # pairs and make it exchange where the others do not expect it to
                alive = [m.name for m in self._members() if m.state in ("alive", "suspect")]
                if heal_sync(self.name, member.name, alive):
                    # not again if the reconnect that healed it exchanged with it moments ago
                    self._heal.sync([member_view(member)], every=RECONNECT_SLOW / 2)

    def _check_refuted(self) -> None:
        try:
            count = self._stats().get("refutations", 0)
        except kinship.KinshipClosed:
            return
        if count > self._refutations:
            event(self.log, "memberlistRefuted", "peers suspected or declared this node dead; it refuted that",
                  logging.WARNING, count=count - self._refutations, total=count)
            self._refutations = count
            self._on_heal("refuted", self.name)

    def _check_decrypt(self) -> None:
        try:
            failures = self._stats().get("decrypt_failures", 0)
        except kinship.KinshipClosed:
            return
        if failures > self._decrypt_seen:
            event(self.log, "memberlistDecryptFailures",
                  "gossip packets that our keys cannot decrypt: a node with another gossip key "
                  "(memberlist.keyFile) is trying to reach this cluster", logging.WARNING,
                  count=failures - self._decrypt_seen, total=failures)
            self._decrypt_seen = failures
