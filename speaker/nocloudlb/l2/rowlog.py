"""The layer-2 mode's log of VIP changes: ``serviceAnnounced`` / ``serviceWithdrawn`` /
``serviceNotAnnounced``, one line per VIP whose (announcing, reason) differs from the last one
logged, written off the decision thread (logs.Batch).

Part of the layer-2 mode (mode.py), used on its decision thread.
"""

from __future__ import annotations

import logging

from .. import logs
from .rows import VipRow

log = logging.getLogger("nocloudlb.speaker")


class RowLog:
    """What was logged last: (service, ip) -> (announcing, reason)."""

    def __init__(self) -> None:
        self.prev: dict[tuple[str, str], tuple[bool, str]] = {}

    def log_changes(self, rows: list[VipRow], me: str, reason: str = "") -> None:
        self.log_seen([(r, (r.announcing, r.reason)) for r in rows], me, reason)

    def log_seen(self, rows: list[tuple[VipRow, tuple[bool, str]]], me: str, reason: str = "",
                 present: set[tuple[str, str]] | None = None) -> None:
        """Log each row whose (announcing, reason) differs from the last logged. ``rows`` are all rows,
        or (``present`` given: the keys of all rows) only those that may have changed."""
        prev = self.prev
        seen: dict[tuple[str, str], tuple[bool, str]] = {} if present is None else \
            {k: v for k, v in prev.items() if k in present}
        with logs.Batch(log) as out:  # one VIP a line, each at its event time, written off this thread
            for r, now in rows:
                key = (r.service, r.ip)
                seen[key] = now
                before = prev.get(key)
                if before == now:
                    continue
                if now[0]:
                    out.event("serviceAnnounced", service=r.service, ip=r.ip, node=me, pool=r.pool,
                              protocol="layer2", interfaces=r.interfaces or "all eligible")
                elif before is None or before[0] or before[1] != now[1]:
                    withdrawn = bool(before and before[0])
                    out.event("serviceWithdrawn" if withdrawn else "serviceNotAnnounced",
                              level=logging.INFO if withdrawn else logging.DEBUG,
                              service=r.service, ip=r.ip, reason=now[1], leader=r.leader, node=me)
            for key, was in prev.items():
                if key not in seen and was[0]:
                    out.event("serviceWithdrawn", service=key[0], ip=key[1], reason=reason or "serviceDeleted",
                              node=me)
        self.prev = seen

    def shutdown(self) -> None:
        """The mode closes: every VIP announced is withdrawn (reason ``shutdown``)."""
        with logs.Batch(log) as out:
            for key, (announcing, _reason) in self.prev.items():
                if announcing:
                    out.event("serviceWithdrawn", service=key[0], ip=key[1], reason="shutdown")
        self.prev = {}
