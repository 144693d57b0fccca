"""The quorum's witness: an address on the announce segment (the gateway, say) pinged by this node.

``memberlist.witness`` adds one vote to the cluster's total (nocloudlb.core.quorum), and this node
holds that vote while the witness answers its ICMP echo requests: a two-node cluster then keeps
quorum when one node crashes (the survivor and the witness are two votes of three), yet a node
cut from both its peer and the witness takes nothing.

One thread sends an echo request every ``period`` and reads the replies; ``up()`` is True while
the last reply is at most ``window`` old. The socket is an unprivileged ICMP datagram socket
where ``net.ipv4.ping_group_range`` allows it, a raw one otherwise (the unit has CAP_NET_RAW).
``on_change()`` is called when ``up()`` changes (the heartbeat re-evaluates its quorum then).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

from .logs import event

ECHO4, REPLY4 = 8, 0
ECHO6, REPLY6 = 128, 129


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


class Witness:
    def __init__(self, address: str, period: float, window: float, on_change: Callable[[], None] = lambda: None,
                 logger: logging.Logger | None = None) -> None:
        self.address = str(ipaddress.ip_address(address))
        self.v6 = ":" in self.address
        self.period = max(0.01, float(period))
        self.window = max(self.period * 2, float(window))
        self.on_change = on_change
        self.log = logger or logging.getLogger("nocloudlb.witness")
        self.ident = os.getpid() & 0xFFFF
        self.raw = False
        self.sent = 0
        self.answered = 0
        self._last_reply = -1e9
        self._was_up = False
        self._seq = 0
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def _open(self) -> socket.socket:
        family = socket.AF_INET6 if self.v6 else socket.AF_INET
        proto = socket.IPPROTO_ICMPV6 if self.v6 else socket.IPPROTO_ICMP
        try:
            sock = socket.socket(family, socket.SOCK_DGRAM, proto)
        except OSError:
            sock = socket.socket(family, socket.SOCK_RAW, proto)
            self.raw = True
        sock.setblocking(False)
        return sock

    def start(self) -> None:
        self._sock = self._open()
        self._thread = threading.Thread(target=self._run, name="witness", daemon=True)
        self._thread.start()
        event(self.log, "witnessStarted", address=self.address, periodMs=round(self.period * 1000),
              windowMs=round(self.window * 1000))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close()

    def up(self) -> bool:
        return time.monotonic() - self._last_reply <= self.window

    def status(self) -> dict:
        age = time.monotonic() - self._last_reply
        return {"address": self.address, "up": self.up(), "lastReplyMsAgo": round(age * 1000) if age < 1e8 else None,
                "sent": self.sent, "answered": self.answered}

    def _request(self) -> bytes:
        self._seq = (self._seq + 1) & 0xFFFF
        kind = ECHO6 if self.v6 else ECHO4
        payload = b"nocloudlb witness"
        head = struct.pack("!BBHHH", kind, 0, 0, self.ident, self._seq)
        if self.v6:
            return head + payload  # the kernel fills in the ICMPv6 checksum
        return struct.pack("!BBHHH", kind, 0, _checksum(head + payload), self.ident, self._seq) + payload

    def _is_reply(self, data: bytes) -> bool:
        if self.raw and not self.v6:
            data = data[(data[0] & 0x0F) * 4:] if data else data  # a raw IPv4 socket reads the IP header too
        if len(data) < 8:
            return False
        kind, _code, _sum, ident, _seq = struct.unpack_from("!BBHHH", data)
        if kind != (REPLY6 if self.v6 else REPLY4):
            return False
        return not self.raw or ident == self.ident  # a datagram socket sees only its own replies

    def _run(self) -> None:
        assert self._sock is not None
        next_send = time.monotonic()
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if now >= next_send:
                    try:
                        self._sock.sendto(self._request(), (self.address, 0))
                        self.sent += 1
                    except OSError:
                        pass  # no route (link down): no answer, so no vote
                    next_send = now + self.period
                until = next_send
                if self.up():  # wake when the vote would lapse, to report it at once
                    until = min(until, self._last_reply + self.window)
                ready = select.select([self._sock], [], [], max(0.0, until - time.monotonic()) + 0.001)[0]
                while ready:
                    try:
                        data, src = self._sock.recvfrom(2048)
                    except (BlockingIOError, InterruptedError):
                        break
                    if src[0] == self.address and self._is_reply(data):
                        self._last_reply = time.monotonic()
                        self.answered += 1
                up = self.up()
                if up != self._was_up:
                    self._was_up = up
                    event(self.log, "witnessUp" if up else "witnessDown", address=self.address,
                          level=logging.INFO if up else logging.WARNING)
                    self.on_change()
            except Exception:  # noqa: BLE001 - the witness outlives any one error (no answer: no vote)
                self.log.exception("witness loop error")
                self._stop.wait(self.period)
