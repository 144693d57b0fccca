"""The heartbeat's sockets: one UDP port read through two sockets of a reuseport group, a classic
BPF program steering the routine datagrams to one and the news to the other (heartbeat.py's module
docstring says why), and each datagram read with its arrival time (SO_TIMESTAMPNS)."""

from __future__ import annotations

import ctypes
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterator

from .heartbeat_wire import MAX_PACKET

_TIMESPEC = struct.Struct("@qq")
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux: each datagram's arrival time (timespec)
SO_ATTACH_REUSEPORT_CBPF = getattr(socket, "SO_ATTACH_REUSEPORT_CBPF", 51)

# The reuseport group's program (classic BPF, offsets from the UDP payload): socket 0 (routine) for a
# datagram with flags 0 and an empty missing list, socket 1 (news) for any other (a datagram too short
# to read ends the program with 0: routine, and decode refuses it there).
_STEER = [
    (0x30, 0, 0, 4),    # ldb [4]          flags
    (0x15, 0, 8, 0),    # jeq #0, next, news
    (0x30, 0, 0, 5),    # ldb [5]          sender length
    (0x07, 0, 0, 0),    # tax
    (0x50, 0, 0, 6),    # ldb [x + 6]      recipient length
    (0x0C, 0, 0, 0),    # add x
    (0x07, 0, 0, 0),    # tax
    (0x50, 0, 0, 31),   # ldb [x + 31]     missing count (6 + s + 1 + r + 24)
    (0x15, 0, 1, 0),    # jeq #0, routine, news
    (0x06, 0, 0, 0),    # ret #0           routine
    (0x06, 0, 0, 1),    # ret #1           news
]


class Sockets:
    """The routine socket (``sock``: it sends too, and gets every datagram without the split) and the
    news socket (``news``, or None), bound to ``bind_ip`` and ``port``."""

    def __init__(self, bind_ip: str, port: int, log: logging.Logger) -> None:
        self.bind_ip = bind_ip
        self.port = port
        self.log = log
        self.sock: socket.socket | None = None  # sends; receives the routine datagrams (all without the split)
        self.news: socket.socket | None = None  # receives the others (see the module docstring), or None
        self.stamped = False  # arrival times from the kernel (SO_TIMESTAMPNS)

    def open(self) -> None:
        try:
            self.sock = self.open_one(reuseport=True)
        except OSError:
            self.sock = self.open_one(reuseport=False)  # as before: every datagram read at once
        else:
            self.news = self.split() if self.stamped else None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        if self.news is not None:
            self.news.close()

    def open_one(self, reuseport: bool) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.bind_ip else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuseport:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0xC0)  # network control, like BFD
            except OSError:
                pass
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                self.stamped = True
            except OSError:
                self.stamped = False
            sock.bind((self.bind_ip, self.port))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def split(self) -> socket.socket | None:
        """The news socket, joined to the main one's reuseport group with the steering program; None when
        the kernel refuses (then the main socket gets every datagram and is read at once)."""
        assert self.sock is not None
        prog = b"".join(struct.pack("HBBI", *ins) for ins in _STEER)
        buf = ctypes.create_string_buffer(prog)
        fprog = struct.pack("HL", len(_STEER), ctypes.addressof(buf))
        news = None
        try:
            news = self.open_one(reuseport=True)
            self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)
        except OSError as exc:
            if news is not None:
                news.close()
            self.log.debug("heartbeat: one socket, read at once (%s)", exc)
            return None
        return news

    def datagrams(self, routine: bool, news: bool, clock: Callable[[], float],
                  oldest: float) -> Iterator[tuple[bytes, float]]:
        """Each datagram waiting on the news socket (``news``), then on the routine one (``routine``),
        until they are empty, with its arrival time on ``clock``: the kernel's stamp, at most ``oldest``
        seconds ago (a realtime clock step counts as now). Read one at a time, as the caller takes them."""
        socks = [self.news] if self.news is not None and news else []
        if routine and self.sock is not None:
            socks.append(self.sock)
        for sock in socks:
            while True:
                try:
                    data, anc, _flags, _src = sock.recvmsg(MAX_PACKET + 1, 64)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                now = clock()
                for level, kind, raw in anc:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                        sec, nsec = _TIMESPEC.unpack_from(raw)
                        # the arrival time: at most a timeout/2 ago (a realtime clock step counts as now)
                        age = min(max(time.time() - (sec + nsec / 1e9), 0.0), oldest)
                        now -= age
                        break
                yield data, now
