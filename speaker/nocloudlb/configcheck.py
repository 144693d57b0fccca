"""The checks a config passes beyond its schema, shared by a (re)load and ``nocloudlb validate``.

- ``label_keys``, ``local_services``, ``health_specs``: what the election, the metadata and the health
  checker read from a parsed config;
- ``metadata_problems``: a config whose gossiped metadata could not fit kinship's 512 bytes, or whose
  Local-policy services share a health id, is refused;
- ``check_extra``: the key file, the health checks, the metadata size, the held addresses, the BGP
  password files; returns the keys read and the problems found;
- ``validate``: the whole check of one file, as a (re)load does it.

Pure functions of the config (and the files it names): no speaker state.
"""

from __future__ import annotations

from typing import Any

from nocloudlb.core.allocation import held_address_problems
from nocloudlb.core.bgp import read_password_files  # mode: bgp
from nocloudlb.core.election import DRAIN_LABEL
from nocloudlb.core.errors import ConfigError

from .config import SpeakerConfig
from .health import CheckSpec
from .membership import KeyFileError, read_key_file
from .metadata import MAX_META, MetaCodec


def label_keys(parsed: Any) -> set[str]:
    """Label keys the election reads: the drain label and those in advertisement node selectors."""
    keys = {DRAIN_LABEL}
    for adv in parsed.l2_advertisements:
        for sel in adv.node_selectors or []:
            keys.update((sel.get("matchLabels") or {}).keys())
            keys.update(e.get("key") for e in sel.get("matchExpressions") or [] if e.get("key"))
    # mode: bgp - BGPPeer/BGPAdvertisement node selectors and the flow-handover switch (bgp/flows.py)
    for item in list(getattr(parsed, "bgp_advertisements", [])) + list(getattr(parsed, "bgp_peers", [])):
        for sel in item.node_selectors or []:
            keys.update((sel.get("matchLabels") or {}).keys())
            keys.update(e.get("key") for e in sel.get("matchExpressions") or [] if e.get("key"))
    if getattr(parsed, "bgp_peers", None):
        keys.add("nocloud.io/bgp-flow-handover")
    return keys


def local_services(parsed: Any) -> list[str]:
    return [s.key for s in parsed.services if s.traffic_policy == "Local"]


def health_specs(parsed: Any) -> tuple[dict[str, CheckSpec | None], list[str]]:
    """Local-policy services -> check spec (None = no check, counts healthy); with problems found."""
    specs: dict[str, CheckSpec | None] = {}
    errors: list[str] = []
    for svc in parsed.services:
        if svc.traffic_policy != "Local":
            continue
        raw = svc.health_check
        if not raw:
            specs[svc.key] = None
            continue
        try:
            specs[svc.key] = CheckSpec.from_dict(f"Service {svc.key}", raw)
        except ValueError as exc:
            errors.append(str(exc))
    return specs, errors


def metadata_problems(cfg: SpeakerConfig) -> list[str]:
    """A config whose gossiped metadata could outgrow kinship's 512 bytes is refused at load (a node
    that cannot publish would decide from a state its peers do not see), and so is one where two
    Local-policy services share a health id."""
    codec = MetaCodec(local_services(cfg.parsed), label_keys(cfg.parsed), cfg.digest)
    errors = [f"Service {b}: its health id collides with Service {a}'s; rename one of them"
              for a, b in codec.collisions]
    worst = codec.worst_case_size()
    if worst > MAX_META:
        errors.append(
            f"config: the metadata this node gossips could reach {worst} bytes, more than kinship's {MAX_META}: "
            f"{len(codec.order_ids)} Local-policy services (one bit each) and the node-selector label keys "
            f"{sorted(codec.label_keys)} (values up to 63 characters each) do not fit; use fewer Local-policy "
            "services or fewer or shorter node-selector label keys")
    return errors


def check_extra(cfg: SpeakerConfig) -> tuple[list[str] | None, list[str]]:
    """Checks beyond the schema: the key file, the health checks, the metadata size. Returns (keys, errors)."""
    errors: list[str] = []
    keys = None
    if cfg.key_file:
        try:
            keys = read_key_file(cfg.key_file)
        except KeyFileError as exc:
            errors.append(str(exc))
    errors.extend(health_specs(cfg.parsed)[1])
    errors.extend(metadata_problems(cfg))
    errors.extend(held_address_problems(cfg.parsed.services))  # one VIP, one leader: sharing as MetalLB allows
    if cfg.parsed is not None:  # mode: bgp - BGPPeer passwordFile, read where it lives
        errors.extend(read_password_files(cfg.parsed))
    return keys, errors


def validate(path: str) -> tuple[bool, list[str]]:
    """``nocloudlb validate``: the same checks as a (re)load."""
    from .config import load

    try:
        cfg = load(path)
    except ConfigError as exc:
        return False, list(exc.errors)
    _keys, errors = check_extra(cfg)
    return not errors, errors
