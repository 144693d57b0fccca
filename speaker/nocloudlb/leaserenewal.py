"""The layer-2 answering lease, renewed by the decision thread (issue 23: one job out of daemon.py).

The announcer's responder answers ARP/NDP only while the lease the decision thread renews is valid
(l2/lease.py, l2/announcer.py): a frozen daemon's responder falls silent soon after its peers have
taken its VIPs. ``Speaker._next_event`` (daemon.py) calls ``LeaseRenewal.step()`` at the start of its
wait, whenever it is due meanwhile and just before the pass it returns to; ``step`` makes the
``Renewal`` at its first call (length from the heartbeat profile), logs ``l2LeaseStalled`` /
``l2LeaseRenewed`` (and ``l2LeaseFailed``: outside the loop's barrier, the lease lapses and the loop
goes on) and says how long the wait may last before the next step.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from . import logs
from .runtime import Runtime

log = logging.getLogger("nocloudlb.speaker")


class LeaseRenewal:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt  # l2 (its announcer's renew_lease), membership (the heartbeat profile)
        self._lease: Any = None  # l2/lease.py Renewal, made at the first wait

    def step(self) -> float:
        """One step of the lease renewal; the longest the wait may last before the next one."""
        announcer = self.rt.l2.announcer if self.rt.l2 is not None else None
        renew = getattr(announcer, "renew_lease", None)
        if renew is None or self.rt.membership is None:
            return 1.0
        try:
            if self._lease is None:
                from .l2.lease import Renewal, lease_seconds  # noqa: PLC0415

                interval, miss, _offset = self.rt.membership.settings.heartbeat()
                self._lease = Renewal(lease_seconds(interval, miss), settle=2 * interval)
            sleep, event = self._lease.step(time.monotonic_ns(), renew)
        except Exception as exc:  # noqa: BLE001 - outside the loop's barrier: the lease lapses, the loop goes on
            logs.event(log, "l2LeaseFailed", f"{type(exc).__name__}: {exc}"[:500], logging.ERROR)
            return 0.1
        if event is not None:
            name = event.pop("event")
            stalled = name == "l2LeaseStalled"
            logs.event(log, name, "this process stood still longer than the layer-2 lease: not answering until "
                       "a reconcile from what the heartbeats heard meanwhile" if stalled else
                       "answering again after a reconcile that followed the stall",
                       logging.WARNING if stalled else logging.INFO, **event)
        return sleep
