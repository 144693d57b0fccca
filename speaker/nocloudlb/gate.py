"""May this node announce anything yet (issue 23: one job out of daemon.py).

``StartGate.reason()`` is the layer-2 mode's gate (l2/mode.py): "" when this node may announce, else why
not: ``notReady`` before the first join ended (peers may hold the addresses), ``joinRefused`` when
peers are up but refuse this node's gossip (a wrong key: do not fight them), ``settling`` while a node
whose join found no seed waits ``startSettle`` seconds for peers starting at the same moment (logged
``speakerSettling`` once). ``settle_until`` is when that wait ends (the decision loop wakes for it).
"""

from __future__ import annotations

import logging
import time

from . import logs
from .configstate import ConfigState
from .runtime import Runtime

log = logging.getLogger("nocloudlb.speaker")


class StartGate:
    def __init__(self, rt: Runtime, config: ConfigState) -> None:
        self.rt = rt  # membership
        self.config = config  # cfg.start_settle
        self.settle_until = 0.0  # monotonic time before which a node that found no peer at start announces nothing

    def reason(self) -> str:
        """Why this node may not announce anything now ("" when it may)."""
        ml = self.rt.membership
        if ml is None or not ml.first_join_done.is_set():
            return "notReady"  # never take addresses before the first join: peers may hold them
        if ml.join_state == "joinFailed" and ml.join_refused:
            return "joinRefused"  # peers are up but refuse our gossip (wrong key): do not fight them
        if self.settle_until == 0.0:  # the first join just ended: settle if it found nobody
            settle = self.config.cfg.start_settle if self.config.cfg is not None else 0.0
            alone = ml.join_state == "joinFailed" and settle > 0
            self.settle_until = time.monotonic() + settle if alone else -1.0
            if alone:
                logs.event(log, "speakerSettling", "no join seed answered: waiting for peers starting now "
                           "before taking any VIP", seconds=settle)
        if ml.join_state == "joinFailed" and time.monotonic() < self.settle_until:
            return "settling"  # peers starting at the same moment join meanwhile: no VIP taken, then handed back
        return ""
