"""Direct heartbeats between members: fast failure suspicion, at a cost per node, never per VIP.

Gossip (kinship, SWIM) declares a crashed member dead after a probe round, indirect probes and a
suspicion timeout: 0.3-0.9 s at the shortest timers it takes. Heartbeats suspect it within
``interval x miss`` (the ``fast`` profile: 25 ms x 4) and gossip stays the judge of membership:
a suspected member is only *ineligible* (its VIPs go to the next node in their order, with handover
forwarding toward it, see l2/mode.py); it is declared dead, or comes back, by gossip.

Wire. Every ``interval`` each node sends one UDP datagram to every live member (gossip state
alive or suspect) at that member's gossip address, port + ``port_offset`` (every member uses the
same offset). The packets a node sends per second are ``members / interval``, whatever the number
of VIPs it leads. A datagram (network byte order)::

    "NLH2" | flags u8 | len u8 + sender name | len u8 + recipient name | boot u64 | seq u64
          | suspicions u32 | meta seq u32 | count u8 + (len u8 + name) the sender misses
          | [meta len u16 + meta JSON]   | HMAC-SHA256[:16]

- ``flags``: 1 = the sender suspects the recipient now (it stopped hearing it), 2 = meta follows.
- ``boot``: the sender's start time in ns, ``seq``: its packet counter. A receiver accepts a packet
  from a sender only with a larger ``(boot, seq)`` than the last it accepted: replays are refused.
- ``suspicions``: how many times the sender has suspected the recipient so far.
- the members the sender *misses* (heard before, not within ``interval x miss``): a second opinion
  for the recipient, like SWIM's indirect probe. A change of that list is sent at once.
- ``meta``: after this node published new metadata (labels: a drain), the next
  ``META_REPEAT`` packets to each peer carry it whole, the first one sent at once: peers apply a
  drain within a round trip instead of a gossip round. Every packet carries ``meta seq``; a
  receiver uses the meta it got by heartbeat only while its ``meta seq`` is the sender's latest
  (otherwise gossip's copy): it is what the sender published (kinship accepted it first), so every
  node still decides from published state.
- The HMAC key is derived from each memberlist key (``keyFile``): any key of the ring verifies, the
  first signs (rotation works as for gossip). Without keys (an unencrypted cluster) the HMAC still
  catches corruption but authenticates nothing.

The suspicion rule (fail closed, never two owners as far as this node can tell). With ``heard(X)``
"a packet from X accepted within ``interval x miss``" and ``live`` the members gossip holds alive
or suspect (this node excluded), this node:

1. suspects a live member P it has heard at least once since it joined when it does not hear P
   now and either another live member it hears misses P too (its latest datagram says so: a
   second path agrees, so neither this node's own link nor lost packets on one path alone make a
   suspicion) or gossip suspects P too. Alone with P (a two-node cluster) a silent P is suspected
   only once gossip suspects it: a node cannot tell its own dead link from a dead peer without a
   third party. With 10 % loss each way, a false suspicion needs ``miss`` losses in a row on two
   paths at once.
2. is *cut off* when it has two or more live members, has heard some of them before and hears
   none now (its own link, or its own heartbeats, are down): then it counts every live member
   as suspecting it, and gives up each VIP whose next node (the leader without it) is one of them
   (so an unplugged or isolated leader withdraws what the others take). It suspects nobody while
   cut off, even once its own gossip suspects them: nothing is grabbed. Only gossip declaring the
   others dead (or hearing them again) ends that; a node whose peers all died at once therefore
   takes their VIPs at gossip speed, an isolated one claims nothing meanwhile.
3. is suspected by the members it hears whose packets say so (flag 1): it gives up each VIP
   whose next node is one of them; when their packets stop saying so, it takes them back.

The thread sends and receives on its own (not the decision thread): a busy decision loop never
delays a heartbeat. It calls ``on_change()`` (posts a reconcile) whenever what it reports changed.

Cost (``fast``: 25 ms, 80 datagrams/s each way with three nodes). A wake-up of the thread costs more
than the datagram's Python work, so the thread wakes once per interval when nothing is happening:
two sockets share the port (SO_REUSEPORT) and a classic BPF program of the group steers each
datagram by its content: the *routine* ones (flags 0, nobody missed: "I am alive, nothing new") to
one socket, read at each send tick; every other one (a suspicion, a miss, a meta) to the *news*
socket, read the moment it arrives. ``heard`` is the datagram's arrival time (the kernel's
SO_TIMESTAMPNS), so reading a routine datagram at the next tick moves no timeout. The thread reads
the routine socket at once too whenever anything is not quiet: a member not heard for 1.5 intervals,
a member missed or suspected, a member that misses someone or suspects this node, a cut-off. So what
a datagram says is acted on as fast as before, and the packets on the wire are the same. Where the
kernel refuses the program (or the port has no SO_REUSEPORT) one socket is read at once, as before.
The packets' HMACs copy a keyed stdlib HMAC object per key, a routine datagram from a
known member is checked against the bytes expected from it rather than parsed, and the rule is
evaluated only when a datagram changed something, the peers changed, or a member's deadline passed.
"""

