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
  first signs (rotation works as for gossip). Without keys (allowed for a one-member cluster only:
  the config of a cluster without ``keyFile`` is refused) the HMAC still catches corruption but
  authenticates nothing.

The suspicion rule (fail closed, never two owners as far as this node can tell). With ``heard(X)``
"a packet from X accepted within ``interval x miss``" and ``live`` the members gossip holds alive
or suspect (this node excluded), this node:

1. suspects a live member P it has heard at least once since it joined when it does not hear P
   now and either ``CONFIRMATIONS`` (2) live members it hears miss P too (their latest datagrams
   say so: other paths agree, so neither this node's own link nor lost packets on a path or two
   make a suspicion; with only one member heard beside P, as in a three-node cluster, that one
   suffices) or gossip suspects P too. Alone with P (a two-node cluster) a silent P is suspected
   only once gossip suspects it: a node cannot tell its own dead link from a dead peer without a
   third party. With 10 % loss each way, a false suspicion needs ``miss`` losses in a row on three
   paths at once (two in a three-node cluster). One confirmation was the rule before: the false
   suspicions it let through grew with the cluster, since any one of N - 2 others losing the same
   datagrams sufficed (benchmarks/heartbeat_sim.py); a crash costs no more, since every survivor
   stops hearing P at the same moment and sends its changed missing list at once.
2. is *cut off* when it has two or more live members, has heard some of them before and hears
   none now (its own link, or its own heartbeats, are down). It suspects nobody while cut off,
   even once its own gossip suspects them: nothing is grabbed. It has no quorum (below) either:
   it keeps what it announces and takes nothing, and yields a VIP when the majority's new owner
   announces it on the wire (l2/disagree.py).
3. is suspected by the members it hears whose packets say so (flag 1): it gives up each VIP
   whose next node is one of them; when their packets stop saying so, it takes them back.

