"""Which interfaces the layer-2 responders may use, read with pyroute2.

Some interfaces must never announce, whatever the L2Advertisement says (issue 8, defect 3):

- an interface with a master: a bridge port or a bond slave (MetalLB skips these too). A
  gratuitous ARP out of an active-backup bond's backup slave black-holes the host; the
  master (the bridge, the bond) is the interface that announces;
- a tap (a ``tun``-kind link in tap mode): the other end is a VM or a program, not a segment;
- an interface with NOARP: it speaks no ARP, so answers on it are wrong by definition.

Such interfaces are listed with a ``skip`` reason and ``announceable`` False. VLAN-tagged
requests on an untagged parent are dropped by the socket filter (``bpf.py``).

Loud where it was silent (issue 20 part 6): an interface an L2Advertisement names that is missing on
the node, down, enslaved (a bond slave named instead of the bond) or otherwise unusable was skipped
without a word. ``unusable`` says why for each name, for the status, the log and the metrics; the
announcer still announces on none of them (fail closed).
"""

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
IFF_NOARP = 0x80
IFF_SLAVE = 0x800  # a bond slave (also has IFLA_MASTER)
IFF_LOWER_UP = 0x10000  # the driver signals carrier (operationally up)


@dataclass
class Interface:
    name: str
    index: int
    mac: str
    up: bool
    ipv4: list[str] = field(default_factory=list)
    ipv6: list[str] = field(default_factory=list)  # link-local first
    skip: str = ""  # why this interface must never announce ("" = it may)
    carrier: bool = True  # IFF_LOWER_UP: a link that is up without carrier sends into nothing

    @property
    def announceable(self) -> bool:
        """Up, and not one of the interfaces that must never announce."""
        return self.up and not self.skip


def never_announce_reason(link) -> str:
    """Why ``link`` (a pyroute2 ifinfmsg) must never announce: "master <n>", "tap", "noarp" or ""."""
    flags = link["flags"]
    master = link.get("IFLA_MASTER") if hasattr(link, "get") else None
    if master or flags & IFF_SLAVE:
        return f"master {master}" if master else "bond slave"
    if flags & IFF_NOARP:
        return "noarp"
    kind = ""
    try:
        kind = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or ""
    except (AttributeError, KeyError, TypeError):
        kind = ""
    if kind == "tun":  # tun devices of ARPHRD_ETHER type are taps
        return "tap"
    return ""


def interfaces(with_addresses: bool = True, others: dict[str, str] | None = None) -> dict[str, Interface]:
    """Every Ethernet-type, broadcast-capable, non-loopback interface (with its addresses unless told not to:
    the address dump includes every VIP on lo, thousands on a busy node). ``others``, when given, is filled
    with the other links: name -> "loopback" or "notEthernet"."""
    out: dict[str, Interface] = {}
    with IPRoute() as ipr:
        links = list(ipr.get_links())
        names = {link["index"]: link.get("ifname") for link in links}
        for link in links:
            flags = link["flags"]
            name = link.get("ifname")
            if link["ifi_type"] != ARPHRD_ETHER or flags & IFF_LOOPBACK or not flags & IFF_BROADCAST:
                if others is not None and name:
                    others[name] = "loopback" if flags & IFF_LOOPBACK else "notEthernet"
                continue
            skip = never_announce_reason(link)
            master = link.get("IFLA_MASTER")
            if master and skip.startswith("master "):
                skip = f"master {names.get(master) or master}"
            out[name] = Interface(name, link["index"], link.get("address") or "", bool(flags & IFF_UP),
                                  skip=skip, carrier=bool(flags & IFF_LOWER_UP))
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
    """Names of interfaces that are up, Ethernet, not excluded by MetalLB's default list, and may announce."""
    return sorted(name for name, i in interfaces(with_addresses=False).items()
                  if i.announceable and not EXCLUDED.match(name))


# why an interface named by an L2Advertisement is not announced on (or only warned about: noCarrier)
UNUSABLE = {
    "missing": "no such interface on this node",
    "loopback": "the loopback interface: VIPs are held there, never announced",
    "notEthernet": "not an Ethernet interface with broadcast (no ARP/NDP on it)",
    "down": "the interface is down (ip link set up)",
    "enslaved": "a port of another interface (bond slave, bridge port): name the master instead",
    "tap": "a tap device: its other end is a program or a VM, not a segment",
    "noarp": "the interface has NOARP set",
    "noEligible": "no interface of this node may announce (every one down, excluded or enslaved)",
    "noCarrier": "up, but without carrier: announced on, and nothing goes out until the link comes back",
}


def unusable(name: str, info: dict[str, Interface], others: dict[str, str] | None = None) -> tuple[str, str]:
    """(reason, detail) why ``name`` cannot carry announcements ("", "" when it can); ``info`` as
    ``interfaces()`` returns it, ``others`` its other links. ``noCarrier`` is a warning: the interface is
    still announced on (carrier comes back without a rescan of the VIPs)."""
    i = info.get(name)
    if i is None:
        reason = (others or {}).get(name, "missing")
        return reason, UNUSABLE[reason]
    if i.skip.startswith("master ") or i.skip == "bond slave":
        return "enslaved", f"{UNUSABLE['enslaved']} ({i.skip})"
    if i.skip:
        return i.skip, UNUSABLE.get(i.skip, i.skip)
    if not i.up:
        return "down", UNUSABLE["down"]
    if not i.carrier:
        return "noCarrier", UNUSABLE["noCarrier"]
    return "", ""
