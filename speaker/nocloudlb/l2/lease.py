"""The answering lease: a deadline in a shared memory page that the daemon renews and the responder reads.

Why: the responder child (responder.py) answers ARP/NDP on its own, so a daemon frozen as a whole
(SIGSTOP of its PID, a debugger, a stall of the host scheduler that spares the child) would leave it
answering for VIPs its peers took over meanwhile: two MACs. With the lease the child answers only
while the deadline the daemon wrote has not passed; a frozen daemon renews nothing, so the child
falls silent by itself within one lease.

How: one signed 64-bit cell holding the deadline in CLOCK_MONOTONIC nanoseconds (system-wide: the
parent and the child read the same clock), in a ``memfd`` the child inherits (``pass_fds``) and maps
read-only. A renewal is a single aligned 8-byte store from any thread of the daemon (no pipe, no
lock, no hop through the announcer's thread); a check is an 8-byte load and ``time.monotonic_ns()``,
which Linux serves from the vDSO: no system call per request. ``memoryview.cast("q")`` makes both a
single machine-word access (CPython stores and loads the item as one ``long long``), so a reader
never sees half of a renewal.

``OPEN`` (the largest value) means no deadline: a lease never renewed, as used by tools and tests
that drive an announcer directly. The daemon's first renewal makes it binding, before it
announces anything (see ``L2Announcer.renew_lease`` and the daemon's decision loop).
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable

OPEN = (1 << 63) - 1  # no deadline
ENV = "NOCLOUDLB_LEASE_FD"  # names the inherited memfd in the responder's environment
_SIZE = 8


class Lease:
    """One deadline cell; ``create()`` in the daemon (writable), ``attach(fd)`` in the child (read-only)."""

    def __init__(self, fd: int, writable: bool) -> None:
        self.fd = fd
        self.writable = writable
        self._map = mmap.mmap(fd, _SIZE, mmap.MAP_SHARED,
                              mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        self._cell = memoryview(self._map).cast("q")
        self._closed = False

    @classmethod
    def create(cls) -> Lease:
        """A new lease, OPEN, in a close-on-exec memfd (``fd`` is what a child is handed)."""
        fd = os.memfd_create("nocloudlb-lease", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, _SIZE)
            lease = cls(fd, writable=True)
        except BaseException:
            os.close(fd)
            raise
        lease._cell[0] = OPEN
        return lease

    @classmethod
    def attach(cls, fd: int) -> Lease:
        """Map an inherited lease read-only; the fd is closed (the mapping keeps the memory)."""
        try:
            return cls(fd, writable=False)
        finally:
            os.close(fd)

    # -- the daemon's side ---------------------------------------------------------------
    def renew(self, seconds: float, start_ns: int | None = None) -> int:
        """Answer until ``seconds`` after ``start_ns`` (default now, CLOCK_MONOTONIC ns); the new deadline.

        A caller that checked something at ``start_ns`` passes it, so that a freeze between that check
        and this store yields a deadline already past, never a fresh one.
        """
        if seconds < 0:
            raise ValueError(f"lease: seconds must be >= 0, got {seconds!r}")
        deadline = (time.monotonic_ns() if start_ns is None else start_ns) + int(seconds * 1e9)
        self._cell[0] = deadline
        return deadline

    def expire(self) -> None:
        """Stop answering now (until the next renewal)."""
        self._cell[0] = 0

    def open(self) -> None:
        """No deadline (answer while running)."""
        self._cell[0] = OPEN

    # -- both sides ----------------------------------------------------------------------
    @property
    def deadline_ns(self) -> int:
        return int(self._cell[0])

    def valid(self) -> bool:
        return time.monotonic_ns() < self._cell[0]

    def remaining(self) -> float | None:
        """Seconds left (0.0 once expired); None while OPEN."""
        deadline = self._cell[0]
        if deadline == OPEN:
            return None
        return max(0.0, (deadline - time.monotonic_ns()) / 1e9)

    def close(self) -> None:
        if self._closed:
            return
        self._cell.release()
        self._map.close()
        self._closed = True
        if self.writable:
            try:
                os.close(self.fd)
            except OSError:
                pass


# -- the renewal, as the daemon's decision loop does it --------------------------------------
LEASE_MIN = 0.3  # seconds: a renewal every 0.1 s at the shortest (the loop wakes every lease / 3)
LEASE_MAX = 2.0
LEASE_TIMEOUTS = 2  # heartbeat timeouts (interval x miss) in a lease


def lease_seconds(interval: float, miss: int) -> float:
    """The lease for heartbeats every ``interval`` s, ``miss`` missed = suspected: two heartbeat timeouts,
    within [0.3 s, 2 s]. ``fast`` (25 ms x 4): 0.3 s; ``lan`` (150 ms x 4): 1.2 s."""
    return min(LEASE_MAX, max(LEASE_MIN, LEASE_TIMEOUTS * float(interval) * int(miss)))


class Renewal:
    """When the decision loop renews the lease (pure: the clock and the renewal are passed in).

    ``step(now_ns, renew)`` runs at the top of every pass of the loop, before it waits for events;
    ``renew(seconds, start_ns)`` is ``L2Announcer.renew_lease`` (it returns how many addresses it
    holds). The answer is the longest the loop may sleep, and an event to log (or None).

    - Steady state: renew on every pass; while any address is held, wake ``seconds / 3`` after the
      renewal at the latest, so a pass (and its wait) shorter than the lease never lets it lapse.
    - Stall: a pass that finds more than ``seconds`` since the renewal before it, while addresses
      were held, means this process stood still (frozen) or a pass ran longer than the lease. The
      child stopped answering meanwhile and the peers, which stopped hearing a frozen node, may have
      taken its VIPs: renewing now would answer again from the view of before the stall. So: no
      renewal for ``settle`` seconds (two heartbeat intervals: the heartbeat thread reads what
      arrived during the stall, its peers' suspicions included), then one pass that reconciles
      from that, and only at the pass after it the renewal; should that pass itself stall, again.
    - Renewal time: the deadline counts from ``now_ns``, read *before* the checks, so a freeze
      between the check and the store gives a deadline already past, never a fresh one.
    """

    def __init__(self, seconds: float, settle: float) -> None:
        if not seconds > 0 or settle < 0:
            raise ValueError(f"lease renewal: seconds must be > 0 and settle >= 0, got {seconds!r}, {settle!r}")
        self.seconds = float(seconds)
        self.settle = float(settle)
        self.last = 0  # ns of the last renewal (0: none yet)
        self.held = 0  # addresses held at the last renewal
        self.hold_until = 0  # ns; stalled: no renewal before then
        self.check_from = 0  # ns; stalled, settled: the pass after this one reconciles, the next renews
        self.stalled_at = 0  # ns of the last renewal before the stall
        self.stalls = 0

    @property
    def stalled(self) -> bool:
        return bool(self.hold_until or self.check_from)

    def step(self, now_ns: int, renew: Callable[[float, int], int]) -> tuple[float, dict | None]:
        lease_ns = int(self.seconds * 1e9)
        if self.hold_until and now_ns < self.hold_until:
            return (self.hold_until - now_ns) / 1e9, None
        if self.hold_until:  # settled: the next pass reconciles from what the heartbeats read
            self.hold_until, self.check_from = 0, now_ns
            return 0.0, None
        if self.check_from and now_ns - self.check_from > lease_ns:  # that pass stalled too
            return self._stall(now_ns, self.check_from)
        if not self.check_from and self.held and self.last and now_ns - self.last > lease_ns:
            return self._stall(now_ns, self.last)
        event = None
        if self.check_from:
            event = {"event": "l2LeaseRenewed", "stalledMs": round((now_ns - self.stalled_at) / 1e6)}
            self.check_from = 0
        self.held = renew(self.seconds, now_ns)
        self.last = now_ns
        return (self.seconds / 3 if self.held else 1.0), event

    def _stall(self, now_ns: int, since: int) -> tuple[float, dict]:
        if not self.check_from:
            self.stalled_at = since
        self.stalls += 1
        self.hold_until, self.check_from = now_ns + int(self.settle * 1e9), 0
        return self.settle, {"event": "l2LeaseStalled", "gapMs": round((now_ns - since) / 1e6),
                             "leaseMs": round(self.seconds * 1000), "settleMs": round(self.settle * 1000)}