Hearing is not being heard, and quorum (nocloudlb.core.quorum, docs/concepts.md "When nodes
disagree"). Flags 4, 8 and 16 were added without changing the format (older receivers ignore them):
``F_DEAF`` (8) when the sender has not heard the recipient within ``interval x miss``, so a node
whose inbound traffic is lost says so in the datagrams it still sends; ``F_NO_QUORUM`` (4) while
the sender is not connected to a majority; ``F_PARTIAL`` (16) when the missing list was cut to fit.
A member is *connected* when it is heard and its latest datagram does not say ``F_DEAF`` (a live
member never heard yet counts on gossip's word until its first datagram); the node has quorum
while itself, the connected members and the witness (``set_witness``, while it answers) are a
strict majority of ``max(configured, known) + witness`` (``set_quorum_basis``). Members heard
whose datagrams say ``F_NO_QUORUM`` are reported (``no_quorum``): the daemon leaves them out of
the election.

Bounded by construction: no datagram exceeds ``MAX_PACKET`` (what a receiver reads): a meta that
does not fit beside the longest fixed part is left to gossip, and a missing list that does not fit
is cut, the part sent rotating from one round to the next; a receiver keeps the parts it saw lately.
Every datagram dropped is counted by reason (``rejected``, ``nocloudlb_heartbeat_rejected_total``)
and logged at most once per reason every ``REJECT_LOG_EVERY`` s.

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

from prometheus_client import Counter

from nocloudlb.core.quorum import has_quorum, quorum_total

from .logs import event

REJECTED = Counter("nocloudlb_heartbeat_rejected", "Heartbeat datagrams dropped, by reason", ["reason"])

MAGIC = b"NLH2"  # its last byte is the format's version; flags 4, 8 and 16 were added compatibly
F_SUSPECT_YOU = 1
F_META = 2
F_NO_QUORUM = 4  # the sender has no quorum now: it takes nothing new, the others leave it out of the election
F_DEAF = 8  # the sender has not heard the recipient within interval x miss (raw, before any rule)
F_PARTIAL = 16  # the missing list was cut to fit the datagram (the names rotate from packet to packet)
MAC_LEN = 16
META_REPEAT = 3
MAX_PACKET = 2048  # the receiver reads at most this; encode never writes more, whatever the cluster size
#: the longest fixed part (names of 255 bytes, counters, the missing count, the HMAC): the meta must fit beside it
_FIXED_MAX = len(MAGIC) + 2 + 255 + 1 + 255 + 24 + 1 + MAC_LEN
#: rejected datagrams are logged once per reason per this many seconds (counted every time)
REJECT_LOG_EVERY = 10.0
#: members heard that must miss a member too before this node suspects it (fewer when fewer are heard: with
#: three nodes the one other; see the rule in the module docstring). With one, the false suspicions from loss
#: grow with the cluster (any one of N - 2 others that also lost the member's last datagrams is enough:
#: benchmarks/heartbeat_sim.py); with two, three paths must lose ``miss`` datagrams in a row at once
CONFIRMATIONS = 2
#: heartbeat timeouts a member must keep saying it has no quorum before it is left out of the election
NO_QUORUM_HOLD = 3
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
    """A datagram that is not a valid heartbeat (the reason in the message; ``reason``: its metric label)."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


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
    no_quorum: bool = False  # F_NO_QUORUM
    deaf: bool = False  # F_DEAF: the sender does not hear the recipient
    partial: bool = False  # F_PARTIAL: ``missing`` is a part of the sender's list


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
def _names(missing: tuple[str, ...], budget: int = MAX_PACKET, rotation: int = 0) -> tuple[bytes, bool]:
    """The missing list's bytes within ``budget`` bytes (count included) and whether it was cut. A list
    that does not fit is taken from position ``rotation x k`` on (``k``: how many names fit from the
    first), wrapping around, as far as it fits: the caller counts ``rotation`` up from one round of
    datagrams to the next, so every name travels in turn."""
    names = [n.encode() for n in missing]
    if any(not 0 < len(n) < 256 for n in names):
        raise ValueError("heartbeat: node names are 1 to 255 bytes")
    if len(names) <= 255 and 1 + sum(1 + len(n) for n in names) <= budget:
        return bytes([len(names)]) + b"".join(bytes([len(n)]) + n for n in names), False
    fit, used = 0, 1
    while fit < min(len(names), 255) and used + 1 + len(names[fit]) <= budget:
        used += 1 + len(names[fit])
        fit += 1
    start = (rotation * max(fit, 1)) % len(names)
    out: list[bytes] = []
    used = 1
    for i in range(len(names)):
        n = names[(start + i) % len(names)]
        if len(out) == 255 or used + 1 + len(n) > budget:
            break
        out.append(bytes([len(n)]) + n)
        used += 1 + len(n)
    return bytes([len(out)]) + b"".join(out), True


def encode(p: Packet, key: bytes, no_quorum: bool = False, deaf: bool = False, rotation: int | None = None) -> bytes:
    """The datagram for ``p``, never longer than MAX_PACKET: a meta that does not fit beside the longest
    fixed part is left out (gossip carries it), and a missing list that does not fit is cut (F_PARTIAL)."""
    raw = b""
    if p.meta is not None:
        raw = json.dumps(p.meta, separators=(",", ":"), sort_keys=True).encode()
        if _FIXED_MAX + 2 + len(raw) > MAX_PACKET:
            raw = b""
    meta_part = struct.pack("!H", len(raw)) + raw if raw else b""
    head = _HEAD.pack(p.boot, p.seq, p.suspicions, p.meta_seq)
    flags = (F_SUSPECT_YOU if p.suspect_you else 0) | (F_META if meta_part else 0) \
        | (F_NO_QUORUM if no_quorum else 0) | (F_DEAF if deaf else 0)
    prefix = _prefix(p.sender, p.recipient, flags)
    budget = MAX_PACKET - len(prefix) - len(head) - len(meta_part) - MAC_LEN
    missing = tuple(p.missing)
    names, partial = _names(missing, budget)
    if partial:  # rotate: this round's datagram carries the next part of the list
        names = _names(missing, budget, p.seq if rotation is None else rotation)[0]
        prefix = _prefix(p.sender, p.recipient, flags | F_PARTIAL)
    body = prefix + head + names + meta_part
    return body + _mac(key).tag(body)


def decode(data: bytes, keys: list[bytes]) -> Packet:
    """The packet in ``data`` once its HMAC verifies with one of ``keys``; PacketError otherwise."""
    if len(data) > MAX_PACKET:
        raise PacketError("too long", "tooLong")
    if len(data) < len(MAGIC) + 4 + _HEAD.size + MAC_LEN or not data.startswith(MAGIC):
        raise PacketError("not a heartbeat", "notHeartbeat")
    body, tag = data[:-MAC_LEN], data[-MAC_LEN:]
    for k in keys:
        if hmac.compare_digest(_mac(k).tag(body), tag):
            break
    else:
        raise PacketError("bad HMAC (another key, or corrupted)", "badMac")
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
                  tuple(missing), bool(flags & F_NO_QUORUM), bool(flags & F_DEAF), bool(flags & F_PARTIAL))


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
    missing_seen: dict[str, float] = field(default_factory=dict)  # names of its cut (partial) lists, when seen
    deaf: bool = True  # its latest datagram says it does not hear this node (F_DEAF); True until one says not
    no_quorum: bool = False  # its latest datagram says it has no quorum (F_NO_QUORUM)
    no_quorum_since: float = 0.0  # since when its datagrams say so


@dataclass(frozen=True)
class HeartbeatView:
    suspected: frozenset[str] = frozenset()  # live members this node suspects (ineligible)
    suspecters: frozenset[str] = frozenset()  # members that suspect this node (none while cut off)
    cut_off: bool = False
    metas: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # current meta received by heartbeat
    # quorum (nocloudlb.core.quorum): False until the first evaluation, so nothing is taken before it
    quorum: bool = False
    connected: frozenset[str] = frozenset()  # members heard that hear this node (the votes beside its own)
    no_quorum: frozenset[str] = frozenset()  # members heard whose datagrams say they have no quorum (ineligible)
    deaf_to: frozenset[str] = frozenset()  # members heard that say they do not hear this node (inbound loss there)
    votes: int = 1
    total: int = 1


class Heartbeat:
    """See the module docstring. ``set_peers`` from the decision thread at every reconcile."""

    def __init__(self, name: str, bind_ip: str, port: int, keys: list[str] | None, interval: float, miss: int,
                 on_change: Callable[[], None] = lambda: None, logger: logging.Logger | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._clock = clock  # monotonic seconds; a virtual clock in benchmarks/heartbeat_sim.py
        self.bind_ip = bind_ip
        self.port = port
        self.interval = float(interval)
        self.miss = int(miss)
        self.timeout = self.interval * self.miss
        self.on_change = on_change
        self.on_quorum: Callable[[], None] | None = None  # called when quorum is gained back (not at start)
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
        self._heard: frozenset[str] = frozenset()  # members heard at the last evaluation (F_DEAF for the others)
        self._round = 0  # rounds of datagrams sent (a cut missing list rotates by it)
        self._configured = 1  # members configured (the join list with this node): the quorum's floor
        self._known = 1  # members gossip knows (alive, suspect, dead; not left), this node included
        self._witness: Callable[[], bool] | None = None  # the witness answers now (see set_witness)
        self._retired: list[bytes] = []  # keys dropped from the ring: refused, named as such in the counters
        self._logged_reject: dict[str, float] = {}  # reason -> when a rejection was last logged
        self.counters = {"sent": 0, "received": 0, "rejectedAuth": 0, "rejectedReplay": 0, "rejectedOther": 0,
                         "suspicions": 0}
        self.rejected: dict[str, int] = {}  # reason -> datagrams dropped (tooLong, badMac, retiredKey, ...)

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
        now = self._clock()
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
        self._send_all(self._clock())

    def set_keys(self, keys: list[str] | None) -> None:
        new = derive_keys(keys)
        self._retired = [k for k in [*self._keys, *self._retired] if k not in new and k][:8]
        self._keys = new

    def set_quorum_basis(self, configured: int, known: int) -> None:
        """The members configured (join list and this node, less those that left gracefully) and known to
        gossip (alive, suspect or dead; this node included)."""
        configured, known = max(1, int(configured)), max(1, int(known))
        if (configured, known) != (self._configured, self._known):
            self._configured, self._known = configured, known
            self._dirty = True
            self._kick.set()

    def set_witness(self, answers: Callable[[], bool] | None) -> None:
        """A witness (one more vote while ``answers()``); call ``witness_changed`` when its answer changes."""
        self._witness = answers
        self._dirty = True

    def witness_changed(self) -> None:
        self._dirty = True
        self._kick.set()

    # -- outputs ---------------------------------------------------------------------------
    def view(self) -> HeartbeatView:
        return self._view

    def status(self) -> dict[str, Any]:
        now = self._clock()
        v = self._view
        with self._lock:
            peers = {n: {"heardMsAgo": round((now - p.heard) * 1000) if p.heard_once else None,
                         "suspected": n in v.suspected, "suspectsMe": p.suspects_me,
                         "hearsMe": p.heard_once and not p.deaf, "quorum": not p.no_quorum}
                     for n, p in sorted(self._peers.items())}
        return {"bind": f"{self.bind_ip}:{self.port}", "interval": self.interval, "miss": self.miss,
                "cutOff": v.cut_off, "suspected": sorted(v.suspected), "suspecters": sorted(v.suspecters),
                "quorum": {"has": v.quorum, "votes": v.votes, "total": v.total, "connected": sorted(v.connected),
                           "witness": None if self._witness is None else bool(self._witness())},
                "noQuorum": sorted(v.no_quorum), "deafTo": sorted(v.deaf_to),
                "peers": peers, "counters": dict(self.counters), "rejected": dict(self.rejected)}

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        next_send = self._clock()
        ready: list[Any] = []
        while not self._stop.is_set():
            try:
                assert self._sock is not None
                if self._sock.fileno() < 0 and self._news is not None:
                    self._news.close()  # the main socket closed (a test's dead node): no news either
                now = self._clock()
                tick = now >= next_send
                # news at once; routine datagrams now too, unless quiet and between ticks
                self._receive_all(routine=tick or not self._quiet or self._sock in ready,
                                  news=self._news is not None and (self._news in ready or not self._quiet))
                if tick:
                    self._send_all(now)
                    next_send = max(next_send + self.interval, now + self.interval / 4)
                now = self._clock()
                if self._dirty or now >= self._deadline:
                    self._evaluate(now)
                self._quiet = self._news is not None and self._is_quiet(now)
                # quiet: every member was heard within QUIET_LATE intervals, so no timeout ends before the next
                # tick (the deadline kept from the last evaluation is older: it is checked at that tick)
                until = next_send if self._quiet else min(next_send, self._deadline)
                wait = max(0.0, until - self._clock())
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
        if v.suspected or v.suspecters or v.cut_off or self._missing or not v.quorum or v.no_quorum or v.deaf_to:
            return False
        late = now - QUIET_LATE * self.interval
        with self._lock:
            if not self._peers:
                return False
            for p in self._peers.values():
                if not p.heard_once or p.heard < late or p.missing or p.suspects_me or p.deaf or p.no_quorum:
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
                out.append((p.addr, pkt, name not in self._heard))
            key = self._keys[0]
            no_quorum = not view.quorum
            self._round += 1
            rotation = self._round
        for addr, pkt, deaf in out:
            try:
                sock.sendto(encode(pkt, key, no_quorum=no_quorum, deaf=deaf, rotation=rotation), addr)
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
                now = self._clock()
                for level, kind, raw in anc:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                        sec, nsec = _TIMESPEC.unpack_from(raw)
                        # the arrival time: at most a timeout/2 ago (a realtime clock step counts as now)
                        age = min(max(time.time() - (sec + nsec / 1e9), 0.0), self.timeout / 2)
                        now -= age
                        break
                changed |= self._accept(data, now)
        if changed:
            self._evaluate(self._clock(), force=True)

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
            reason = exc.reason
            if reason == "badMac" and self._retired:
                body, tag = data[:-MAC_LEN], data[-MAC_LEN:]
                if any(hmac.compare_digest(_mac(k).tag(body), tag) for k in self._retired):
                    reason = "retiredKey"
            self._reject(reason, str(exc))
            return False
        if pkt.recipient != self.name:
            self._reject("notForMe", f"addressed to {pkt.recipient[:64]!r}")
            return False
        with self._lock:
            p = self._peers.get(pkt.sender)
            if p is None:  # not a live member (yet): gossip decides membership
                self._reject("unknownSender", f"from {pkt.sender[:64]!r}, not a live member")
                return False
            if (pkt.boot, pkt.seq) <= (p.boot, p.seq):
                self._reject("oldBoot" if pkt.boot < p.boot else "replay", f"from {pkt.sender[:64]!r}")
                return False
            if pkt.boot != p.boot:
                p.meta, p.meta_seq = None, -1  # a restarted member: its old meta means nothing
            if not p.heard_once or now - p.heard > self.timeout or p.suspects_me != pkt.suspect_you:
                self._dirty = True  # heard again (or for the first time), or its suspicion of this node changed
            p.boot, p.seq = pkt.boot, pkt.seq
            p.heard, p.heard_once = max(p.heard, now), True
            p.suspects_me = pkt.suspect_you
            p.their_suspicions = pkt.suspicions
            if p.deaf != pkt.deaf or p.no_quorum != pkt.no_quorum:
                if pkt.no_quorum and not p.no_quorum:
                    p.no_quorum_since = now
                p.deaf, p.no_quorum = pkt.deaf, pkt.no_quorum
                self._dirty = True
            changed = False
            if pkt.partial:  # a part of its list: the parts seen lately together (names rotate per packet)
                keep = now - max(2 * self.timeout, 20 * self.interval)
                p.missing_seen = {n: t for n, t in p.missing_seen.items() if t >= keep}
                p.missing_seen.update(dict.fromkeys(pkt.missing, now))
                missing = frozenset(p.missing_seen)
            else:
                p.missing_seen = {}
                missing = frozenset(pkt.missing)
            if missing != p.missing:
                p.missing = missing
                changed = self._dirty = True
            if pkt.meta is not None and (p.meta is None or p.meta[0] != pkt.meta_seq):
                p.meta = (pkt.meta_seq, pkt.meta)
                changed = True
            if pkt.meta_seq != p.meta_seq:
                p.meta_seq = pkt.meta_seq
                changed = True
        self.counters["received"] += 1
        return changed

    def _reject(self, reason: str, detail: str) -> None:
        """Count a dropped datagram by reason (metric, status) and log it at most once per reason per
        REJECT_LOG_EVERY s: nothing a datagram says changes what this node believes."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        legacy = "rejectedAuth" if reason in ("badMac", "retiredKey") else \
            "rejectedReplay" if reason in ("replay", "oldBoot") else "rejectedOther"
        self.counters[legacy] += 1
        REJECTED.labels(reason).inc()
        now = self._clock()
        if now - self._logged_reject.get(reason, -1e9) >= REJECT_LOG_EVERY:
            self._logged_reject[reason] = now
            event(self.log, "heartbeatRejected", detail[:200], logging.WARNING, reason=reason,
                  count=self.rejected[reason])

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
            need = min(CONFIRMATIONS, len(heard))  # the other opinions a suspicion needs (0: gossip's alone)
            for n in () if cut_off else missing:  # cut off: this node cannot judge anyone, it grabs nothing
                if live[n].gossip_state == "suspect" or (
                        need and sum(1 for r in heard if n in live[r].missing) >= need):
                    suspected.add(n)
            # a cut-off node keeps what it holds and takes nothing (no quorum): it does not yield to anyone
            # it cannot hear; the majority's new owner announcing on the wire makes it yield (l2/mode.py)
            suspecters = set() if cut_off else {n for n in heard if live[n].suspects_me}
            # a live member never heard by heartbeat (just joined, or it runs without heartbeats) counts on
            # gossip's word until its first datagram: gossip reached it, and a heartbeat will soon say more
            connected = frozenset(n for n in heard if not live[n].deaf) | frozenset(
                n for n, p in live.items() if not p.heard_once and p.gossip_state == "alive")
            deaf_to = frozenset(n for n in heard if live[n].deaf)
            # reported without quorum for NO_QUORUM_HOLD timeouts: a blip under loss (both links missing four
            # datagrams at once) does not move its VIPs; a node really cut off, or deaf, is left out soon
            hold = NO_QUORUM_HOLD * self.timeout
            no_quorum = frozenset(n for n in heard if live[n].no_quorum and now - live[n].no_quorum_since >= hold)
            witness_up = bool(self._witness()) if self._witness is not None else False
            known = max(self._known, 1 + len(live))
            total = quorum_total(self._configured, known, self._witness is not None)
            quorum = has_quorum(len(connected), self._configured, known, self._witness is not None, witness_up)
            votes = 1 + len(connected) + (1 if witness_up else 0)
            self._heard = frozenset(heard)
            for n in suspected - self._view.suspected:
                live[n].my_suspicions += 1
            metas = {n: p.meta[1] for n, p in live.items() if p.meta is not None and p.meta[0] == p.meta_seq}
            ends = [p.heard + self.timeout for p in live.values() if p.heard_once and p.heard + self.timeout > now]
            ends += [p.no_quorum_since + hold for p in live.values() if p.no_quorum and p.no_quorum_since + hold > now]
            self._deadline = min(ends) + 0.001 if ends else now + 1.0
        view = HeartbeatView(frozenset(suspected), frozenset(suspecters), cut_off, metas, quorum, connected,
                             no_quorum, deaf_to, votes, total)
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
        if view.quorum != old.quorum:
            event(self.log, "quorumGained" if view.quorum else "quorumLost",
                  "connected to a majority: may take VIPs" if view.quorum else
                  "not connected to a majority: keeping the VIPs held, taking none",
                  logging.INFO if view.quorum else logging.WARNING, votes=view.votes, total=view.total,
                  connected=sorted(view.connected))
            send_now = True  # the peers learn it at once (F_NO_QUORUM)
            if view.quorum and self.on_quorum is not None:
                self.on_quorum()  # back in the majority: what it kept may have moved meanwhile (re-announce)
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
                      "this node hears no member's heartbeat: keeping what it holds, taking nothing" if view.cut_off
                      else "this node hears members' heartbeats again",
                      logging.WARNING if view.cut_off else logging.INFO)
            if view.suspecters != old.suspecters:
                event(self.log, "heartbeatSuspectedBy", suspecters=sorted(view.suspecters),
                      level=logging.WARNING if view.suspecters else logging.INFO)
        if view != old:
            self.on_change()
        if send_now:  # a second opinion travels at once (peers confirm a suspicion a datagram later)
            self._send_all(now)
