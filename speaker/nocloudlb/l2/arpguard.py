"""The layer-2 mode's fail-closed switch for the ARP sysctls (delivery.py): checked, and set back,
on every apply; while one is wrong and cannot be set back the kernel would answer for every IPv4
VIP on lo, so the mode holds none there, announces none and publishes this node as excluded.

Part of the layer-2 mode (mode.py), used on its decision thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .. import logs

log = logging.getLogger("nocloudlb.speaker")


class ArpGuard:
    """``unsafe``: the ARP sysctls are wrong and cannot be set back."""

    def __init__(self, post: Callable[[], None]) -> None:
        self.post = post
        self.unsafe = False

    def check(self, delivery: Any) -> None:
        """Check (and set back) the ARP sysctls; fail closed while one is wrong and cannot be set back."""
        if not hasattr(delivery, "verify_host"):
            return
        delivery.verify_host()
        unsafe = bool(getattr(delivery, "arp_unsafe", lambda: False)())
        if unsafe == self.unsafe:
            return
        self.unsafe = unsafe
        if unsafe:
            logs.event(log, "arpSysctlFailClosed", "ARP sysctls wrong and cannot be set back: the kernel would "
                       "answer for every IPv4 VIP on lo; withdrawing them from lo and from ARP, and publishing "
                       "this node as excluded so its peers take its VIPs", logging.ERROR,
                       error=str(self._error(delivery))[:300])
        else:
            logs.event(log, "arpSysctlSafeAgain", "ARP sysctls set back: this node serves again")
        self.post()  # publish the change of exclusion and decide again

    @staticmethod
    def _error(delivery: Any) -> str:
        status: dict[str, Any] = getattr(delivery, "sysctl_status", dict)()
        return str(status.get("error", ""))
