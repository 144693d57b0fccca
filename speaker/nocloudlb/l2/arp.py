"""ARP frames (RFC 826, RFC 5227) built and parsed with struct; Ethernet II, padded to 60 bytes."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

ETH_MIN = 60  # minimum Ethernet frame without FCS
BROADCAST = b"\xff" * 6
ZERO_MAC = b"\x00" * 6
ZERO_IP = b"\x00" * 4
OP_REQUEST = 1
OP_REPLY = 2
_ETH = struct.Struct("!6s6sH")
_ARP = struct.Struct("!HHBBH6s4s6s4s")


def pad(frame: bytes) -> bytes:
    """Pad a frame to the Ethernet minimum (60 bytes before the FCS the NIC adds)."""
    return frame if len(frame) >= ETH_MIN else frame + b"\x00" * (ETH_MIN - len(frame))


def mac_bytes(mac: str) -> bytes:
    b = bytes.fromhex(mac.replace(":", "").replace("-", ""))
    if len(b) != 6:
        raise ValueError(f"not a MAC address: {mac!r}")
    return b


def mac_str(mac: bytes) -> str:
    return ":".join(f"{x:02x}" for x in mac)


def frame(eth_dst: bytes, eth_src: bytes, op: int, sha: bytes, spa: bytes, tha: bytes, tpa: bytes) -> bytes:
    return pad(_ETH.pack(eth_dst, eth_src, 0x0806) + _ARP.pack(1, 0x0800, 6, 4, op, sha, spa, tha, tpa))


@dataclass(frozen=True)
class ArpPacket:
    eth_src: bytes
    eth_dst: bytes
    op: int
    sha: bytes
    spa: bytes  # 4 bytes
    tha: bytes
    tpa: bytes  # 4 bytes

    @property
    def sender_ip(self) -> str:
        return str(ipaddress.IPv4Address(self.spa))

    @property
    def target_ip(self) -> str:
        return str(ipaddress.IPv4Address(self.tpa))


def parse(data: bytes) -> ArpPacket | None:
    """Parse an Ethernet/ARP frame for IPv4 over Ethernet; None for anything else."""
    if len(data) < 42:
        return None
    dst, src, ethertype = _ETH.unpack_from(data)
    if ethertype != 0x0806:
        return None
    htype, ptype, hlen, plen, op, sha, spa, tha, tpa = _ARP.unpack_from(data, 14)
    if htype != 1 or ptype != 0x0800 or hlen != 6 or plen != 4:
        return None
    return ArpPacket(src, dst, op, sha, spa, tha, tpa)


def reply_to(req: ArpPacket, mac: bytes) -> bytes:
    """Reply to ``req`` saying its target address is at ``mac`` (unicast to the asker).

    A probe (sender address 0.0.0.0, RFC 5227) gets the same unicast reply, which is
    how another node's conflict check sees that the address is taken.
    """
    return frame(req.sha, mac, OP_REPLY, mac, req.tpa, req.sha, req.spa)


def gratuitous(mac: bytes, ip: bytes) -> tuple[bytes, bytes]:
    """Gratuitous ARP in both forms, broadcast, sender = target = ``ip``: (request, reply).

    The request form is RFC 5227's ARP Announcement (target hardware address zero);
    the reply form carries the broadcast address as target hardware address, as
    MetalLB sends it. Some hosts update their caches only from one of the forms.
    """
    return (
        frame(BROADCAST, mac, OP_REQUEST, mac, ip, ZERO_MAC, ip),
        frame(BROADCAST, mac, OP_REPLY, mac, ip, BROADCAST, ip),
    )


def probe(mac: bytes, ip: bytes, sender_ip: bytes = ZERO_IP) -> bytes:
    """ARP request for ``ip``: an RFC 5227 probe when ``sender_ip`` is 0.0.0.0 (the default)."""
    return frame(BROADCAST, mac, OP_REQUEST, mac, sender_ip, ZERO_MAC, ip)
