"""Canonical text of IP addresses handed to the L2 layer, with errors that name the caller.

At 10,000 VIPs ``ipaddress.ip_address`` (pure Python) costs tens of microseconds an address, on the
decision path of every takeover; ``parse`` reads the address with the C library's ``inet_pton`` and
keeps the text when ``inet_ntop`` gives it back unchanged (the text is then canonical: RFC 5952 for
IPv6, as ``ipaddress`` writes it); anything else (another spelling, an IPv4-mapped or embedded dotted
IPv6 form, a zone) goes through ``ipaddress``, so the answer is always ``ipaddress``'s.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

_AF = {4: socket.AF_INET, 6: socket.AF_INET6}


def parse(ip: str) -> tuple[str, bytes, int]:
    """(canonical text, packed bytes, version) of ``ip``; ValueError if it is not an IP address."""
    if isinstance(ip, str) and not (":" in ip and "." in ip):
        version = 6 if ":" in ip else 4
        try:
            packed = socket.inet_pton(_AF[version], ip)
        except (OSError, ValueError):
            packed = b""
        if packed and socket.inet_ntop(_AF[version], packed) == ip:
            return ip, packed, version
    addr = ipaddress.ip_address(ip)  # ValueError for what is not an address
    return str(addr), addr.packed, addr.version


def canonical_ips(ips: Iterable[str], what: str) -> list[str]:
    """``ips`` in canonical text form, in their order; ValueError says ``what`` then the bad entry."""
    out = []
    for ip in ips:
        try:
            out.append(parse(ip)[0])
        except ValueError:
            raise ValueError(f"{what} {ip!r} is not an IP address") from None
    return out
