"""The ARP/NDP responder: its own process, so the daemon's work never sits in front of an answer.

Why a process: in the daemon, the responder thread shared the GIL and a select loop with the
election, config reloads, gossip callbacks and the gratuitous schedule; at 10,000 VIPs a
reload starved it for tens of milliseconds (p99 70 ms). Here one small loop does nothing but
answer, from prebuilt reply prefixes, and nothing else in its process holds the GIL.

    python -m nocloudlb.l2.responder        (started and supervised by the L2Announcer)

The announcer (the *client*, :class:`ResponderClient`) drives it over stdin with text lines
(deltas, so 10,000 VIPs cost nothing when nothing changes)::

    I name index mac         open an AF_PACKET socket on interface ``name`` (mac: 12 hex digits)
    C name                   close it
    A name ip                answer for ``ip`` (8 or 32 hex digits) on ``name``
    D name ip                stop answering
    T name ip frame...       take ``ip`` (a planned move): read what already waits on ``name``, send the frames
                             (hex: its gratuitous ARP in both forms, or its unsolicited NA), then answer it
    H name ip                hand ``ip`` off: answer it until another MAC announces it on ``name`` (a
                             gratuitous ARP, an unsolicited NA), then stop at once
    W ip / U ip              watch / unwatch ``ip`` for the conflict check
    P n                      ping: answered with {"p": n} after everything before it is applied

and reads JSON lines on stdout: ``{"ready": pid}`` at start, ``{"p": n}``, ``{"f": name, "x": hex}``
(a frame the conflict check watches: ARP from a watched sender address, NS/NA for a watched
target; and another MAC's announcement of an address answered here, which also ends its hand-off),
``{"n": {ip: [received, answered]}, "s": {...}}`` (counters, at most
every 0.1 s).

Why ``H``: in a planned move (a drain, an undrain, a member preempting) the node giving a VIP up
keeps answering until the node taking it announces (make before break). Ending it here, on the
frame itself, keeps the time both answer to how long this loop takes to read one frame; through
the daemon it would be a pipe, a thread and a decision pass later. Any other MAC's announcement
ends it, not only the taker's: whoever announces now, this node was giving the address up (the
taker may have died meanwhile and a third node taken over). The daemon ends it after a bound
anyway (``D``), when no announcement came.

Why ``T``: in a planned move the node giving the address up answers it until the taker's announcement
reaches it (``H``). A taker that answered before it announced would answer beside the giver for as long
as the announcement took to leave (its paced queue, a loop pass): two MACs for one request. With ``T``
the announcement leaves from here, and only then is the address answered: the requests read before the
send are left to the giver (which has not heard the announcement yet, so it answers them), the ones
read after it are answered here (the giver stops on the announcement). What remains is a request that
reaches both while the announcement crosses the wire, microseconds; such a request gets two answers,
never none.

Each interface's socket carries :func:`bpf.answer_program` for the addresses answered there and
the ones watched, so frames for anybody else stop in the kernel; the filter is re-attached
at once when an address it does not pass is added, and lazily (0.2 s) after removals. When the kernel
refuses that program (ENOMEM: larger than ``net.core.optmem_max`` allows, issue 21 defect 8), the port
falls back to the opcode/type filter (every ARP request, every NS/NA; the set lookups here do the rest),
reported once per interface (an ``error`` line) and in the stats (``filterFallback``, ``exact`` false):
many VIPs never make the responder fail to start.

The responder exits when its stdin closes, so it never outlives the daemon (kill -9 included):
an orphan answering for VIPs the cluster moved elsewhere would be a second owner.

The lease (lease.py). A daemon that is *frozen* (SIGSTOP of its PID, not of this child; a stall that
spares the child) keeps the pipe open, so stdin alone cannot tell. The daemon therefore hands the
child a shared memory page (a memfd named by ``NOCLOUDLB_LEASE_FD`` in its environment, inherited
with ``pass_fds``, mapped read-only here) holding a deadline on CLOCK_MONOTONIC, which its decision
loop renews while it waits (at least every third of the lease). The child answers a request only
while that deadline has not passed (an 8-byte load and a vDSO clock read per request: no system
call); after it, requests are refused and counted (``"lx"`` in the counters line, ``leaseRefused``
in the stats). So a frozen daemon's node falls silent within one lease (``fast``: 0.3 s, ``lan``:
1.2 s) while its peers, whose heartbeats stopped hearing it, take its VIPs. On thaw the daemon does
not renew at once: it first lets its heartbeat thread read what arrived during the freeze (two
heartbeat intervals) and reconciles from that, then renews (``lease.Renewal``,
``Speaker._next_event``), so the child never answers again from the view it had before the freeze.
Started without ``NOCLOUDLB_LEASE_FD`` (by hand, for debugging), it has no lease and answers while
it runs.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import ndp
from .bpf import ARP_NDP_PROGRAM, answer_program, attach_filter, detach_filter, open_packet_socket
from .lease import ENV as LEASE_ENV
from .lease import Lease

_ARP_HDR = b"\x00\x01\x08\x00\x06\x04"
_ARP_REQ = b"\x00\x01"
_ETH_ARP = b"\x08\x06"
_ETH_IP6 = b"\x86\xdd"
_PAD = b"\x00" * 18  # 42-byte ARP reply padded to 60
FLUSH_EVERY = 0.1
RCVBUF = 4 << 20  # a burst of requests waits in the socket instead of being dropped
REFILTER_AFTER = 0.2
CLAIM_EVERY = 0.05
OPTMEM_MAX = "/proc/sys/net/core/optmem_max"  # per network namespace since Linux 6.9


def _optmem_max() -> str:
    try:
        with open(OPTMEM_MAX) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


@dataclass(eq=False)
class _Port:
    name: str
    index: int
    mac: bytes
    sock: socket.socket
    arp_head: bytes  # reply bytes 6..32: our MAC, ARP reply header, our MAC again
    answer: set[bytes] = field(default_factory=set)
    handoff: set[bytes] = field(default_factory=set)  # addresses handed off: answered until another MAC announces
    passes: set[bytes] | None = None  # targets the attached filter passes in requests (None: every request)
    senders: set[bytes] | None = None  # senders it passes (the addresses watched by the conflict check)
    dirty: float = 0.0  # when a removal made the filter wider than needed
    program: tuple = ()
    rx: int = 0
    answered: int = 0
    fallback: str = ""  # why the exact filter could not be attached (the opcode/type one is, instead)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the (non-blocking) pipe ``fd``, waiting while it is full."""
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
            continue
        data = data[n:]