from __future__ import annotations

import base64
import ctypes
import functools
import hashlib
import hmac
import json
import logging
import math
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .logs import event

MAGIC = b"NLH2"
F_SUSPECT_YOU = 1
F_META = 2
MAC_LEN = 16
META_REPEAT = 3
MAX_PACKET = 2048
_HEAD = struct.Struct("!QQII")  # boot, seq, suspicions, meta seq
_TIMESPEC = struct.Struct("@qq")
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux: each datagram's arrival time (timespec)
SO_ATTACH_REUSEPORT_CBPF = getattr(socket, "SO_ATTACH_REUSEPORT_CBPF", 51)
#: a member not heard for this many intervals makes the thread read every datagram at once
QUIET_LATE = 1.5

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

#: bounds of the settings (the profile's, or memberlist overrides)
INTERVAL_MIN, INTERVAL_MAX = 0.005, 5.0
MISS_MIN, MISS_MAX = 2, 100
OFFSET_MAX = 1000


class PacketError(ValueError):
    """A datagram that is not a valid heartbeat (the reason in the message)."""


def derive_keys(keys: list[str] | None) -> list[bytes]:
    """HMAC keys from the memberlist keys (base64, 32 bytes each); ``[b""]`` without keys."""
    if not keys:
        return [b""]
    return [hmac.new(base64.b64decode(k), b"nocloudlb heartbeat v1", hashlib.sha256).digest() for k in keys]


class Packet(NamedTuple):  # a tuple: built for every datagram, a frozen dataclass costs 3 us more
    sender: str
    recipient: str
    boot: int
    seq: int
    suspicions: int
    meta_seq: int
    suspect_you: bool = False
    meta: dict[str, str] | None = None
    missing: tuple[str, ...] = ()


class _Mac:
    """HMAC-SHA256 of the stdlib, keyed once: a datagram's tag copies the keyed object (its inner and
    outer hashes are computed once per key), instead of keying a new one per datagram."""

    __slots__ = ("_keyed",)

    def __init__(self, key: bytes) -> None:
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)

    def tag(self, body: bytes) -> bytes:
        h = self._keyed.copy()
        h.update(body)
        return h.digest()[:MAC_LEN]


@functools.lru_cache(maxsize=64)
def _mac(key: bytes) -> _Mac:
    return _Mac(key)


@functools.lru_cache(maxsize=512)
def _prefix(sender: str, recipient: str, flags: int) -> bytes:
    s, r = sender.encode(), recipient.encode()
    if not 0 < len(s) < 256 or len(r) >= 256:
        raise ValueError("heartbeat: node names are 1 to 255 bytes")
    return MAGIC + bytes([flags, len(s)]) + s + bytes([len(r)]) + r


@functools.lru_cache(maxsize=512)
def _names(missing: tuple[str, ...]) -> bytes:
    names = [n.encode() for n in missing[:255]]
    if any(not 0 < len(n) < 256 for n in names):
        raise ValueError("heartbeat: node names are 1 to 255 bytes")
    return bytes([len(names)]) + b"".join(bytes([len(n)]) + n for n in names)


