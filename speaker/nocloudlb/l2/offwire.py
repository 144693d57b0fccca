"""VIPs led off the wire: the ones a leader does not answer (its RFC 5227 check runs, or another MAC
answers them), which a member taking them must check first instead of announcing at once.

Part of the layer-2 mode (mode.py). A node gaining a VIP from a member it saw lead it skips the check
(plan.py: failover speed), which is right only when that member answered the VIP. So each node
publishes the VIPs it leads off the wire (``publish``, metadata ``x``) and a taker checks a VIP when
its old leader said so (``led_off_wire``, from the last metadata seen of that member) or when it found
the VIP in conflict itself in the last ``CONFLICT_MEMORY`` s (that member's metadata may not have
reached it yet: ``note``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..metadata import MAX_OFF_WIRE

# how long a conflict this node found keeps the check on a later take of that VIP (the announcer's re-check
# interval: an address another host owned that long ago is checked as any new one would be)
CONFLICT_MEMORY = 30.0


class OffWire:
    def __init__(self, led_off_wire: Callable[[str, str], bool]) -> None:
        self.led_off_wire = led_off_wire  # (member, ip): its last metadata lists ip in ``x`` (views.py)
        self._conflicted: dict[str, float] = {}  # ip -> when this node last saw it in conflict

    def must_check(self, before: str, ip: str) -> bool:
        """Taking ``ip`` from ``before``: check it first (``before`` never answered it, as far as we know)."""
        return ip in self._conflicted or self.led_off_wire(before, ip)

    def note(self, conflicts: Any) -> None:
        """The addresses the announcer has in conflict now (after each apply)."""
        now = time.monotonic()
        if self._conflicted:
            self._conflicted = {ip: t for ip, t in self._conflicted.items() if now - t < CONFLICT_MEMORY}
        for ip in conflicts:
            self._conflicted[ip] = now

    @staticmethod
    def publish(announcer: Any) -> list[str] | None:
        """What this node leads off the wire, at most one more than travels (then ``x`` is ``*``); None when
        the announcer cannot say."""
        off_wire = getattr(announcer, "off_wire", None)
        return off_wire(MAX_OFF_WIRE + 1) if off_wire is not None else None
