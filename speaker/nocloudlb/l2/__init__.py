"""Layer-2 mode: ARP/NDP responders on raw sockets, gratuitous announcements, VIP delivery on lo.

Public API (used by the daemon): :class:`L2Announcer`, :func:`eligible_interfaces`,
:func:`probe`, and the :mod:`nocloudlb.l2.delivery` module (``prepare_host``, ``sync_lo_vips``).

The names are imported on first use, so the responder process (``python -m
nocloudlb.l2.responder``) starts without loading the announcer, pyroute2 or prometheus_client.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .announcer import L2Announcer
    from .interfaces import eligible_interfaces
    from .probe import probe

__all__ = ["L2Announcer", "eligible_interfaces", "probe"]


def __getattr__(name: str) -> Any:
    value: Any
    if name == "L2Announcer":
        from .announcer import L2Announcer as value
    elif name == "eligible_interfaces":
        from .interfaces import eligible_interfaces as value
    elif name == "probe":
        from .probe import probe as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """Importing the submodule ``probe`` binds the package's ``probe`` to the function, not the module
    (as the eager ``from .probe import probe`` did), whichever import comes first."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "probe" and isinstance(value, types.ModuleType) and hasattr(value, "probe"):
            value = value.probe
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
