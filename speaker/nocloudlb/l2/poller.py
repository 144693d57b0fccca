"""The announcer's event-loop waiting point: one selector over the raw sockets, the responder
child's stdout and a wake pipe, so another thread can cut a wait short.

Opened by ``L2Announcer.start`` and closed by ``stop``; the parts that open sockets (links.py,
supervisor.py) register them here, and registering with a closed poller does nothing.
"""

from __future__ import annotations

import os
import selectors
from typing import Any


class Poller:
    """A selector plus a self-pipe; ``sel`` is None while closed."""

    def __init__(self) -> None:
        self.sel: selectors.DefaultSelector | None = None
        self._wake_r, self._wake_w = -1, -1

    def open(self) -> None:
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)

    def close(self) -> None:
        if self.sel is not None:
            self.sel.close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        self.sel = None

    def register(self, fileobj: Any, data: Any) -> None:
        if self.sel is not None:
            self.sel.register(fileobj, selectors.EVENT_READ, data)

    def unregister(self, fileobj: Any) -> None:
        if self.sel is not None:
            try:
                self.sel.unregister(fileobj)
            except (KeyError, ValueError):
                pass

    def wake(self) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass

    def drain(self) -> None:
        """Empty the wake pipe (its key's data is None)."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
