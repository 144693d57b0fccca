"""The VIPs the layer-2 mode holds on ``lo`` (delivery.sync_lo_vips): every VIP this node may serve,
put there before any of them is announced. A VIP whose add fails is not confirmed there, so the
mode does not announce it (reason ``notOnLo``), and the next apply tries again.

Part of the layer-2 mode (mode.py), used on its decision thread.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .. import logs

log = logging.getLogger("nocloudlb.speaker")


class LoHold:
    """``on_lo``: the VIPs confirmed on lo by the last successful sync; ``wanted``: what it was asked to
    hold (None: the last sync failed, so the next apply runs in full)."""

    def __init__(self) -> None:
        self.on_lo: set[str] = set()
        self.wanted: set[str] | None = None

    def sync(self, lo: set[str], delivery: Any, state_dir: str) -> None:
        """Hold ``lo`` on lo when it changed or is not all there."""
        if lo != self.wanted or not lo <= self.on_lo:
            try:
                delivery.sync_lo_vips(lo, state_file=os.path.join(state_dir, "lo-vips.json"))
                self.on_lo = set(lo)
                self.wanted = set(lo)
            except Exception as exc:  # noqa: BLE001 - report; VIPs not on lo are not announced; retried
                logs.event(log, "loSyncFailed", str(exc)[:500], logging.ERROR)
                self.on_lo &= lo
                self.wanted = None
