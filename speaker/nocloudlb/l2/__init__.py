"""Layer-2 mode: ARP/NDP responders on raw sockets, gratuitous announcements, VIP delivery on lo.

Public API (used by the daemon): :class:`L2Announcer`, :func:`eligible_interfaces`,
:func:`probe`, and the :mod:`nocloudlb.l2.delivery` module (``prepare_host``, ``sync_lo_vips``).
"""

from .announcer import L2Announcer
from .interfaces import eligible_interfaces
from .probe import probe

__all__ = ["L2Announcer", "eligible_interfaces", "probe"]
