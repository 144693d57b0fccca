"""What the announcer does with an ARP or NDP frame: answer it while no responder child has the
whole state (its sockets take ARP/NDP only then), and, always, watch for other MACs: an answer
for an address under check is a conflict (or a member handing over, waited out), an announcement
by another MAC of an address this node answers is a contest for the daemon's wire rule, or, from the
member an address is being handed off to, the end of that hand-off (vips.py).

Part of the announcer (announcer.py), run on its event loop thread with its lock held. Frames come
from this thread's own sockets (``receive``) or from the responder's reports (supervisor.py).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from . import arp, ndp
from .leasegate import LeaseGate
from .links import Links
from .tables import Iface, Vip
from .vips import VipTable


class Answerer:
    """Answers (in the responder's place) and notices conflicts and contests."""

    def __init__(self, log: logging.Logger, metrics: Any, lock: threading.RLock, links: Links, table: VipTable,
                 lease: LeaseGate, counts: dict[str, Counter], *, fallback: Callable[[], bool],
                 is_peer_mac: Callable[[bytes], bool] | None) -> None:
        self.log = log
        self.metrics = metrics
        self.lock = lock
        self.links = links
        self.table = table
        self.lease = lease
        self.counts = counts
        self.fallback = fallback  # no responder child has the state: this thread answers
        # A cluster member answering during a handover is not a conflict: the daemon says who is one.
        self.is_peer_mac = is_peer_mac
        # Another MAC announcing (gratuitous ARP, unsolicited NA) an address this node answers: given to the
        # daemon's wire rule (l2/disagree.py) as (ip, mac).
        self.on_contest: Callable[[str, bytes], None] | None = None
        self.claims_seen = 0

    def receive(self, iface: Iface) -> None:
        for _dummy in range(256):
            try:
                data = iface.sock.recv(65535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # interface went away: rescan soon
                self.log.warning("receiveFailed", extra={"event": "receiveFailed", "iface": iface.name,
                                                         "error": str(exc)})
                self.links.rescan_now = True
                return
            self.on_frame(iface, data)

    def on_frame(self, iface: Iface, data: bytes) -> None:
        if data[12:14] == b"\x08\x06":
            self.on_arp(iface, data)
        else:
            self.on_nd(iface, data)

    def _answer(self, iface: Iface, ip: str, reply: Callable[[], bytes]) -> None:
        self.counts["requests_received"][ip] += 1
        self.metrics.requests_received.labels(ip).inc()
        if not self.lease.valid():
            self.lease.refuse(ip)
        elif self.links.send(iface, reply()):
            self.counts["responses_sent"][ip] += 1
            self.metrics.responses_sent.labels(ip).inc()

    def on_arp(self, iface: Iface, data: bytes) -> None:
        pkt = arp.parse(data)
        if pkt is None or pkt.sha == iface.mac or pkt.eth_src == iface.mac:
            return
        if pkt.op == arp.OP_REQUEST and pkt.tpa in iface.answer and pkt.spa != pkt.tpa:
            if self.fallback():
                self._answer(iface, pkt.target_ip, lambda: arp.reply_to(pkt, iface.mac))
            return
        # Another MAC using an address we are checking as its sender address (RFC 5227 2.1.1):
        # an answer to our probe, an announcement, or its own requests.
        vip = self.table.checking.get(pkt.spa)
        if vip is not None:
            self._saw_conflict(vip, pkt.sha, iface.name)
        elif pkt.spa == pkt.tpa and pkt.spa in iface.answer:  # another MAC announces an address we answer
            self._saw_claim(pkt.spa, pkt.sha)

    def on_nd(self, iface: Iface, data: bytes) -> None:
        pkt = ndp.parse(data)
        if pkt is None or pkt.eth_src == iface.mac:
            return
        if pkt.type == ndp.NS:
            if pkt.target in iface.answer:
                if pkt.src == ndp.UNSPECIFIED and pkt.dst != ndp.solicited_node(pkt.target):
                    return  # RFC 4861 7.1.1: DAD NS must go to the solicited-node group
                if self.fallback():
                    self._answer(iface, pkt.target_ip, lambda: ndp.reply_to(pkt, iface.mac))
            return
        vip = self.table.checking.get(pkt.target)
        if vip is not None:
            self._saw_conflict(vip, pkt.lladdr or pkt.eth_src, iface.name)
        elif pkt.type == ndp.NA and pkt.target in iface.answer:  # another MAC announces an address we answer
            self._saw_claim(pkt.target, pkt.lladdr or pkt.eth_src)

    def _saw_claim(self, packed: bytes, mac: bytes) -> None:
        if self.links.own_mac(mac):
            return
        ip = socket.inet_ntop(socket.AF_INET if len(packed) == 4 else socket.AF_INET6, packed)
        if self.table.claimed(ip, packed, mac):
            return  # the member it was handed off to announced it: not a contest
        self.claims_seen += 1
        if self.on_contest is not None:
            self.on_contest(ip, mac)

    def _saw_conflict(self, vip: Vip, mac: bytes, iface: str) -> None:
        if self.links.own_mac(mac):
            return
        if self.is_peer_mac is not None and self.is_peer_mac(mac):
            self.log.debug("memberAnswered", extra={"event": "memberAnswered", "ip": vip.ip, "iface": iface,
                                                    "mac": arp.mac_str(mac)})
            with self.lock:
                if vip.state == "checking":
                    vip.member_answered = True  # it hands over once it hears this node: wait for its silence
            return
        with self.lock:
            if vip.state == "checking" and vip.conflict is None:
                vip.conflict = {"ip": vip.ip, "mac": arp.mac_str(mac), "iface": iface,
                                "at": datetime.now(UTC).isoformat(timespec="milliseconds")}
