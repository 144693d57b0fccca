"""The announcer's side of the answering lease (lease.py): the shared page it renews, the grant at
start, and the count (and rate-limited log line) of requests refused because it ran out.

Part of the announcer (announcer.py): its own answers (answering.py) and its gratuitous frames
(pacing.py) check ``valid()``; the responder child reads the same page (its fd travels with it).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .lease import Lease

LEASE_LOG_EVERY = 10.0  # seconds between leaseExpired lines (the counter counts every refusal)


class LeaseGate:
    """The lease page, its grant at start, and the refusals."""

    def __init__(self, log: logging.Logger, metrics: Any, grant: float | None) -> None:
        self.log = log
        self.metrics = metrics
        self.lease = Lease.create()
        self.grant = grant  # seconds granted at start(); None: open (no deadline) until the first renewal
        self.refused = 0  # requests refused because the lease had run out (child and this thread)
        self._logged = -1e9  # when leaseExpired was logged last (at most every LEASE_LOG_EVERY s)
        metrics.lease_remaining.set_function(self._remaining)

    @property
    def fd(self) -> int:
        return self.lease.fd

    def start(self) -> None:
        if self.grant is not None:
            self.lease.renew(self.grant)

    def valid(self) -> bool:
        return self.lease.valid()

    def renew(self, seconds: float, start_ns: int | None = None) -> bool:
        """Renew; True when it had run out and is valid again (held gratuitous frames may leave)."""
        expired = not self.lease.valid()
        self.lease.renew(seconds, start_ns)
        return expired and self.lease.valid()

    def status(self) -> dict:
        left = self.lease.remaining()
        return {"remainingMs": None if left is None else round(left * 1000, 1), "refused": self.refused}

    def _remaining(self) -> float:
        left = self.lease.remaining()
        return float("inf") if left is None else left

    def refuse(self, ip: str, count: int = 1) -> None:
        """``count`` requests for ``ip`` refused for want of a lease: counted, logged (every LEASE_LOG_EVERY s)."""
        self.refused += count
        self.metrics.lease_expired.inc(count)
        now = time.monotonic()
        if now - self._logged >= LEASE_LOG_EVERY:  # the child's late reports of one lapse: one line
            self._logged = now
            self.log.warning("leaseExpired", extra={
                "event": "leaseExpired", "ip": ip, "refused": self.refused,
                "reason": "not answering: the daemon did not renew the layer-2 lease in time (frozen or stalled)"})
