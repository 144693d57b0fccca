"""What the heartbeat tells about itself: its counters, the datagrams it drops (counted by reason,
logged at most once per reason every REJECT_LOG_EVERY s) and the events of its view's changes
(quorum, suspicions, cut-off)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import Counter

from .heartbeat_rule import HeartbeatView
from .logs import event

REJECTED = Counter("nocloudlb_heartbeat_rejected", "Heartbeat datagrams dropped, by reason", ["reason"])

#: rejected datagrams are logged once per reason per this many seconds (counted every time)
REJECT_LOG_EVERY = 10.0


class Report:
    """The counters (``counters``, ``rejected``: reason -> datagrams dropped) and the log lines of one
    heartbeat; ``timeout`` (s) is named in the suspicion events."""

    def __init__(self, log: logging.Logger, clock: Callable[[], float], timeout: float) -> None:
        self.log = log
        self._clock = clock
        self.timeout = timeout
        self._logged_reject: dict[str, float] = {}  # reason -> when a rejection was last logged
        self.counters = {"sent": 0, "received": 0, "rejectedAuth": 0, "rejectedReplay": 0, "rejectedOther": 0,
                         "suspicions": 0}
        self.rejected: dict[str, int] = {}  # reason -> datagrams dropped (tooLong, badMac, retiredKey, ...)

    def reject(self, reason: str, detail: str) -> None:
        """Count a dropped datagram by reason (metric, status) and log it at most once per reason per
        REJECT_LOG_EVERY s: nothing a datagram says changes what this node believes."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        legacy = "rejectedAuth" if reason in ("badMac", "retiredKey") else \
            "rejectedReplay" if reason in ("replay", "oldBoot") else "rejectedOther"
        self.counters[legacy] += 1
        REJECTED.labels(reason).inc()
        now = self._clock()
        if now - self._logged_reject.get(reason, -1e9) >= REJECT_LOG_EVERY:
            self._logged_reject[reason] = now
            event(self.log, "heartbeatRejected", detail[:200], logging.WARNING, reason=reason,
                  count=self.rejected[reason])

    def quorum(self, view: HeartbeatView) -> None:
        """The quorum changed to ``view.quorum``."""
        event(self.log, "quorumGained" if view.quorum else "quorumLost",
              "connected to a majority: may take VIPs" if view.quorum else
              "not connected to a majority: keeping the VIPs held, taking none",
              logging.INFO if view.quorum else logging.WARNING, votes=view.votes, total=view.total,
              connected=sorted(view.connected))

    def suspicions(self, old: HeartbeatView, view: HeartbeatView) -> None:
        """The members suspected, the suspecters or the cut-off changed from ``old`` to ``view``."""
        for n in sorted(view.suspected - old.suspected):
            self.counters["suspicions"] += 1
            event(self.log, "nodeUnreachable", "no heartbeat within interval x miss: its VIPs go to the next "
                  "nodes (handover forwarding toward it) until it is heard again or gossip declares it dead",
                  logging.WARNING, node=n, timeoutMs=round(self.timeout * 1000))
        for n in sorted(old.suspected - view.suspected):
            event(self.log, "nodeReachable", "heartbeats again", node=n)
        if view.cut_off != old.cut_off:
            event(self.log, "heartbeatCutOff" if view.cut_off else "heartbeatReconnected",
                  "this node hears no member's heartbeat: keeping what it holds, taking nothing" if view.cut_off
                  else "this node hears members' heartbeats again",
                  logging.WARNING if view.cut_off else logging.INFO)
        if view.suspecters != old.suspecters:
            event(self.log, "heartbeatSuspectedBy", suspecters=sorted(view.suspecters),
                  level=logging.WARNING if view.suspecters else logging.INFO)
