"""Member metadata: what every speaker tells the others in kinship's 512-byte tags.

Keys (all short, values are ASCII):

``v``  encoding version ("1").
``c``  hash of the whole resources list (8 hex digits): peers running another config
       version are detected and reported.
``s``  hash of the ordered list of Local-policy service keys (8 hex digits): the index
       space of ``h``.
``h``  per-service local health as a bitmap, bit *i* set when the *i*-th Local-policy
       service (sorted "namespace/name" keys) passes its health check on this node;
       zlib-compressed, then base64. 1,000 services take at most 184 characters (a
       random bitmap), usually ~20 (all healthy or all failing compress to a few bytes).
``l``  the labels that matter for election, as compact JSON: the drain label and the
       label keys used by the L2Advertisements' node selectors. Other labels stay local.

A peer whose ``s`` differs from ours has a bitmap we cannot read: it is counted as having
no healthy Local service until both run the same config (conservative: Local-policy VIPs
never go to a node whose health is unknown).
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

VERSION = "1"


def list_hash(keys: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:8]


def encode_bitmap(order: list[str], healthy: Iterable[str]) -> str:
    index = {key: i for i, key in enumerate(order)}
    bits = bytearray((len(order) + 7) // 8)
    for key in healthy:
        i = index.get(key)
        if i is not None:
            bits[i // 8] |= 1 << (i % 8)
    return base64.b64encode(zlib.compress(bytes(bits), 9)).decode("ascii")


def decode_bitmap(order: list[str], text: str) -> frozenset[str]:
    bits = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    return frozenset(key for i, key in enumerate(order) if i // 8 < len(bits) and bits[i // 8] >> (i % 8) & 1)


@dataclass(frozen=True)
class PeerInfo:
    labels: dict[str, str]
    healthy: frozenset[str]
    config_hash: str
    health_known: bool  # False when the peer's Local-service list differs from ours
    error: str = ""


class MetaCodec:
    """Encoder/decoder bound to one config: its Local-service order and relevant label keys."""

    def __init__(self, local_services: Iterable[str], label_keys: Iterable[str], config_hash: str) -> None:
        self.order = sorted(set(local_services))
        self.order_hash = list_hash(self.order)
        self.label_keys = frozenset(label_keys)
        self.config_hash = config_hash

    def encode(self, labels: Mapping[str, str], healthy: Iterable[str]) -> dict[str, str]:
        relevant = {k: v for k, v in sorted(labels.items()) if k in self.label_keys}
        return {
            "v": VERSION,
            "c": self.config_hash,
            "s": self.order_hash,
            "h": encode_bitmap(self.order, healthy),
            "l": json.dumps(relevant, separators=(",", ":"), ensure_ascii=True),
        }

    def decode(self, meta: Mapping[str, str]) -> PeerInfo:
        if meta.get("v") != VERSION:
            return PeerInfo({}, frozenset(), meta.get("c", ""), False,
                            f"unknown metadata version {meta.get('v')!r:.40} (expected {VERSION!r})")  # edges: bounded
        try:
            labels = json.loads(meta.get("l", "{}"))
            if not isinstance(labels, dict):
                raise ValueError("labels are not an object")
            labels = {str(k): str(v) for k, v in labels.items()}
        except (ValueError, RecursionError) as exc:  # edges (issue 8 fuzz): deep JSON raised RecursionError
            return PeerInfo({}, frozenset(), meta.get("c", ""), False, f"bad labels in metadata: {exc}")
        if meta.get("s") != self.order_hash:
            return PeerInfo(labels, frozenset(), meta.get("c", ""), False,
                            "Local-policy service list differs from ours (another config version)")
        try:
            healthy = decode_bitmap(self.order, meta.get("h", ""))
        except (ValueError, zlib.error) as exc:
            return PeerInfo(labels, frozenset(), meta.get("c", ""), False, f"bad health bitmap: {exc}")
        return PeerInfo(labels, healthy, meta.get("c", ""), True)
