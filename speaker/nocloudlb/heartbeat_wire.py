"""The heartbeat's wire format and its HMAC (pure): encode and decode a datagram, and read the ones
addressed to this node (the routine fast path, then the full decode). The format, the flags and the
bounds are described in heartbeat.py's module docstring."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import struct
from typing import NamedTuple

MAGIC = b"NLH2"  # its last byte is the format's version; flags 4, 8 and 16 were added compatibly
F_SUSPECT_YOU = 1
F_META = 2
F_NO_QUORUM = 4  # the sender has no quorum now: it takes nothing new, the others leave it out of the election
F_DEAF = 8  # the sender has not heard the recipient within interval x miss (raw, before any rule)
F_PARTIAL = 16  # the missing list was cut to fit the datagram (the names rotate from packet to packet)
MAC_LEN = 16
MAX_PACKET = 2048  # the receiver reads at most this; encode never writes more, whatever the cluster size
#: the longest fixed part (names of 255 bytes, counters, the missing count, the HMAC): the meta must fit beside it
_FIXED_MAX = len(MAGIC) + 2 + 255 + 1 + 255 + 24 + 1 + MAC_LEN
_HEAD = struct.Struct("!QQII")  # boot, seq, suspicions, meta seq


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


class Reader:
    """Reads the datagrams addressed to ``name``: a routine datagram from a known sender is checked
    against the bytes ``encode`` gives for it, anything else is decoded. ``keys`` verify (the first
    signs); ``retired`` are keys dropped from the ring, named as such when a datagram carries one."""

    def __init__(self, name: str, keys: list[bytes]) -> None:
        self.name = name
        self.keys = keys
        self.retired: list[bytes] = []  # keys dropped from the ring: refused, named as such in the counters
        self._prefixes: dict[bytes, bytes] = {}  # sender name -> a routine datagram's first bytes to this node

    def set_keys(self, new: list[bytes]) -> None:
        self.retired = [k for k in [*self.keys, *self.retired] if k not in new and k][:8]
        self.keys = new

    def read(self, data: bytes) -> Packet:
        """The packet in ``data``; PacketError (its ``reason``: retiredKey for a key dropped lately) otherwise."""
        try:
            return self.routine(data) or decode(data, self.keys)
        except PacketError as exc:
            if exc.reason == "badMac" and self.retired:
                body, tag = data[:-MAC_LEN], data[-MAC_LEN:]
                if any(hmac.compare_digest(_mac(k).tag(body), tag) for k in self.retired):
                    raise PacketError(str(exc), "retiredKey") from None
            raise

    def routine(self, data: bytes) -> Packet | None:
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
        for k in self.keys:
            if hmac.compare_digest(_mac(k).tag(body), tag):
                boot, seq, suspicions, meta_seq = _HEAD.unpack_from(data, n)
                return Packet(sender.decode(), self.name, boot, seq, suspicions, meta_seq)
        return None
