"""Canonical text of IP addresses handed to the L2 layer, with errors that name the caller."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def canonical_ips(ips: Iterable[str], what: str) -> list[str]:
    """``ips`` in canonical text form, in their order; ValueError says ``what`` then the bad entry."""
    out = []
    for ip in ips:
        try:
            out.append(str(ipaddress.ip_address(ip)))
        except ValueError:
            raise ValueError(f"{what} {ip!r} is not an IP address") from None
    return out
