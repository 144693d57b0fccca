"""probe(): every MAC that answers ARP (IPv4) or NS (IPv6) for an address, with latency, like arping."""

from __future__ import annotations

import fcntl
import ipaddress
import select
import struct
import time

from . import arp, ndp
from .bpf import open_packet_socket
from .interfaces import Interface, eligible_interfaces, interfaces


class Prober:
    """One raw socket on one interface that asks who has an address and times the answers."""

    def __init__(self, iface: str, info: Interface | None = None) -> None:
        if info is None:
            all_ifaces = interfaces()
            if iface not in all_ifaces:
                raise ValueError(f"probe: no Ethernet interface named {iface!r} (have: {sorted(all_ifaces)})")
            info = all_ifaces[iface]
        self.iface = iface
        self.mac = arp.mac_bytes(info.mac)
        self.src4 = ipaddress.IPv4Address(info.ipv4[0]).packed if info.ipv4 else arp.ZERO_IP
        self.src6 = ipaddress.IPv6Address(info.ipv6[0]).packed if info.ipv6 else ndp.UNSPECIFIED
        self.sock = open_packet_socket(iface)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _stamp(self) -> int:
        try:
            sec, nsec = struct.unpack("@ql", fcntl.ioctl(self.sock.fileno(), _SIOCGSTAMPNS, bytes(16)))
            return sec * 1_000_000_000 + nsec
        except OSError:
            return time.time_ns()

    def request(self, ip: str) -> tuple[bytes, int]:
        """Send one ARP request / NS for ``ip``; returns (packed ip, send time in ns, wall clock)."""
        addr = ipaddress.ip_address(ip)
        if addr.version == 4:
            frame = arp.probe(self.mac, addr.packed, self.src4)
        else:
            frame = ndp.solicitation(self.mac, addr.packed, self.src6)
        sent = time.time_ns()
        self.sock.send(frame)
        return addr.packed, sent

    def answers(self, packed: bytes, sent: int, timeout: float, first_only: bool = False) -> list[dict]:
        """Collect answers for ``packed`` until ``timeout`` s after ``sent`` (or the first one).

        Latency is measured to the kernel's receive timestamp of each answer (SIOCGSTAMPNS),
        so time spent in Python after the frame arrived does not count.
        """
        found: dict[bytes, dict] = {}
        deadline = sent / 1e9 + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                break
            ready, _wr, _ex = select.select([self.sock], [], [], left)
            if not ready:
                break
            while True:
                try:
                    data = self.sock.recv(65535)
                except BlockingIOError:
                    break
                now = self._stamp()
                mac = _answer_mac(data, packed)
                if mac is None or mac == self.mac:
                    continue
                if mac in found:
                    found[mac]["replies"] += 1
                    continue
                found[mac] = {"mac": arp.mac_str(mac), "iface": self.iface,
                              "latency_ms": round((now - sent) / 1e6, 3), "replies": 1}
            if first_only and found:
                break
        return sorted(found.values(), key=lambda a: a["latency_ms"])


_SIOCGSTAMPNS = 0x8907


def _answer_mac(data: bytes, packed: bytes) -> bytes | None:
    if len(packed) == 4:
        pkt = arp.parse(data)
        if pkt is not None and pkt.op == arp.OP_REPLY and pkt.spa == packed:
            return pkt.sha
        return None
    nd = ndp.parse(data)
    if nd is not None and nd.type == ndp.NA and nd.target == packed:
        return nd.lladdr or nd.eth_src
    return None


def probe(ip: str, iface: str | None = None, timeout: float = 1.0) -> list[dict]:
    """Ask who has ``ip`` on ``iface`` (None: every eligible interface) and wait ``timeout`` s.

    Returns one entry per answering (interface, MAC): ``{"ip", "iface", "mac",
    "latency_ms", "replies"}``, fastest first. More than one MAC means a conflict.
    """
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        raise ValueError(f"probe: {ip!r} is not an IP address") from None
    if timeout <= 0:
        raise ValueError(f"probe: timeout must be > 0, got {timeout!r}")
    info = interfaces()
    names = [iface] if iface else eligible_interfaces()
    if not names:
        raise ValueError("probe: no eligible interface to probe on; name one with iface")
    probers = [Prober(n, info.get(n)) for n in names]
    try:
        pending = [(p, *p.request(str(addr))) for p in probers]
        out: list[dict] = []
        for p, packed, sent in pending:
            # All requests went out first; each interface's answers are collected until its deadline.
            out.extend(p.answers(packed, sent, timeout))
        for entry in out:
            entry["ip"] = str(addr)
        return sorted(out, key=lambda a: a["latency_ms"])
    finally:
        for p in probers:
            p.close()
