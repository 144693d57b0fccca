"""Member metadata: what every speaker tells the others in kinship's 512-byte tags.

Keys (all short, values are ASCII):

``v``  encoding version ("1").
``c``  hash of the whole resources list (8 hex digits): peers running another config
       version are detected and reported.
``s``  hash of the ordered list of Local-policy service ids (8 hex digits): the index
       space of ``h``.
``h``  per-service local health as a bitmap, bit *i* set when the *i*-th Local-policy
       service passes its health check on this node; zlib-compressed, then base64. 1,000
       services take at most 184 characters (a random bitmap), usually ~20 (all healthy or
       all failing compress to a few bytes).
``a``  / ``r``  the ids of the Local-policy services this node's config added / removed
       since the config it ran before (base64 of 3-byte ids; absent when there was none or
       more than ``MAX_DIFF``).
``l``  the labels that matter for election, as compact JSON: the drain label and the
       label keys used by the L2Advertisements' node selectors. Other labels stay local.
``m``  the MACs of the interfaces this node announces VIPs on (base64 of 6-byte MACs, at
       most ``MAX_MACS``): peers recognise its answers by them (layer-2 mode).
``x``  the VIPs this node leads but does not answer on the wire (layer-2 mode: its RFC 5227 check
       runs, or another MAC answers them, a conflict): base64 of 4-byte keys (``off_wire_key``), at
       most ``MAX_OFF_WIRE``, or ``*`` for more (or when the list does not fit; nothing when ``*`` does
       not fit either: only a config within 6 bytes of the bound, and the node that found a conflict
       still remembers it, l2/offwire.py). A member that takes
       such a VIP from this node runs the check first instead of announcing at once (the skip is for
       addresses the old leader answered): the address was never ours on the wire, so skipping the
       check would fight a host that owns it. A reader that cannot decode ``x`` reads ``*``.
``n``  the speaker's version (``nocloudlb.__version__``, at most ``MAX_VERSION`` printable
       ASCII characters) and
``p``  its wire protocol's number (``nocloudlb.WIRE_VERSION``, decimal): shown per member by
       ``nocloudlb status`` and ``--cluster``, so a cluster mid-upgrade is visible. Both were added
       after the first release: a member that publishes neither runs a speaker from before them;
       an older reader ignores them (a reader only looks up the keys it knows), which is what lets
       keys be added within ``v`` "1" (docs/speaker.md, "Wire compatibility").

Stable per-service ids. Each Local-policy service has a stable id, the first 3 bytes of
``sha256(namespace/name)``; the bitmap is ordered by id. A config rollout that adds (or
removes) a Local service changes ``s``; a peer still reads the other services' health:
a reader tries, in turn, its own id list, the list of the config it ran before, and its own
list with the publisher's ``a``/``r`` applied (the publisher's list when the reader runs the
publisher's previous config), and uses the one whose hash is ``s``. Only a service a peer
does not know is unknown there (counted unhealthy: conservative, Local-policy VIPs never go
to a node whose health for them is unknown). Two services with one id are refused at load.

``worst_case_size`` is the largest metadata a config can produce (every selector label set
to a 63-character value, a bitmap that does not compress, the most MACs; ``a``/``r`` and ``x``
are sent only when they fit, so adding ``x`` refused no config that loaded before);
a config whose worst case does not fit in ``MAX_META`` bytes is refused at load, so
publishing never fails for size at run time.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from . import WIRE_VERSION, __version__

VERSION = "1"
MAX_META = 512  # kinship's limit on encoded metadata
MAX_MACS = 4
MAX_DIFF = 16
MAX_LABEL_VALUE = 63
MAX_VERSION = 32
MAX_OFF_WIRE = 8
ALL_OFF_WIRE = "*"  # ``x``: more addresses than travel, or an ``x`` that does not decode


def version_text(text: object) -> str:
    """A published speaker version as shown: printable ASCII only, at most ``MAX_VERSION`` characters."""
    return "".join(ch for ch in str(text) if " " <= ch <= "~")[:MAX_VERSION]


def wire_number(text: object) -> int | None:
    """A published wire protocol number, None when absent or not a small decimal number."""
    value = str(text)
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 6 else None


def list_hash(keys: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:8]


def service_id(key: str) -> str:
    """The stable id of a Local-policy service (6 hex digits)."""
    return hashlib.sha256(key.encode()).hexdigest()[:6]


def encode_bitmap(order: list[str], healthy: Iterable[str]) -> str:
    index = {key: i for i, key in enumerate(order)}
    bits = bytearray((len(order) + 7) // 8)
    for key in healthy:
        i = index.get(key)
        if i is not None:
            bits[i // 8] |= 1 << (i % 8)
    return base64.b64encode(zlib.compress(bytes(bits), 9)).decode("ascii")


def decode_bitmap(order: list[str], text: str) -> frozenset[str]:
    bits = zlib.decompressobj().decompress(base64.b64decode(text.encode("ascii"), validate=True), 1 << 16)
    return frozenset(key for i, key in enumerate(order) if i // 8 < len(bits) and bits[i // 8] >> (i % 8) & 1)


def _pack_ids(ids: Iterable[str]) -> str:
    return base64.b64encode(b"".join(bytes.fromhex(i) for i in sorted(ids))).decode("ascii")


def _unpack_ids(text: str) -> set[str]:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % 3:
        raise ValueError("service ids are 3 bytes each")
    return {raw[i:i + 3].hex() for i in range(0, len(raw), 3)}


def pack_macs(macs: Iterable[bytes]) -> str:
    """The first ``MAX_MACS`` distinct MACs, in the order given (the caller puts the ones in use first)."""
    return base64.b64encode(b"".join(list(dict.fromkeys(macs))[:MAX_MACS])).decode("ascii")


def unpack_macs(text: str) -> tuple[bytes, ...]:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % 6 or len(raw) > 6 * MAX_MACS:
        raise ValueError(f"MACs are 6 bytes each, at most {MAX_MACS}")
    return tuple(dict.fromkeys(raw[i:i + 6] for i in range(0, len(raw), 6)))


def off_wire_key(ip: str) -> bytes:
    """The 4 bytes ``x`` carries for a VIP: a hash of its canonical text (one length for IPv4 and IPv6)."""
    return hashlib.sha256(str(ipaddress.ip_address(ip)).encode()).digest()[:4]


def pack_off_wire(ips: Iterable[str]) -> str:
    keys = sorted({off_wire_key(ip) for ip in ips})
    return base64.b64encode(b"".join(keys)).decode("ascii") if len(keys) <= MAX_OFF_WIRE else ALL_OFF_WIRE


def unpack_off_wire(text: str) -> frozenset[bytes] | None:
    """The keys in ``x``; None for ``*`` (any VIP that node leads may be off the wire)."""
    if text == ALL_OFF_WIRE:
        return None
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % 4 or len(raw) > 4 * MAX_OFF_WIRE:
        raise ValueError(f"off-wire keys are 4 bytes each, at most {MAX_OFF_WIRE}")
    return frozenset(raw[i:i + 4] for i in range(0, len(raw), 4))


def meta_size(meta: Mapping[str, str]) -> int:
    """An upper bound of kinship's encoded size of ``meta`` (measured: 1 + 2 per entry + text; 4 per
    entry here to cover longer length prefixes)."""
    return 1 + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in meta.items())


@dataclass(frozen=True)
class PeerInfo:
    labels: dict[str, str]
    healthy: frozenset[str]
    config_hash: str
    health_known: bool  # False when no id list we know has the peer's hash
    error: str = ""
    macs: tuple[bytes, ...] = ()  # in the order published: the ones VIPs are announced from first
    version: str = ""  # the speaker's version ("n"), "" when the member publishes none (an older speaker)
    wire: int | None = None  # its wire protocol's number ("p"), None when it publishes none
    off_wire: frozenset[bytes] | None = frozenset()  # ``x``: off_wire_key of each; None: any may be

    def leads_off_wire(self, ip: str) -> bool:
        """This member said it leads ``ip`` without answering it (its check runs, or another MAC answers)."""
        return self.off_wire is None or (bool(self.off_wire) and off_wire_key(ip) in self.off_wire)


class MetaCodec:
    """Encoder/decoder bound to one config: its Local-service ids and relevant label keys.

    ``previous``: the Local-policy service keys of the config this node ran before (for the
    ``a``/``r`` diff and to read peers that still run it)."""

    def __init__(self, local_services: Iterable[str], label_keys: Iterable[str], config_hash: str,
                 previous: Iterable[str] | None = None) -> None:
        keys = sorted(set(local_services))
        self.ids = {key: service_id(key) for key in keys}
        by_id: dict[str, str] = {}
        self.collisions: list[tuple[str, str]] = []
        for key, sid in self.ids.items():
            if sid in by_id:
                self.collisions.append((by_id[sid], key))
            by_id[sid] = key
        self.by_id = by_id
        self.order_ids = sorted(by_id)
        self.order = [by_id[i] for i in self.order_ids]  # keys, in id order
        self.order_hash = list_hash(self.order_ids)
        self.label_keys = frozenset(label_keys)
        self.config_hash = config_hash
        self.prev_ids: list[str] | None = None
        self.added: set[str] = set()
        self.removed: set[str] = set()
        if previous is not None:
            prev = {service_id(k) for k in set(previous)}
            self.prev_ids = sorted(prev)
            self.added, self.removed = set(by_id) - prev, prev - set(by_id)

    def encode(self, labels: Mapping[str, str], healthy: Iterable[str],
               macs: Iterable[bytes] = (), off_wire: Iterable[str] = ()) -> dict[str, str]:
        relevant = {k: v for k, v in sorted(labels.items()) if k in self.label_keys}
        meta = {
            "v": VERSION,
            "c": self.config_hash,
            "s": self.order_hash,
            "h": encode_bitmap(self.order, healthy),
            "l": json.dumps(relevant, separators=(",", ":"), ensure_ascii=True),
            "n": version_text(__version__),
            "p": str(WIRE_VERSION),
        }
        mac_list = list(macs)
        if mac_list:
            meta["m"] = pack_macs(mac_list)
        off = list(off_wire)
        if off:  # the list when it fits, else "*" when that fits
            packed = pack_off_wire(off)
            for value in (packed, ALL_OFF_WIRE):
                if meta_size({**meta, "x": value}) <= MAX_META:
                    meta["x"] = value
                    break
        if (self.added or self.removed) and len(self.added) <= MAX_DIFF and len(self.removed) <= MAX_DIFF:
            diff = {"a": _pack_ids(self.added)} if self.added else {}
            if self.removed:
                diff["r"] = _pack_ids(self.removed)
            if meta_size(meta | diff) <= MAX_META:  # only when it fits: it helps a rollout, it is not needed
                meta.update(diff)
        return meta

    def worst_case_size(self) -> int:
        """The size of the largest metadata this config can produce (see the module docstring)."""
        n = len(self.order_ids)
        raw = (n + 7) // 8
        bitmap = 4 * ((raw + 11 + 2) // 3)  # zlib stores what it cannot compress: at most +11 bytes
        meta = {"v": VERSION, "c": "0" * 8, "s": "0" * 8, "h": "x" * bitmap,
                "l": json.dumps({k: "v" * MAX_LABEL_VALUE for k in sorted(self.label_keys)},
                                separators=(",", ":"), ensure_ascii=True),
                "m": "x" * (4 * ((6 * MAX_MACS + 2) // 3)), "n": "x" * MAX_VERSION, "p": "9" * 6}
        return meta_size(meta)

    def _orders(self, meta: Mapping[str, str]) -> list[list[str]]:
        """Id lists the publisher may have used, most likely first."""
        out = [self.order_ids]
        if self.prev_ids is not None:
            out.append(self.prev_ids)
        try:
            added = _unpack_ids(meta["a"]) if meta.get("a") else set()
            removed = _unpack_ids(meta["r"]) if meta.get("r") else set()
        except ValueError:
            return out
        if added or removed:
            out.append(sorted((set(self.order_ids) | added) - removed))
        return out

    def decode(self, meta: Mapping[str, str]) -> PeerInfo:
        info = self._decode(meta)
        version, wire = version_text(meta.get("n", "")), wire_number(meta.get("p", ""))
        if version or wire is not None:
            info = replace(info, version=version, wire=wire)
        if meta.get("x"):
            try:
                off_wire = unpack_off_wire(str(meta["x"]))
            except ValueError:  # binascii.Error and UnicodeError are ValueErrors
                off_wire = None  # unreadable: any VIP that node leads may be off the wire (check, never fight)
            info = replace(info, off_wire=off_wire)
        return info

    def _decode(self, meta: Mapping[str, str]) -> PeerInfo:
        chash = str(meta.get("c", ""))
        if meta.get("v") != VERSION:
            return PeerInfo({}, frozenset(), chash, False,
                            f"unknown metadata version {str(meta.get('v'))[:20]!r} (expected {VERSION!r})")
        try:
            labels = json.loads(meta.get("l", "{}"))
            if not isinstance(labels, dict):
                raise ValueError("labels are not an object")
            labels = {str(k): str(v) for k, v in labels.items()}
        except (ValueError, RecursionError) as exc:
            return PeerInfo({}, frozenset(), chash, False, f"bad labels in metadata: {str(exc)[:200]}")
        macs: tuple[bytes, ...] = ()
        if meta.get("m"):
            try:
                macs = unpack_macs(meta["m"])
            except ValueError:
                macs = ()
        order = next((o for o in self._orders(meta) if list_hash(o) == meta.get("s")), None)
        if order is None:
            return PeerInfo(labels, frozenset(), chash, False,
                            "Local-policy service list differs from ours (another config version)", macs)
        try:
            bits = decode_bitmap(order, meta.get("h", ""))
        except (ValueError, zlib.error) as exc:
            return PeerInfo(labels, frozenset(), chash, False, f"bad health bitmap: {str(exc)[:200]}", macs)
        healthy = frozenset(self.by_id[i] for i in bits if i in self.by_id)
        return PeerInfo(labels, healthy, chash, True, "", macs)
