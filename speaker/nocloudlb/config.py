"""The speaker's config file: load, check, parse the resources with the core, keep the last good.

Shape (YAML), see docs/speaker.md::

    node: {name: n1, labels: {zone: a}}
    memberlist: {bind: "198.51.100.11:7946", join: [...], keyFile: ..., profile: lan, probeInterval: 0.5}
    stateDir: /var/lib/nocloudlb
    socket: /run/nocloudlb/speaker.sock
    metrics: {bind: "0.0.0.0:7472"}      # "" disables
    handover: {grace: 30}                # seconds in-flight connections follow a planned move; 0 = off
    logLevel: info
    resources: [ ...MetalLB documents... ]

Every problem is collected and raised at once as ``nocloudlb.core.errors.ConfigError``; the
resources' problems are the core's own messages (``parse_resources``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import ipaddress
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nocloudlb.core.errors import ConfigError

from .membership import OVERRIDABLE, PROFILES

DEFAULT_PATH = "/etc/nocloudlb/config.yaml"
DEFAULT_STATE_DIR = "/var/lib/nocloudlb"
DEFAULT_SOCKET = "/run/nocloudlb/speaker.sock"
DEFAULT_METRICS = "0.0.0.0:7472"
DEFAULT_HANDOVER_GRACE = 30.0  # seconds; l2/handover.py
TOP_KEYS = {"node", "memberlist", "stateDir", "socket", "metrics", "handover", "logLevel", "resources"}


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


@dataclass
class SpeakerConfig:
    node_name: str
    node_labels: dict[str, str]
    bind: str
    join: list[str]
    key_file: str | None
    profile: str
    overrides: dict[str, Any]
    state_dir: str
    socket: str
    metrics_bind: str
    log_level: str
    resources: list[dict]
    parsed: Any  # nocloudlb.core.schema.Config
    digest: str  # sha256 (8 hex) of the canonical resources list
    path: str = ""
    loaded_at: str = field(default_factory=now_iso)
    handover_grace: float = DEFAULT_HANDOVER_GRACE  # 0 turns it off


def _addr_problem(where: str, value: Any) -> str | None:
    if not isinstance(value, str) or ":" not in value:
        return f"{where}: {value!r} is not \"host:port\""
    host, dummy, port = value.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{where}: {value!r} has no valid port (1-65535)"
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not host or " " in host:
            return f"{where}: {value!r} has no valid host"
    return None


def resources_digest(resources: list) -> str:
    canon = json.dumps(resources, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:8]


def parse(data: Any, path: str = "") -> SpeakerConfig:
    """Check a loaded YAML document; raise ConfigError listing every problem."""
    from nocloudlb.core.schema import parse_resources

    errors: list[str] = []
    if not isinstance(data, dict):
        raise ConfigError([f"config{' ' + path if path else ''}: expected a mapping at the top, "
                           f"got {type(data).__name__}"])
    for key in sorted(set(data) - TOP_KEYS):
        errors.append(f"config: unknown key {key!r} (known: {', '.join(sorted(TOP_KEYS))})")

    node = data.get("node")
    name: Any = ""
    labels: dict[str, str] = {}
    if not isinstance(node, dict):
        errors.append(f"node: must be a mapping with a name, got {node!r}")
    else:
        name = node.get("name")
        if not isinstance(name, str) or not name or len(name.encode()) > 64:
            errors.append(f"node.name: {name!r} must be a non-empty string of at most 64 bytes")
            name = ""
        raw_labels = node.get("labels")
        raw_labels = {} if raw_labels is None else raw_labels
        if not isinstance(raw_labels, dict):
            errors.append(f"node.labels: must be a mapping, got {raw_labels!r}")
        else:
            for k, v in raw_labels.items():
                if not isinstance(k, str) or not k:
                    errors.append(f"node.labels: key {k!r} must be a non-empty string")
                elif v is not None and not isinstance(v, str | int | float | bool):
                    errors.append(f"node.labels.{k}: value {v!r} must be a string")
                else:
                    labels[k] = "" if v is None else str(v)

    ml = data.get("memberlist")
    bind: Any = ""
    join: list[str] = []
    key_file: Any = None
    profile: Any = "lan"
    overrides: dict[str, Any] = {}
    if not isinstance(ml, dict):
        errors.append(f"memberlist: must be a mapping with bind and join, got {ml!r}")
    else:
        bind = ml.get("bind")
        problem = _addr_problem("memberlist.bind", bind)
        if problem:
            errors.append(problem)
        raw_join = ml.get("join")
        raw_join = [] if raw_join is None else raw_join
        if not isinstance(raw_join, list):
            errors.append(f"memberlist.join: must be a list of \"host:port\", got {raw_join!r}")
        else:
            for i, item in enumerate(raw_join):
                problem = _addr_problem(f"memberlist.join[{i}]", item)
                if problem:
                    errors.append(problem)
                else:
                    join.append(item)
        key_file = ml.get("keyFile")
        if key_file is not None and (not isinstance(key_file, str) or not key_file):
            errors.append(f"memberlist.keyFile: {key_file!r} must be a file path")
        profile = ml.get("profile", "lan")
        if profile not in PROFILES:
            errors.append(f"memberlist.profile: {profile!r} is not one of {', '.join(sorted(PROFILES))}")
        for key, value in ml.items():
            if key in ("bind", "join", "keyFile", "profile"):
                continue
            if key not in OVERRIDABLE:
                errors.append(f"memberlist: unknown key {key!r} (timing fields: {', '.join(sorted(OVERRIDABLE))})")
                continue
            overrides[OVERRIDABLE[key]] = value
        if profile in PROFILES and not errors:
            try:  # let kinship validate the timings now, naming the field
                from .membership import MembershipSettings

                MembershipSettings(name or "x", bind, join, None, profile, overrides).kinship_config()
            except ValueError as exc:
                errors.append(f"memberlist: {exc}")

    def _str(key: str, default: str) -> str:
        value = data.get(key, default)
        if not isinstance(value, str) or not value:
            errors.append(f"{key}: {value!r} must be a non-empty string")
            return default
        return value

    state_dir = _str("stateDir", DEFAULT_STATE_DIR)
    sock = _str("socket", DEFAULT_SOCKET)
    log_level = _str("logLevel", "info")
    if log_level.lower() not in ("debug", "info", "warning", "error"):
        errors.append(f"logLevel: {log_level!r} is not one of debug, info, warning, error")
    metrics = data.get("metrics") or {}
    metrics_bind = DEFAULT_METRICS
    if not isinstance(metrics, dict):
        errors.append(f"metrics: must be a mapping like {{bind: \"0.0.0.0:7472\"}}, got {metrics!r}")
    else:
        metrics_bind = metrics.get("bind", DEFAULT_METRICS)
        if metrics_bind != "":
            problem = _addr_problem("metrics.bind", metrics_bind)
            if problem:
                errors.append(problem)

    handover = data.get("handover") or {}
    handover_grace = DEFAULT_HANDOVER_GRACE
    if not isinstance(handover, dict) or set(handover) - {"grace"}:
        errors.append(f"handover: must be a mapping like {{grace: 30}}, got {handover!r}")
    else:
        grace = handover.get("grace", DEFAULT_HANDOVER_GRACE)
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace <= 3600:
            errors.append(f"handover.grace: {grace!r} must be a number of seconds from 0 (off) to 3600")
        else:
            handover_grace = float(grace)

    resources = data.get("resources") or []
    parsed = None
    if not isinstance(resources, list):
        errors.append(f"resources: must be a list of documents, got {type(resources).__name__}")
        resources = []
    else:
        try:
            parsed = parse_resources(resources)
        except ConfigError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ConfigError(errors)
    return SpeakerConfig(
        node_name=name, node_labels=labels, bind=bind, join=join, key_file=key_file, profile=profile,
        overrides=overrides, state_dir=state_dir, socket=sock, metrics_bind=metrics_bind,
        log_level=log_level.lower(), resources=resources, parsed=parsed, digest=resources_digest(resources),
        path=path, handover_grace=handover_grace,
    )


def load(path: str | Path) -> SpeakerConfig:
    """Read and check ``path``; raise ConfigError naming every problem."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError([f"config {path}: cannot read: {exc.strerror or exc}"]) from exc
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ConfigError([f"config {path}: not valid YAML: {exc}"]) from exc
    if len(docs) != 1:
        raise ConfigError([f"config {path}: expected one YAML document, found {len(docs)}"])
    return parse(docs[0], str(path))


class ConfigHolder:
    """The config in use and the outcome of the last load (a ConfigurationState-like record)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.current: SpeakerConfig | None = None
        self.state = "error"
        self.errors: list[str] = []
        self.loaded_at = ""  # time of the last load attempt
        self.last_good_at = ""
        self._lock = threading.Lock()

    def reload(self) -> tuple[bool, SpeakerConfig | None]:
        """Load the file; on error keep serving the previous config. Returns (ok, config in use)."""
        with self._lock:
            self.loaded_at = now_iso()
            try:
                cfg = load(self.path)
            except ConfigError as exc:
                self.state, self.errors = "error", list(exc.errors)
                return False, self.current
            self.current, self.state, self.errors = cfg, "ok", []
            self.last_good_at = self.loaded_at
            return True, cfg

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "errors": list(self.errors), "loadedAt": self.loaded_at,
                "lastGoodAt": self.last_good_at, "path": self.path,
                "digest": self.current.digest if self.current else ""}