def open_port(name: str, index: int, mac: bytes) -> _Port:
    """``I``: the interface's socket, its receive buffer as large as allowed, and the reply prefix."""
    sock = open_packet_socket(name, ARP_NDP_PROGRAM)
    for opt in (33, socket.SO_RCVBUF):  # SO_RCVBUFFORCE (CAP_NET_ADMIN), else as far as rmem_max allows
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, RCVBUF)
            break
        except OSError:
            continue
    return _Port(name, index, mac, sock, mac + _ETH_ARP + _ARP_HDR[:6] + b"\x00\x02" + mac)


class Responder:
    """The process side; see the module docstring. Single-threaded."""

    def __init__(self, ctl_in: int = 0, ctl_out: int = 1, lease: Lease | None = None) -> None:
        self.ctl_in, self.ctl_out = ctl_in, ctl_out
        self.lease = lease  # None: answer while running (no daemon renews anything)
        self.refused = 0  # requests not answered because the lease had run out (since start)
        self.refused_new = 0  # ... since the last counters line
        self.ep = select.epoll()
        self.ports: dict[str, _Port] = {}
        self.by_fd: dict[int, _Port] = {}
        self.watch: set[bytes] = set()
        self.counts: dict[bytes, list[int]] = {}
        self.buf = b""
        self.reported = 0
        self.claims: dict[bytes, float] = {}  # address -> when another MAC's announcement of it was reported
        self.refilters = 0
        self.takes = 0  # addresses taken with ``T`` (announced, then answered)
        self.fallbacks_told: set[str] = set()  # interfaces whose filter fallback was reported (once each)
        self.last_flush = 0.0
        self.changed = False

    # -- control ----------------------------------------------------------------------------
    def emit(self, doc: dict) -> None:
        write_all(self.ctl_out, (json.dumps(doc, separators=(",", ":")) + "\n").encode())

    def control(self) -> bool:
        """Apply the lines waiting on stdin; False at end of input (the daemon is gone)."""
        try:
            data = os.read(self.ctl_in, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return True
        if not data:
            return False
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        grown: set[_Port] = set()
        for line in lines:
            try:
                self.command(line.decode().split(), grown)
            except Exception as exc:  # noqa: BLE001 - one bad line must not stop the answers
                self.emit({"error": f"{line[:80]!r}: {exc}"})
        for port in grown:  # an address the filter would drop: re-filter before the next frame
            self.refilter(port)
        return True

    def command(self, w: list[str], grown: set[_Port]) -> None:
        op = w[0]
        if op == "A":
            port, ip = self.ports[w[1]], bytes.fromhex(w[2])
            port.answer.add(ip)
            port.handoff.discard(ip)  # answered again (taken back before the hand-off ended)
            if port.passes is not None and ip not in port.passes:  # a watched address passes as a sender only
                grown.add(port)
        elif op == "D":
            gone = self.ports.get(w[1])
            if gone is not None:
                gone.handoff.discard(bytes.fromhex(w[2]))
            if gone is not None and bytes.fromhex(w[2]) in gone.answer:
                gone.answer.discard(bytes.fromhex(w[2]))
                gone.dirty = gone.dirty or time.monotonic()
        elif op == "T":
            self.take(self.ports[w[1]], bytes.fromhex(w[2]), [bytes.fromhex(x) for x in w[3:]])
        elif op == "H":
            port, ip = self.ports[w[1]], bytes.fromhex(w[2])
            if ip in port.answer:
                port.handoff.add(ip)
        elif op == "W":
            ip = bytes.fromhex(w[1])
            self.watch.add(ip)
            grown.update(p for p in self.ports.values() if p.senders is not None and ip not in p.senders)
        elif op == "U":
            self.watch.discard(bytes.fromhex(w[1]))
            for p in self.ports.values():
                p.dirty = p.dirty or time.monotonic()
        elif op == "I":
            self.close_port(w[1])
            port = open_port(w[1], int(w[2]), bytes.fromhex(w[3]))
            self.ports[port.name] = port
            self.by_fd[port.sock.fileno()] = port
            self.ep.register(port.sock.fileno(), select.EPOLLIN)
            self.refilter(port)
        elif op == "C":
            self.close_port(w[1])
        elif op == "P":
            self.flush(force=True)
            self.emit({"p": int(w[1])})
        else:
            raise ValueError(f"unknown command {op!r}")

    def close_port(self, name: str) -> None:
        port = self.ports.pop(name, None)
        if port is None:
            return
        self.by_fd.pop(port.sock.fileno(), None)
        try:
            self.ep.unregister(port.sock.fileno())
        except (KeyError, ValueError, OSError):
            pass
        port.sock.close()

    def take(self, port: _Port, ip: bytes, frames: list[bytes]) -> None:
        """``T``: the filter passes ``ip`` first, the requests already read are handled as before (the giver
        answers them), then the announcement leaves and ``ip`` is answered (see the module docstring)."""
        if port.passes is not None and ip not in port.passes:
            self.refilter(port, ip)
        while self.frames(port):
            pass
        if self.lease is None or self.lease.valid():  # a frozen daemon's node claims nothing
            for frame in frames:
                try:
                    port.sock.send(frame)
                except OSError:
                    break
        port.answer.add(ip)
        port.handoff.discard(ip)
        self.takes += 1

    def refilter(self, port: _Port, extra: bytes | None = None) -> None:
        passes = port.answer if extra is None else port.answer | {extra}
        prog = answer_program(passes, self.watch)
        exact = not (prog is ARP_NDP_PROGRAM or prog == ARP_NDP_PROGRAM)
        if prog != port.program:
            try:
                attach_filter(port.sock, prog)
            except OSError as exc:
                if not exact:
                    raise
                self.fall_back(port, exc, len(prog))
                prog, exact = ARP_NDP_PROGRAM, False
            else:
                port.fallback = ""
            port.program = prog
            self.refilters += 1
        port.passes, port.senders = (set(passes), set(self.watch)) if exact else (None, None)
        port.dirty = 0.0

    def fall_back(self, port: _Port, exc: OSError, size: int) -> None:
        """The exact filter does not fit (defect 8, issue 21: ENOMEM above net.core.optmem_max, EINVAL): attach
        the opcode/type filter instead (every ARP request, every NS/NA; Python's set lookup does the rest) and
        say so once per interface (the announcer logs it as ``responderError``; ``filterFallback`` in the status)."""
        if port.program != ARP_NDP_PROGRAM:
            try:
                attach_filter(port.sock, ARP_NDP_PROGRAM)  # smaller than any exact one
            except OSError:  # the old and the new one are charged together while they swap: old one off first
                detach_filter(port.sock)
                attach_filter(port.sock, ARP_NDP_PROGRAM)
        reason = (f"{port.name}: the exact filter ({size} instructions) was refused ({exc.strerror or exc}; "
                  f"net.core.optmem_max is {_optmem_max()}): every ARP request and NS/NA reaches the responder")
        if port.name not in self.fallbacks_told:
            self.fallbacks_told.add(port.name)
            self.emit({"error": reason})
        port.fallback = reason

    # -- frames -------------------------------------------------------------------------------
    def frames(self, port: _Port) -> bool:
        """Handle up to 64 waiting frames; True when that many were read (more may wait)."""
        sock, mac, answer, watch, lease = port.sock, port.mac, port.answer, self.watch, self.lease
        for _i in range(64):
            try:
                data = sock.recv(2048)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                if exc.errno in (errno.ENETDOWN, errno.ENXIO, errno.ENODEV):
                    return False  # the announcer's rescan closes or reopens the port
                raise
            port.rx += 1
            if data[12:14] == _ETH_ARP:
                if data[14:20] != _ARP_HDR or data[6:12] == mac or data[22:28] == mac:
                    continue
                tpa, spa = data[38:42], data[28:32]
                if data[20:22] == _ARP_REQ and tpa in answer and spa != tpa:
                    if lease is not None and not lease.valid():
                        self.refuse(tpa)
                    else:
                        sha = data[22:28]
                        self.send(port, sha + port.arp_head + tpa + sha + spa + _PAD, tpa)
                if spa in watch:
                    self.report(port, data)
                elif spa == tpa and spa in answer:  # another MAC announces an address answered here
                    if spa in port.handoff:
                        self.handed(port, spa, data)
                        continue
                    self.claim(port, spa, data)
            elif data[12:14] == _ETH_IP6 and len(data) >= 78:
                target = data[62:78]
                if data[54] == ndp.NS and target in answer:
                    pkt = ndp.parse(data)
                    if pkt is None or pkt.eth_src == mac:
                        continue
                    if pkt.src == ndp.UNSPECIFIED and pkt.dst != ndp.solicited_node(target):
                        continue  # RFC 4861 7.1.1: DAD NS must go to the solicited-node group
                    if lease is not None and not lease.valid():
                        self.refuse(target)
                        continue
                    self.send(port, ndp.reply_to(pkt, mac), target)
                elif target in watch and data[6:12] != mac:
                    self.report(port, data)
                elif data[54] == ndp.NA and target in answer and data[6:12] != mac:
                    if target in port.handoff:
                        self.handed(port, target, data)
                        continue
                    self.claim(port, target, data)
        return True

    def send(self, port: _Port, frame: bytes, ip: bytes) -> None:
        c = self.counts.get(ip)
        if c is None:
            c = self.counts[ip] = [0, 0]
        c[0] += 1
        try:
            port.sock.send(frame)
        except OSError:
            return
        c[1] += 1
        port.answered += 1
        self.changed = True

    def handed(self, port: _Port, ip: bytes, data: bytes) -> None:
        """``ip`` is being handed off and another MAC announced it: stop answering now and report the frame
        (never held back by CLAIM_EVERY: it ends the daemon's side of the hand-off too)."""
        port.handoff.discard(ip)
        port.answer.discard(ip)
        port.dirty = port.dirty or time.monotonic()
        self.report(port, data)

    def claim(self, port: _Port, ip: bytes, data: bytes) -> None:
        """Report another MAC's announcement of an address answered here (at most one per address per
        CLAIM_EVERY s: a flood of forged announcements costs the daemon little)."""
        now = time.monotonic()
        if now - self.claims.get(ip, -1.0) < CLAIM_EVERY:
            return
        if len(self.claims) > 4096:
            self.claims.clear()
        self.claims[ip] = now
        self.report(port, data)

    def refuse(self, ip: bytes) -> None:
        """A request for ``ip`` not answered: the daemon's lease ran out (it is frozen or stalled)."""
        c = self.counts.get(ip)
        if c is None:
            c = self.counts[ip] = [0, 0]
        c[0] += 1
        self.refused += 1
        self.refused_new += 1
        self.changed = True

    def report(self, port: _Port, data: bytes) -> None:
        self.reported += 1
        self.emit({"f": port.name, "x": data.hex()})

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if not (force or (self.changed and now - self.last_flush >= FLUSH_EVERY)):
            return
        self.last_flush = now
        self.changed = False
        counts = {socket.inet_ntop(socket.AF_INET if len(ip) == 4 else socket.AF_INET6, ip): c
                  for ip, c in self.counts.items()}
        self.counts = {}
        doc: dict = {"n": counts, "s": self.stats()}
        if self.refused_new:
            doc["lx"], self.refused_new = self.refused_new, 0
        self.emit(doc)

    def stats(self) -> dict:
        return {"rx": {p.name: p.rx for p in self.ports.values()},
                "answered": {p.name: p.answered for p in self.ports.values()},
                "exact": {p.name: p.passes is not None for p in self.ports.values()},
                "filterFallback": {p.name: p.fallback for p in self.ports.values() if p.fallback},
                "reported": self.reported, "refilters": self.refilters, "pid": os.getpid(),
                "leaseRefused": self.refused, "takes": self.takes}

    # -- loop ---------------------------------------------------------------------------------
    def run(self) -> int:
        os.set_blocking(self.ctl_in, False)
        self.ep.register(self.ctl_in, select.EPOLLIN)
        self.emit({"ready": os.getpid()})
        while True:
            timeout = -1.0
            if self.changed:
                timeout = FLUSH_EVERY
            if any(p.dirty for p in self.ports.values()):
                timeout = REFILTER_AFTER if timeout < 0 else min(timeout, REFILTER_AFTER)
            for fd, _ev in self.ep.poll(timeout):
                port = self.by_fd.get(fd)
                if port is not None:
                    self.frames(port)
                elif fd == self.ctl_in and not self.control():
                    return 0
            if timeout >= 0:
                now = time.monotonic()
                for port in list(self.ports.values()):
                    if port.dirty and now - port.dirty >= REFILTER_AFTER:
                        self.refilter(port)
                self.flush()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the daemon; we end at stdin EOF
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    fd = os.environ.get(LEASE_ENV)
    lease = Lease.attach(int(fd)) if fd else None  # an unusable fd: exit (the announcer answers, with its lease)
    try:
        return Responder(lease=lease).run()
    except BrokenPipeError:
        return 0


# -- the announcer's side ---------------------------------------------------------------------
class ResponderClient:
    """Starts ``python -m nocloudlb.l2.responder`` and talks to it; the L2Announcer supervises it.

    Writes are non-blocking into an outbox the announcer's loop flushes, so a stuck child can
    never block the announcer (it is detected by the ping and replaced instead).
    """

    def __init__(self, log: logging.Logger, argv: list[str] | None = None, lease_fd: int | None = None) -> None:
        self.log = log
        self.argv = argv or [sys.executable, "-m", "nocloudlb.l2.responder"]
        self.lease_fd = lease_fd  # the announcer's lease memfd: inherited by every child (lease.py)
        self.proc: subprocess.Popen | None = None
        self.out = bytearray()
        # send() and flush() run on the announcer's thread and (flush, from its wake-up) on the caller's:
        # os.write releases the GIL while it holds the buffer, so without this lock a second flush wrote
        # the same bytes again and both deleted them (lines lost), or a resize met the export (BufferError)
        self._out_lock = threading.Lock()
        self.inbuf = b""
        self.ready = False
        self.started = 0.0

    def spawn(self) -> None:
        """Start a new child (the old one, if any, is killed first)."""
        self.kill()
        with self._out_lock:
            self.out.clear()
        self.inbuf = b""
        self.ready = False
        fds: tuple[int, ...] = ()
        env = None
        if self.lease_fd is not None:
            fds, env = (self.lease_fd,), {**os.environ, LEASE_ENV: str(self.lease_fd)}
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                     close_fds=True, pass_fds=fds, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        os.set_blocking(self.proc.stdin.fileno(), False)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.started = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def fileno(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def send(self, line: str) -> None:
        """Queue ``line``; written at the next flush() (the announcer's wake-up and every loop pass)."""
        if self.proc is None:
            return  # nobody to tell: the next child gets the whole state at its start
        with self._out_lock:
            self.out += line.encode() + b"\n"
            if len(self.out) >= 1 << 16:
                self._flush()

    def flush(self) -> None:
        with self._out_lock:
            self._flush()

    def _flush(self) -> None:
        proc = self.proc
        if proc is None or not self.out or proc.stdin is None:
            return
        try:
            n = os.write(proc.stdin.fileno(), self.out)
            del self.out[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except (OSError, ValueError):  # the child is gone (its stdout's EOF tells the announcer), or closed
            self.out.clear()

    def read(self, handle: Callable[[dict], None]) -> bool:
        """Hand every complete line to ``handle``; False when the child has gone (EOF)."""
        if self.proc is None or self.proc.stdout is None:
            return False
        try:
            data = os.read(self.proc.stdout.fileno(), 1 << 16)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            data = b""
        if not data:
            return False
        self.inbuf += data
        *lines, self.inbuf = self.inbuf.split(b"\n")
        for line in lines:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if "ready" in doc:
                self.ready = True
            handle(doc)
        return True

    def kill(self) -> int | None:
        """Stop the child (stdin closed, then SIGKILL if it lingers); its exit status."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        for f in (proc.stdin, proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
