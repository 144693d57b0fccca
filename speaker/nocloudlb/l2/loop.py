"""The announcer's event loop: one thread that waits on the poller (raw sockets, the responder
child's stdout, the wake pipe) until the next timer, token or ping is due, then, with the
announcer's lock held, hands each readable source to its part and runs the timers
(lifecycle.py), the transmit queues (pacing.py) and a due interface scan (links.py).

It only schedules: what a frame, a timer or a report means is decided by the parts. Started and
stopped by ``L2Announcer.start``/``stop``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .answering import Answerer
from .lifecycle import Lifecycle
from .links import Links
from .pacing import Pacer
from .poller import Poller
from .supervisor import RESPONDER, ResponderSupervisor


class EventLoop:
    """The loop thread of one announcer; ``thread`` is None while stopped."""

    def __init__(self, name: str, log: logging.Logger, lock: threading.RLock, poller: Poller, resp: Any,
                 links: Links, lifecycle: Lifecycle, pacer: Pacer, answerer: Answerer,
                 responder: ResponderSupervisor) -> None:
        self.name = name
        self.log = log
        self.lock = lock
        self.poller = poller
        self.resp = resp
        self.links = links
        self.lifecycle = lifecycle
        self.pacer = pacer
        self.answerer = answerer
        self.responder = responder
        self.thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        """Start the thread (the lock held, the poller open)."""
        self._stopping.clear()
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()

    def stop(self) -> bool:
        """Stop the thread and wait for it (at most 10 s); False when it was not running."""
        thread = self.thread
        if thread is None:
            return False
        self._stopping.set()
        self.wake()
        thread.join(timeout=10)
        return True

    def rescan(self) -> None:
        """Re-read interfaces; open/close sockets; re-resolve every VIP's interfaces (the lock held)."""
        if self.links.scan():
            self.lifecycle.reresolve(time.monotonic())
            self.links.next_rescan = time.monotonic() + self.links.rescan_interval

    def wake(self) -> None:
        self.resp.flush()  # the deltas of the change that woke us, in one write
        self.poller.wake()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._loop_once()
            except Exception:  # noqa: BLE001 - the responder must survive anything a frame does
                self.log.exception("l2LoopError", extra={"event": "l2LoopError"})
                time.sleep(0.05)

    def _loop_once(self) -> None:
        now = time.monotonic()
        timeout = max(0.0, min(self.links.next_rescan - now, 1.0))
        with self.lock:
            due = self.lifecycle.next_due()
            if due is not None:
                timeout = min(timeout, max(0.0, due - now))
            timeout = self.pacer.wait(timeout, now)
            timeout = min(timeout, self.responder.supervise(now))
            sel = self.poller.sel
        if sel is None:
            return
        events = sel.select(timeout)
        with self.lock:
            for key, _mask in events:
                if key.data is RESPONDER:
                    self.responder.read()
                elif key.data is None:
                    self.poller.drain()
                elif key.data.name in self.links.ifaces and self.links.ifaces[key.data.name] is key.data:
                    self.answerer.receive(key.data)
            self.lifecycle.run_timers()
            self.pacer.transmit()
            if self.links.rescan_now or time.monotonic() >= self.links.next_rescan:
                self.links.rescan_now = False
                self.rescan()