def encode(p: Packet, key: bytes) -> bytes:
    flags = (F_SUSPECT_YOU if p.suspect_you else 0) | (F_META if p.meta is not None else 0)
    body = _prefix(p.sender, p.recipient, flags) + _HEAD.pack(p.boot, p.seq, p.suspicions, p.meta_seq) \
        + _names(tuple(p.missing))
    if p.meta is not None:
        raw = json.dumps(p.meta, separators=(",", ":"), sort_keys=True).encode()
        body += struct.pack("!H", len(raw)) + raw
    return body + _mac(key).tag(body)


def decode(data: bytes, keys: list[bytes]) -> Packet:
    """The packet in ``data`` once its HMAC verifies with one of ``keys``; PacketError otherwise."""
    if len(data) > MAX_PACKET:
        raise PacketError("too long")
    if len(data) < len(MAGIC) + 4 + _HEAD.size + MAC_LEN or not data.startswith(MAGIC):
        raise PacketError("not a heartbeat")
    body, tag = data[:-MAC_LEN], data[-MAC_LEN:]
    for k in keys:
        if hmac.compare_digest(_mac(k).tag(body), tag):
            break
    else:
        raise PacketError("bad HMAC (another key, or corrupted)")
    try:
        pos = len(MAGIC)
        flags, slen = body[pos], body[pos + 1]
        pos += 2
        sender = body[pos:pos + slen].decode()
        pos += slen
        rlen = body[pos]
        recipient = body[pos + 1:pos + 1 + rlen].decode()
        pos += 1 + rlen
        if not sender or len(sender.encode()) != slen or len(recipient.encode()) != rlen:
            raise PacketError("truncated names")
        boot, seq, suspicions, meta_seq = _HEAD.unpack_from(body, pos)
        pos += _HEAD.size
        missing = []
        for _dummy in range(body[pos]):
            pos += 1
            n = body[pos]
            raw_name = body[pos + 1:pos + 1 + n]
            if len(raw_name) != n or not n:
                raise PacketError("truncated missing list")
            missing.append(raw_name.decode())
            pos += n
        pos += 1
        meta = None
        if flags & F_META:
            (mlen,) = struct.unpack_from("!H", body, pos)
            pos += 2
            raw = body[pos:pos + mlen]
            if len(raw) != mlen:
                raise PacketError("truncated meta")
            pos += mlen
            meta = json.loads(raw)
            if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in meta.items()):
                raise PacketError("meta is not a mapping of strings")
        if pos != len(body):
            raise PacketError("trailing bytes")
    except (IndexError, struct.error, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, PacketError):
            raise
        raise PacketError(f"malformed: {exc}") from None
    return Packet(sender, recipient, boot, seq, suspicions, meta_seq, bool(flags & F_SUSPECT_YOU), meta,
                  tuple(missing))


def check_settings(interval: Any, miss: Any, offset: Any, dead_after: float | None = None) -> list[str]:
    """Problems with heartbeat settings, each naming the memberlist field and its value."""
    errors: list[str] = []
    ok_interval = isinstance(interval, int | float) and not isinstance(interval, bool) and math.isfinite(interval)
    if not ok_interval or not INTERVAL_MIN <= interval <= INTERVAL_MAX:
        errors.append(f"memberlist.heartbeatInterval: {interval!r} must be a number of seconds from "
                      f"{INTERVAL_MIN} to {INTERVAL_MAX}")
        ok_interval = False
    ok_miss = isinstance(miss, int | float) and not isinstance(miss, bool) and float(miss).is_integer()
    if not ok_miss or not MISS_MIN <= miss <= MISS_MAX:
        errors.append(f"memberlist.heartbeatMiss: {miss!r} must be a whole number from {MISS_MIN} to {MISS_MAX} "
                      "(heartbeats missed before a member is suspected; 1 would suspect on one lost packet)")
        ok_miss = False
    if isinstance(offset, bool) or not isinstance(offset, int | float) or not float(offset).is_integer() \
            or not 0 <= offset <= OFFSET_MAX:
        errors.append(f"memberlist.heartbeatPortOffset: {offset!r} must be a whole number from 0 (heartbeats off) "
                      f"to {OFFSET_MAX}")
    if ok_interval and ok_miss and dead_after is not None and interval * miss >= dead_after:
        errors.append(f"memberlist.heartbeatInterval x heartbeatMiss: {interval:g} x {int(miss)} = "
                      f"{interval * miss:g} s must be shorter than gossip's probeInterval x (1 + suspicionMult) = "
                      f"{dead_after:g} s, or gossip declares a member dead before heartbeats suspect it")
    return errors


