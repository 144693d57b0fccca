"""Supervision of the responder child (responder.py): start it and replay the whole state to it,
ping it every RESPONDER_PING s, replace it when it exits or hangs, and take in its reports (the
frames of addresses under check, its counters, the requests it refused for want of a lease).

Part of the announcer (announcer.py), run on its event loop thread with its lock held. Until a
child has the whole state (its pong after the replay), the announcer answers itself: ``fallback``
is True and its sockets take ARP/NDP (answering.py); otherwise they only send.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .bpf import ARP_NDP_PROGRAM, DROP_ALL, attach_filter
from .leasegate import LeaseGate
from .links import Links
from .poller import Poller
from .tables import Iface
from .vips import VipTable

RESPONDER_PING = 0.5  # seconds between pings of the responder child
RESPONDER_TIMEOUT = 2.0  # a ping unanswered this long: the child is hung, replace it
RESPONDER_START = 20.0  # a child not ready this long after its start: replace it
RESPONDER = object()  # poller key data of the child's stdout


class ResponderSupervisor:
    """The child's life (up, restarts, recent exits) and whether this thread answers in its place."""

    def __init__(self, log: logging.Logger, metrics: Any, resp: Any, poller: Poller, links: Links,
                 table: VipTable, lease: LeaseGate, counts: dict[str, Counter],
                 on_frame: Callable[[Iface, bytes], None]) -> None:
        self.log = log
        self.metrics = metrics
        self.resp = resp  # the ResponderClient
        self.poller = poller
        self.links = links
        self.table = table
        self.lease = lease
        self.counts = counts
        self.on_frame = on_frame  # a frame the child reports (an address under check): answering.py
        self.up = False
        self.fallback = True  # this thread answers until a child has the whole state
        self.restarts = 0
        self._quick = 0
        self.exits: deque = deque(maxlen=5)
        self._next_spawn = 0.0
        self._seq = 0
        self._synced_at = 0  # ping sequence that marks the end of a replay
        self._ping_sent: tuple[int, float] | None = None  # (sequence, sent at) of the ping in flight
        self._pong = 0.0  # when the last one was answered
        self._last_pass = 0.0
        self.stats: dict = {}

    def spawn(self, now: float) -> None:
        """Start a responder child and replay the whole state to it (it becomes ``up`` at the pong)."""
        try:
            self.resp.spawn()
        except OSError as exc:
            self.log.error("responderSpawnFailed", extra={"event": "responderSpawnFailed", "error": str(exc)})
            self._next_spawn = now + 1.0
            return
        self.poller.register(self.resp.fileno(), RESPONDER)
        for name, iface in self.links.ifaces.items():
            self.resp.send(f"I {name} {iface.index} {iface.mac.hex()}")
            for ip in iface.answer:
                self.resp.send(f"A {name} {ip.hex()}")
        for ip in self.table.checking:
            self.resp.send(f"W {ip.hex()}")
        self._ping(now)
        self._synced_at = self._seq

    def stop(self) -> None:
        self.resp.kill()
        self.up = False
        self.metrics.responder_up.set(0)

    def _ping(self, now: float) -> None:
        self._seq += 1
        self._ping_sent = (self._seq, now)
        self.resp.send(f"P {self._seq}")

    def supervise(self, now: float) -> float:
        """Restart a dead child, ping a live one, replace a hung one; the longest the loop may sleep."""
        gap, self._last_pass = now - self._last_pass, now
        if self.resp.proc is None:
            if now >= self._next_spawn:
                self.spawn(now)
            else:
                return self._next_spawn - now
        self.resp.flush()
        limit = RESPONDER_TIMEOUT if self.resp.ready else RESPONDER_START  # Python's start-up is slow under load
        if self._ping_sent is None:
            if now - self._pong < RESPONDER_PING:
                return min(RESPONDER_PING - (now - self._pong), 0.01 if self.resp.out else RESPONDER_PING)
            self._ping(now)
        elif gap > RESPONDER_TIMEOUT / 2:
            self._ping_sent = (self._ping_sent[0], now)  # this loop itself stood still (host frozen): no verdict
        elif now - self._ping_sent[1] > limit:
            self.down("hung" if self.resp.ready else "noStart", now)
            return 0.0
        wait = max(0.0, self._ping_sent[1] + limit - now) if self._ping_sent else RESPONDER_PING
        return min(wait, 0.01 if self.resp.out else RESPONDER_PING)

    def read(self) -> None:
        """The child's stdout is readable: take in its reports; it exited when there is nothing more."""
        if not self.resp.read(self.on_message):
            self.down("exited", time.monotonic())

    def on_message(self, doc: dict) -> None:
        if "f" in doc:
            iface = self.links.ifaces.get(doc["f"])
            if iface is not None:
                self.on_frame(iface, bytes.fromhex(doc["x"]))
        elif "p" in doc:
            if self._ping_sent is not None and doc["p"] == self._ping_sent[0]:
                self._ping_sent = None
                self._pong = time.monotonic()
                if doc["p"] >= self._synced_at and not self.up:
                    self.up = True
                    self.set_fallback(False)
                    self.metrics.responder_up.set(1)
                    self.log.info("responderUp", extra={"event": "responderUp", "pid": self.resp.pid})
        elif "n" in doc:
            for ip, (received, sent) in doc["n"].items():
                self.counts["requests_received"][ip] += received
                self.counts["responses_sent"][ip] += sent
                self.metrics.requests_received.labels(ip).inc(received)
                self.metrics.responses_sent.labels(ip).inc(sent)
            self.stats = doc.get("s", self.stats)
            if doc.get("lx"):
                refused = next((ip for ip, (received, sent) in doc["n"].items() if received > sent), "")
                self.lease.refuse(refused, int(doc["lx"]))
        elif "error" in doc:
            self.log.warning("responderError", extra={"event": "responderError", "error": doc["error"]})

    def down(self, reason: str, now: float) -> None:
        """The child exited or hung: answer here at once, then start another one."""
        if self.resp.proc is None:
            return
        self.poller.unregister(self.resp.fileno())
        quick = not self.resp.ready or now - self.resp.started < 1.0
        rc = self.resp.kill()
        self.set_fallback(True)
        self.up = False
        self._ping_sent = None
        self.metrics.responder_up.set(0)
        self.metrics.responder_restarts.inc()
        self.restarts += 1
        self.exits.append({"at": datetime.now(UTC).isoformat(timespec="milliseconds"), "reason": reason,
                           "returncode": rc})
        self.log.error("responderDown", extra={"event": "responderDown", "reason": reason, "returncode": rc,
                                               "restarts": self.restarts})
        self._quick = self._quick + 1 if quick else 0  # dying at start again and again: back off
        self._next_spawn = now + (min(5.0, 0.1 * 2 ** self._quick) if self._quick > 1 else 0.0)
        if self._next_spawn <= now:
            self.spawn(now)

    def set_fallback(self, on: bool) -> None:
        """This thread answers (its sockets take ARP/NDP) or only sends (drop-all filter)."""
        self.fallback = on
        for iface in self.links.ifaces.values():
            try:
                attach_filter(iface.sock, ARP_NDP_PROGRAM if on else DROP_ALL)
            except OSError as exc:
                self.log.warning("filterFailed", extra={"event": "filterFailed", "iface": iface.name,
                                                        "error": str(exc)})

    def status(self) -> dict:
        return {"up": self.up, "pid": self.resp.pid, "restarts": self.restarts,
                "answeringInDaemon": self.fallback, "exits": list(self.exits),
                "lease": self.lease.status(),
                **{k: v for k, v in self.stats.items() if k != "pid"}}
