"""Anti-entropy after a heal: push-pull exchanges (``Cluster.join([addr])``) in the background with
the members that may have healed, and with the members held dead, on the schedule membership.py's
module docstring describes (only the few members healsync.py pairs with each one, never all)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import kinship
from kinship.blocking import Cluster

from .healsync import heal_sync
from .logs import event
from .memberview import MemberView

#: Push-pull attempts with members held dead: seconds between attempts, at first and later.
RECONNECT_FAST = 1.0
RECONNECT_FAST_FOR = 120.0
RECONNECT_SLOW = 10.0


class HealSync:
    """When this node (``name``) last exchanged with each member, the exchanges in flight and since when
    each member is held dead; ``lock`` is membership's, guarding these."""

    def __init__(self, name: str, cluster: Callable[[], Cluster | None], members: Callable[[], list[MemberView]],
                 stop: threading.Event, lock: threading.Lock, log: logging.Logger) -> None:
        self.name = name
        self._cluster = cluster
        self._members = members
        self._stop = stop
        self._lock = lock
        self.log = log
        self._synced: dict[str, float] = {}  # member name -> when we last push-pulled with it after a heal
        self._syncing: set[str] = set()  # push-pulls in flight
        self._dead_since: dict[str, float] = {}  # members held dead -> monotonic time we saw them die

    def dead(self, name: str) -> None:
        """Gossip declared ``name`` dead (now, unless it already was)."""
        with self._lock:
            self._dead_since.setdefault(name, time.monotonic())

    def back(self, name: str) -> None:
        """``name`` joined, recovered or left: not held dead any more."""
        with self._lock:
            self._dead_since.pop(name, None)

    def reconnect_dead(self, now: float) -> None:
        """Push-pull with the members held dead that are due (see membership.py's module docstring)."""
        with self._lock:
            dead = dict(self._dead_since)
        if not dead:
            return
        due: dict[str, list[MemberView]] = {"reconnect": [], "reconnectSlow": []}
        members = self._members()
        alive = [m.name for m in members if m.state in ("alive", "suspect")]  # as memberevents.py counts
        for m in members:
            since = dead.get(m.name)
            if since is None or m.state != "dead" or m.name == self.name:
                continue
            # every RECONNECT_FAST s only from the few members paired with it (healsync.py): a member held
            # dead by all that comes back meets about 2k exchanges at once, not one per member
            fast = now - since < RECONNECT_FAST_FOR and heal_sync(self.name, m.name, alive)
            every = RECONNECT_FAST if fast else RECONNECT_SLOW
            # the others' first attempt comes RECONNECT_SLOW s after the death, not at once with the pairs'
            last = self._synced.get(m.name, -1e9) if fast else max(self._synced.get(m.name, -1e9), since)
            if now - last >= every:
                due["reconnect" if fast else "reconnectSlow"].append(m)
        for why, todo in due.items():
            self.sync(todo, every=0.0, why=why)

    def sync(self, members: list[MemberView], every: float = 1.0, why: str = "joined") -> None:
        """Push-pull with ``members`` in the background, each at most once per ``every`` seconds and never
        twice at the same time; ``why`` goes into the log events (``joined``: a paired member came back,
        ``reconnect`` / ``reconnectSlow``: a member held dead, by a pair or by any other member,
        ``resumed``: this node found itself paused)."""
        now = time.monotonic()
        with self._lock:
            todo = [m for m in members if m.name not in self._syncing
                    and now - self._synced.get(m.name, -1e9) >= every]
            for m in todo:
                self._synced[m.name] = now
                self._syncing.add(m.name)
        if todo:
            threading.Thread(target=self._push_pull, args=(todo, why), name="membership-sync", daemon=True).start()

    def _push_pull(self, members: list[MemberView], why: str) -> None:
        for m in members:
            try:
                cluster = self._cluster()
                if self._stop.is_set() or cluster is None:
                    continue
                cluster.join([m.addr], timeout=2.0)
                event(self.log, "memberlistSynced", "exchanged full state", logging.DEBUG, node=m.name,
                      addr=m.addr, state=m.state, why=why)
            except (kinship.KinshipError, TimeoutError, OSError, ValueError) as exc:
                event(self.log, "memberlistSyncFailed", str(exc), logging.DEBUG, node=m.name, addr=m.addr,
                      state=m.state, why=why)
            finally:
                with self._lock:
                    self._syncing.discard(m.name)
