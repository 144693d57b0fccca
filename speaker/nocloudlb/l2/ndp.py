"""IPv6 Neighbor Discovery frames (RFC 4861): NS and NA, built and parsed with struct."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from .arp import pad

ALL_NODES = ipaddress.IPv6Address("ff02::1").packed
ALL_NODES_MAC = b"\x33\x33\x00\x00\x00\x01"
UNSPECIFIED = b"\x00" * 16
NS, NA = 135, 136
FLAG_ROUTER, FLAG_SOLICITED, FLAG_OVERRIDE = 0x80000000, 0x40000000, 0x20000000
OPT_SLLA, OPT_TLLA = 1, 2
_SOLICITED_PREFIX = ipaddress.IPv6Address("ff02::1:ff00:0").packed[:13]
_ETH = struct.Struct("!6s6sH")
_IP6 = struct.Struct("!IHBB16s16s")


def solicited_node(ip: bytes) -> bytes:
    """Solicited-node multicast address ff02::1:ffXX:XXXX of a 16-byte IPv6 address."""
    return _SOLICITED_PREFIX + ip[13:]


def multicast_mac(group: bytes) -> bytes:
    """Ethernet address 33:33:xx:xx:xx:xx of an IPv6 multicast group."""
    return b"\x33\x33" + group[12:]


def checksum(src: bytes, dst: bytes, payload: bytes) -> int:
    """ICMPv6 checksum over the IPv6 pseudo-header and ``payload`` (checksum field zero)."""
    data = src + dst + struct.pack("!I3xB", len(payload), 58) + payload
    if len(data) % 2:
        data += b"\x00"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _frame(eth_dst: bytes, eth_src: bytes, src: bytes, dst: bytes, icmp: bytes) -> bytes:
    csum = checksum(src, dst, icmp)
    icmp = icmp[:2] + struct.pack("!H", csum) + icmp[4:]
    ip6 = _IP6.pack(0x60000000, len(icmp), 58, 255, src, dst)
    return pad(_ETH.pack(eth_dst, eth_src, 0x86DD) + ip6 + icmp)


def advertisement(eth_dst: bytes, mac: bytes, src: bytes, dst: bytes, target: bytes, flags: int) -> bytes:
    """Neighbor Advertisement for ``target`` at ``mac`` with the target link-layer address option."""
    icmp = struct.pack("!BBHI16sBB6s", NA, 0, 0, flags, target, OPT_TLLA, 1, mac)
    return _frame(eth_dst, mac, src, dst, icmp)


def unsolicited_na(mac: bytes, ip: bytes) -> bytes:
    """Unsolicited NA (override flag, all-nodes multicast), the IPv6 gratuitous ARP."""
    return advertisement(ALL_NODES_MAC, mac, ip, ALL_NODES, ip, FLAG_OVERRIDE)


def solicitation(mac: bytes, target: bytes, src: bytes = UNSPECIFIED) -> bytes:
    """NS for ``target`` to its solicited-node group.

    With the unspecified source (default) this is a DAD probe (RFC 4862 5.4.2: no source
    link-layer option); answers then go to all-nodes multicast.
    """
    opts = b"" if src == UNSPECIFIED else struct.pack("!BB6s", OPT_SLLA, 1, mac)
    icmp = struct.pack("!BBHI16s", NS, 0, 0, 0, target) + opts
    group = solicited_node(target)
    return _frame(multicast_mac(group), mac, src, group, icmp)


@dataclass(frozen=True)
class NdPacket:
    eth_src: bytes
    eth_dst: bytes
    src: bytes
    dst: bytes
    type: int  # NS or NA
    flags: int
    target: bytes
    lladdr: bytes | None  # SLLA of an NS, TLLA of an NA

    @property
    def target_ip(self) -> str:
        return str(ipaddress.IPv6Address(self.target))


def parse(data: bytes) -> NdPacket | None:
    """Parse an Ethernet/IPv6/ICMPv6 NS or NA with hop limit 255 (RFC 4861 validity); else None."""
    if len(data) < 14 + 40 + 24:
        return None
    dst_mac, src_mac, ethertype = _ETH.unpack_from(data)
    if ethertype != 0x86DD:
        return None
    vtf, plen, nh, hlim, src, dst = _IP6.unpack_from(data, 14)
    if vtf >> 28 != 6 or nh != 58 or hlim != 255 or plen < 24 or len(data) < 54 + plen:
        return None
    icmp = data[54 : 54 + plen]
    typ, code, _csum, flags, target = struct.unpack_from("!BBHI16s", icmp)
    if typ not in (NS, NA) or code != 0 or checksum(src, dst, icmp[:2] + b"\x00\x00" + icmp[4:]) != _csum:
        return None
    lladdr = None
    want = OPT_SLLA if typ == NS else OPT_TLLA
    off = 24
    while off + 2 <= len(icmp):
        otype, olen = icmp[off], icmp[off + 1]
        if olen == 0:
            return None  # RFC 4861 4.6: options of length zero make the packet invalid
        if otype == want and olen == 1 and off + 8 <= len(icmp):
            lladdr = icmp[off + 2 : off + 8]
        off += olen * 8
    return NdPacket(src_mac, dst_mac, src, dst, typ, flags if typ == NA else 0, target, lladdr)


def reply_to(ns: NdPacket, mac: bytes) -> bytes:
    """Solicited NA answering ``ns`` for its target (S+O flags, TLLA option).

    An NS from the unspecified address (someone's DAD) is answered to all-nodes without
    the S flag (RFC 4861 7.2.4); otherwise to the asker, at its SLLA or Ethernet source.
    """
    if ns.src == UNSPECIFIED:
        return advertisement(ALL_NODES_MAC, mac, ns.target, ALL_NODES, ns.target, FLAG_OVERRIDE)
    eth_dst = ns.lladdr or ns.eth_src
    return advertisement(eth_dst, mac, ns.target, ns.src, ns.target, FLAG_SOLICITED | FLAG_OVERRIDE)
