# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A router's next hops per prefix, read from its own JSON: pure parsers, stdlib only.

One implementation for the module ``bgp_route_info``, the BGP lab test, the BGP benchmark and
the molecule scenario's verify:

- ``kernel_routes``: ``ip -j route show`` (and ``ip -j -6 ...``): what the router forwards by;
- ``zebra_routes``: FRR's ``show ip route [bgp] json`` / ``show ipv6 route [bgp] json``: the
  routes zebra selected and installed, with the next hops installed in the FIB;
- ``bgp_paths``: FRR's ``show bgp ipv4 unicast PREFIX json``: every path with its next hop and
  whether it is best or multipath.

Prefixes come back canonical (``203.0.113.10/32``, ``2001:db8::10/128``): ``ip`` prints host
routes without their length.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any


def _load(data: Any) -> Any:
    if isinstance(data, (str, bytes)):
        text = data.decode() if isinstance(data, bytes) else data
        return json.loads(text) if text.strip() else None
    return data


def canonical_prefix(text: str) -> str:
    """``203.0.113.10`` -> ``203.0.113.10/32``; a CIDR is normalised (host bits cleared)."""
    return str(ipaddress.ip_network(text, strict=False))


def kernel_routes(data: Any, protocol: str | None = None) -> dict[str, list[str]]:
    """``ip -j route show`` output -> {prefix: sorted gateways}; ``protocol`` (e.g. ``bgp``) filters.

    A route without a gateway (connected, local) maps to an empty list.
    """
    routes: dict[str, list[str]] = {}
    for route in _load(data) or []:
        if not isinstance(route, dict) or route.get("type") not in (None, "unicast"):
            continue
        if protocol and route.get("protocol") != protocol:
            continue
        dst = route.get("dst")
        if dst == "default":
            dst = "::/0" if ":" in str(route.get("gateway") or route.get("dev") or "") else "0.0.0.0/0"
        if not isinstance(dst, str):
            continue
        hops = set(routes.get(canonical_prefix(dst), []))
        if route.get("gateway"):
            hops.add(route["gateway"])
        for nh in route.get("nexthops") or []:
            if isinstance(nh, dict) and nh.get("gateway") and "dead" not in (nh.get("flags") or []):
                hops.add(nh["gateway"])
        routes[canonical_prefix(dst)] = sorted(hops, key=_addr_key)
    return routes


def kernel_next_hops(data: Any, prefix: str | None = None) -> set[str]:
    """The gateways of ``prefix`` in ``ip -j route show PREFIX`` output (all prefixes when None)."""
    routes = kernel_routes(data)
    if prefix is not None:
        return set(routes.get(canonical_prefix(prefix), []))
    return {hop for hops in routes.values() for hop in hops}


def zebra_routes(data: Any) -> dict[str, list[str]]:
    """FRR ``show ip route json`` -> {prefix: sorted next hops of the installed route, in the FIB}."""
    routes: dict[str, list[str]] = {}
    for prefix, entries in (_load(data) or {}).items():
        if not isinstance(entries, list):
            continue
        for entry in entries:
            if not isinstance(entry, dict) or not entry.get("installed", entry.get("selected")):
                continue
            hops = {nh["ip"] for nh in entry.get("nexthops") or []
                    if isinstance(nh, dict) and nh.get("ip") and nh.get("fib", nh.get("active"))}
            key = canonical_prefix(prefix)
            routes[key] = sorted(set(routes.get(key, [])) | hops, key=_addr_key)
    return routes


def bgp_paths(data: Any) -> list[dict[str, Any]]:
    """FRR ``show bgp ... PREFIX json`` -> [{next_hop, best, multipath, valid, peer, communities}]."""
    out = []
    for path in (_load(data) or {}).get("paths") or []:
        if not isinstance(path, dict):
            continue
        hops = [nh.get("ip") for nh in path.get("nexthops") or [] if isinstance(nh, dict) and nh.get("ip")]
        out.append({
            "next_hop": hops[0] if hops else None,
            "best": bool(path.get("bestpath", {}).get("overall")) if isinstance(path.get("bestpath"), dict)
            else bool(path.get("bestpath")),
            "multipath": bool(path.get("multipath")),
            "valid": bool(path.get("valid")),
            "peer": (path.get("peer") or {}).get("peerId"),
            "communities": (path.get("community") or {}).get("string", ""),
        })
    return out


def through(routes: dict[str, list[str]], next_hop: str) -> list[str]:
    """The prefixes of ``routes`` that have ``next_hop`` among their next hops, sorted."""
    want = ipaddress.ip_address(next_hop)
    return sorted((p for p, hops in routes.items() if any(ipaddress.ip_address(h) == want for h in hops)),
                  key=_net_key)


def _addr_key(text: str) -> tuple[int, int]:
    addr = ipaddress.ip_address(text)
    return addr.version, int(addr)


def _net_key(text: str) -> tuple[int, int, int]:
    net = ipaddress.ip_network(text)
    return net.version, int(net.network_address), net.prefixlen