@dataclass
class _Peer:
    addr: tuple[str, int]
    gossip_state: str
    added: float
    heard: float = -1e9  # monotonic time of the last accepted packet
    heard_once: bool = False
    boot: int = -1
    seq: int = -1
    suspects_me: bool = False
    my_suspicions: int = 0  # times this node suspected it
    their_suspicions: int = 0  # times it suspected this node (last value seen)
    meta_seq: int = -1  # the sender's latest meta seq
    meta: tuple[int, dict[str, str]] | None = None  # (seq, meta) received by heartbeat
    missing: frozenset[str] = frozenset()  # the members it misses (its latest datagram)


@dataclass(frozen=True)
class HeartbeatView:
    suspected: frozenset[str] = frozenset()  # live members this node suspects (ineligible)
    suspecters: frozenset[str] = frozenset()  # members that suspect this node (all live ones when cut off)
    cut_off: bool = False
    metas: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # current meta received by heartbeat


class Heartbeat:
    """See the module docstring. ``set_peers`` from the decision thread at every reconcile."""

    def __init__(self, name: str, bind_ip: str, port: int, keys: list[str] | None, interval: float, miss: int,
                 on_change: Callable[[], None] = lambda: None, logger: logging.Logger | None = None) -> None:
        self.name = name
        self.bind_ip = bind_ip
        self.port = port
        self.interval = float(interval)
        self.miss = int(miss)
        self.timeout = self.interval * self.miss
        self.on_change = on_change
        self.log = logger or logging.getLogger("nocloudlb.heartbeat")
        self._keys = derive_keys(keys)
        self._boot = time.time_ns()
        self._seq = 0
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer] = {}
        self._meta: dict[str, str] | None = None
        self._meta_seq = 0
        self._meta_left: dict[str, int] = {}  # peer -> packets that still carry the meta
        self._view = HeartbeatView()
        self._missing: frozenset[str] = frozenset()  # members this node misses now (raw, before the rule)
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None  # sends; receives the routine datagrams (all without the split)
        self._news: socket.socket | None = None  # receives the others (see the module docstring), or None
        self._stamped = False  # arrival times from the kernel (SO_TIMESTAMPNS)
        self._dirty = True  # a datagram or set_peers changed what _evaluate reads
        self._deadline = 0.0  # monotonic time by which a heard member's timeout may end: evaluate then
        self._quiet = False  # nothing happening: the routine socket is read at send ticks only
        self._prefixes: dict[bytes, bytes] = {}  # sender name -> a routine datagram's first bytes to this node
        self.counters = {"sent": 0, "received": 0, "rejectedAuth": 0, "rejectedReplay": 0, "rejectedOther": 0,
                         "suspicions": 0}

    # -- lifecycle -------------------------------------------------------------------------
    def _socket(self, reuseport: bool) -> socket.socket:
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
                self._stamped = True
            except OSError:
                self._stamped = False
            sock.bind((self.bind_ip, self.port))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def _split(self) -> socket.socket | None:
        """The news socket, joined to the main one's reuseport group with the steering program; None when
        the kernel refuses (then the main socket gets every datagram and is read at once)."""
        assert self._sock is not None
        prog = b"".join(struct.pack("HBBI", *ins) for ins in _STEER)
        buf = ctypes.create_string_buffer(prog)
        fprog = struct.pack("HL", len(_STEER), ctypes.addressof(buf))
        news = None
        try:
            news = self._socket(reuseport=True)
            self._sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)
        except OSError as exc:
            if news is not None:
                news.close()
            self.log.debug("heartbeat: one socket, read at once (%s)", exc)
            return None
        return news

    def start(self) -> None:
        try:
            self._sock = self._socket(reuseport=True)
        except OSError:
            self._sock = self._socket(reuseport=False)  # as before: every datagram read at once
        else:
            self._news = self._split() if self._stamped else None
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()
        event(self.log, "heartbeatStarted", bind=f"{self.bind_ip}:{self.port}", interval=self.interval,
              miss=self.miss)

    def close(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close()
        if self._news is not None:
            self._news.close()

    # -- inputs ----------------------------------------------------------------------------
    def set_peers(self, peers: Mapping[str, tuple[tuple[str, int], str]]) -> None:
        """The live members (name -> ((ip, heartbeat port), gossip state)), this node excluded."""
        now = time.monotonic()
        with self._lock:
            for name in list(self._peers):
                if name not in peers:
                    del self._peers[name]  # dead or left for gossip: forget it (heard_once too)
                    self._meta_left.pop(name, None)
            for name, (addr, state) in peers.items():
                p = self._peers.get(name)
                if p is None:
                    self._peers[name] = _Peer(addr, state, now)
                    if self._meta is not None:
                        self._meta_left[name] = META_REPEAT
                elif p.addr != addr or p.gossip_state != state:
                    p.addr, p.gossip_state = addr, state
            self._dirty = True
        self._kick.set()

    def set_meta(self, meta: Mapping[str, str]) -> None:
        """This node published ``meta``: push it to every peer now (and in the next packets)."""
        with self._lock:
            if self._meta == dict(meta):
                return
            self._meta = dict(meta)
            self._meta_seq += 1
            self._meta_left = dict.fromkeys(self._peers, META_REPEAT)
        self._send_all(time.monotonic())

    def set_keys(self, keys: list[str] | None) -> None:
        self._keys = derive_keys(keys)

    # -- outputs ---------------------------------------------------------------------------
    def view(self) -> HeartbeatView:
        return self._view

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        v = self._view
        with self._lock:
            peers = {n: {"heardMsAgo": round((now - p.heard) * 1000) if p.heard_once else None,
                         "suspected": n in v.suspected, "suspectsMe": p.suspects_me}
                     for n, p in sorted(self._peers.items())}
        return {"bind": f"{self.bind_ip}:{self.port}", "interval": self.interval, "miss": self.miss,
                "cutOff": v.cut_off, "suspected": sorted(v.suspected), "suspecters": sorted(v.suspecters),
                "peers": peers, "counters": dict(self.counters)}

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        next_send = time.monotonic()
        ready: list[Any] = []
        while not self._stop.is_set():
            try:
                assert self._sock is not None
                if self._sock.fileno() < 0 and self._news is not None:
                    self._news.close()  # the main socket closed (a test's dead node): no news either
                now = time.monotonic()
                tick = now >= next_send
                # news at once; routine datagrams now too, unless quiet and between ticks
                self._receive_all(routine=tick or not self._quiet or self._sock in ready,
                                  news=self._news is not None and (self._news in ready or not self._quiet))
                if tick:
                    self._send_all(now)
                    next_send = max(next_send + self.interval, now + self.interval / 4)
                now = time.monotonic()
                if self._dirty or now >= self._deadline:
                    self._evaluate(now)
                self._quiet = self._news is not None and self._is_quiet(now)
                # quiet: every member was heard within QUIET_LATE intervals, so no timeout ends before the next
                # tick (the deadline kept from the last evaluation is older: it is checked at that tick)
                until = next_send if self._quiet else min(next_send, self._deadline)
                wait = max(0.0, until - time.monotonic())
                socks = [self._news] if self._news is not None else []
                if not self._quiet:
                    socks.append(self._sock)
                ready = select.select(socks, [], [], wait)[0]
            except Exception:  # noqa: BLE001 - the heartbeat outlives any one error
                self.log.exception("heartbeat loop error")
                self._stop.wait(self.interval)

    def _is_quiet(self, now: float) -> bool:
        """Nothing happening: every member heard within QUIET_LATE intervals, none missed or suspected by
        anyone as far as their datagrams say, this node not cut off."""
        v = self._view
        if v.suspected or v.suspecters or v.cut_off or self._missing:
            return False
        late = now - QUIET_LATE * self.interval
        with self._lock:
            if not self._peers:
                return False
            for p in self._peers.values():
                if not p.heard_once or p.heard < late or p.missing or p.suspects_me:
                    return False
        return True

    def _send_all(self, now: float) -> None:
        sock = self._sock
        if sock is None:
            return
        view = self._view
        with self._lock:
            out = []
            for name, p in self._peers.items():
                self._seq += 1
                meta = None
                if self._meta is not None and self._meta_left.get(name, 0) > 0:
                    self._meta_left[name] -= 1
                    meta = self._meta
                pkt = Packet(self.name, name, self._boot, self._seq, p.my_suspicions, self._meta_seq,
                             name in view.suspected, meta, tuple(sorted(self._missing - {name})))
                out.append((p.addr, pkt))
            key = self._keys[0]
        for addr, pkt in out:
            try:
                sock.sendto(encode(pkt, key), addr)
                self.counters["sent"] += 1
            except OSError:
                pass  # unreachable, no route (link down): the peers will suspect us, which is right

    def _receive_all(self, routine: bool = True, news: bool = True) -> None:
        """Read the routine socket (``routine``) and the news socket (``news``) until they are empty."""
        changed = False
        socks = [self._news] if self._news is not None and news else []
        if routine and self._sock is not None:
            socks.append(self._sock)
        for sock in socks:
            while True:
                try:
                    data, anc, _flags, _src = sock.recvmsg(MAX_PACKET + 1, 64)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                now = time.monotonic()
                for level, kind, raw in anc:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                        sec, nsec = _TIMESPEC.unpack_from(raw)
                        # the arrival time: at most a timeout/2 ago (a realtime clock step counts as now)
                        age = min(max(time.time() - (sec + nsec / 1e9), 0.0), self.timeout / 2)
                        now -= age
                        break
                changed |= self._accept(data, now)
        if changed:
            self._evaluate(time.monotonic(), force=True)

    def _routine(self, data: bytes) -> Packet | None:
        """A routine datagram from a known sender (flags 0, nothing missed, no meta), checked against the
        bytes ``encode`` gives for it and its HMAC; None for anything else (``decode`` judges it)."""
        if len(data) < 6 or data[4]:
            return None
        sender = data[6:6 + data[5]]
        prefix = self._prefixes.get(sender)
        if prefix is None:
            if not sender or len(sender) != data[5]:
                return None
            try:
                prefix = _prefix(sender.decode("utf-8", "replace"), self.name, 0)
            except ValueError:
                return None
            if len(self._prefixes) >= 256:
                self._prefixes.clear()  # junk senders: the cache stays small
            self._prefixes[sender] = prefix
        n = len(prefix)
        if len(data) != n + _HEAD.size + 1 + MAC_LEN or data[n + _HEAD.size] or not data.startswith(prefix):
            return None
        body, tag = data[:-MAC_LEN], data[-MAC_LEN:]
        for k in self._keys:
            if hmac.compare_digest(_mac(k).tag(body), tag):
                boot, seq, suspicions, meta_seq = _HEAD.unpack_from(data, n)
                return Packet(sender.decode(), self.name, boot, seq, suspicions, meta_seq)
        return None

    def _accept(self, data: bytes, now: float) -> bool:
        """Take one datagram; True when it changed a meta this node reports."""
        try:
            pkt = self._routine(data) or decode(data, self._keys)
        except PacketError as exc:
            key = "rejectedAuth" if "HMAC" in str(exc) else "rejectedOther"
            self.counters[key] += 1
            return False
        if pkt.recipient != self.name:
            self.counters["rejectedOther"] += 1
            return False
        with self._lock:
            p = self._peers.get(pkt.sender)
            if p is None:
                self.counters["rejectedOther"] += 1  # not a live member (yet): gossip decides membership
                return False
            if (pkt.boot, pkt.seq) <= (p.boot, p.seq):
                self.counters["rejectedReplay"] += 1
                return False
            if pkt.boot != p.boot:
                p.meta, p.meta_seq = None, -1  # a restarted member: its old meta means nothing
            if not p.heard_once or now - p.heard > self.timeout or p.suspects_me != pkt.suspect_you:
                self._dirty = True  # heard again (or for the first time), or its suspicion of this node changed
            p.boot, p.seq = pkt.boot, pkt.seq
            p.heard, p.heard_once = max(p.heard, now), True
            p.suspects_me = pkt.suspect_you
            p.their_suspicions = pkt.suspicions
            changed = False
            if frozenset(pkt.missing) != p.missing:
                p.missing = frozenset(pkt.missing)
                changed = self._dirty = True
            if pkt.meta is not None and (p.meta is None or p.meta[0] != pkt.meta_seq):
                p.meta = (pkt.meta_seq, pkt.meta)
                changed = True
            if pkt.meta_seq != p.meta_seq:
                p.meta_seq = pkt.meta_seq
                changed = True
        self.counters["received"] += 1
        return changed

    def _evaluate(self, now: float, force: bool = False) -> None:
        with self._lock:
            self._dirty = False
            live = self._peers
            heard = {n for n, p in live.items() if p.heard_once and now - p.heard <= self.timeout}
            if self._view.cut_off and heard:
                # back from a cut-off: the members not heard again yet get a fresh timeout (not suspected
                # for being heard last before it) and count as suspecting this node until their next
                # packet says otherwise (they likely do: they did not hear it either)
                for n, p in live.items():
                    if p.heard_once and n not in heard:
                        p.heard, p.suspects_me = now, True
                        heard.add(n)
            missing = frozenset(n for n, p in live.items() if p.heard_once and n not in heard)
            cut_off = len(live) >= 2 and any(p.heard_once for p in live.values()) and not heard
            suspected = set()
            for n in () if cut_off else missing:  # cut off: this node cannot judge anyone, it grabs nothing
                if live[n].gossip_state == "suspect" or any(n in live[r].missing for r in heard):
                    suspected.add(n)
            suspecters = set(live) if cut_off else {n for n in heard if live[n].suspects_me}
            for n in suspected - self._view.suspected:
                live[n].my_suspicions += 1
            metas = {n: p.meta[1] for n, p in live.items() if p.meta is not None and p.meta[0] == p.meta_seq}
            ends = [p.heard + self.timeout for p in live.values() if p.heard_once and p.heard + self.timeout > now]
            self._deadline = min(ends) + 0.001 if ends else now + 1.0
        view = HeartbeatView(frozenset(suspected), frozenset(suspecters), cut_off, metas)
        old = self._view
        if missing != self._missing:
            self._missing = missing
            send_now = True
        else:
            send_now = False
        if view == old and not force:
            if send_now:
                self._send_all(now)
            return
        self._view = view
        if view.suspected != old.suspected or view.suspecters != old.suspecters or view.cut_off != old.cut_off:
            for n in sorted(view.suspected - old.suspected):
                self.counters["suspicions"] += 1
                event(self.log, "nodeUnreachable", "no heartbeat within interval x miss: its VIPs go to the next "
                      "nodes (handover forwarding toward it) until it is heard again or gossip declares it dead",
                      logging.WARNING, node=n, timeoutMs=round(self.timeout * 1000))
            for n in sorted(old.suspected - view.suspected):
                event(self.log, "nodeReachable", "heartbeats again", node=n)
            if view.cut_off != old.cut_off:
                event(self.log, "heartbeatCutOff" if view.cut_off else "heartbeatReconnected",
                      "this node hears no member's heartbeat: giving up the VIPs the others take" if view.cut_off
                      else "this node hears members' heartbeats again",
                      logging.WARNING if view.cut_off else logging.INFO)
            if view.suspecters != old.suspecters:
                event(self.log, "heartbeatSuspectedBy", suspecters=sorted(view.suspecters),
                      level=logging.WARNING if view.suspecters else logging.INFO)
        if view != old:
            self.on_change()
        if send_now:  # a second opinion travels at once (peers confirm a suspicion a datagram later)
            self._send_all(now)
