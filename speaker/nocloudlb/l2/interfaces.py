"""Which interfaces the layer-2 responders may use, read with pyroute2."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyroute2 import IPRoute

# MetalLB's default exclusions (its "announcedInterfacesToExclude" list).
EXCLUDED = re.compile(
    r"^(docker.*|cbr.*|dummy.*|virbr.*|lxcbr.*|veth.*|lo|cali.*|tunl.*|flannel.*|kube-ipvs.*|cni.*|nodelocaldns.*)$"
)
ARPHRD_ETHER = 1
IFF_UP = 0x1
IFF_BROADCAST = 0x2
IFF_LOOPBACK = 0x8


@dataclass
class Interface:
    name: str
    index: int
    mac: str
    up: bool
    ipv4: list[str] = field(default_factory=list)
    ipv6: list[str] = field(default_factory=list)  # link-local first


def interfaces(with_addresses: bool = True) -> dict[str, Interface]:
    """Every Ethernet-type, broadcast-capable, non-loopback interface (with its addresses unless told not to:
    the address dump includes every VIP on lo, thousands on a busy node)."""
    out: dict[str, Interface] = {}
    with IPRoute() as ipr:
        for link in ipr.get_links():
            flags = link["flags"]
            if link["ifi_type"] != ARPHRD_ETHER or flags & IFF_LOOPBACK or not flags & IFF_BROADCAST:
                continue
            name = link.get("ifname")
            out[name] = Interface(name, link["index"], link.get("address") or "", bool(flags & IFF_UP))
        if not with_addresses:
            return out
        by_index = {i.index: i for i in out.values()}
        for addr in ipr.get_addr():
            iface = by_index.get(addr["index"])
            if iface is None:
                continue
            ip = addr.get("IFA_ADDRESS")
            if addr["family"] == 2:
                iface.ipv4.append(addr.get("IFA_LOCAL") or ip)
            elif ip:
                (iface.ipv6.insert(0, ip) if ip.startswith("fe80:") else iface.ipv6.append(ip))
    return out


def eligible_interfaces() -> list[str]:
    """Names of interfaces that are up, Ethernet, and not excluded by MetalLB's default list."""
    return sorted(name for name, i in interfaces(with_addresses=False).items() if i.up and not EXCLUDED.match(name))
