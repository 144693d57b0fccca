"""The speaker's config file: load, check, parse the resources with the core, keep the last good.

Shape (YAML), see docs/speaker.md::

    node: {name: n1, labels: {zone: a}}
    memberlist: {bind: "198.51.100.11:7946", join: [...], keyFile: ..., profile: lan, probeInterval: 0.5}
    stateDir: /var/lib/nocloudlb
    socket: /run/nocloudlb/speaker.sock
    metrics: {bind: "auto:7472"}         # auto = memberlist.bind's address; "" disables
    handover: {grace: 30}                # seconds in-flight connections follow a planned move; 0 = off
    announce: {rate: 5000, burst: 200, startSettle: 3}   # gratuitous ARP/NA frames per second and
                                         # interface, burst; seconds a node that found no peer waits
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
import math
import os
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
DEFAULT_METRICS = "auto:7472"  # "auto": the node's management (memberlist.bind) address; "" disables
DEFAULT_HANDOVER_GRACE = 30.0  # seconds; l2/handover.py
# Bounds on what a config file may be and on what its refusal may print (issue 8, section 3): a small
# hostile file must never expand into millions of nodes, nor into megabytes of error text in the journal.
MAX_BYTES = 16 << 20  # a 10,000-service config is about 3 MiB
MAX_NODES = 2_000_000  # YAML nodes after expanding aliases (a "billion laughs" file is refused here)
MAX_DEPTH = 64  # nested sequences/mappings
MAX_ERRORS = 40  # errors reported; the rest are counted
MAX_ERROR_LEN = 300  # characters per error
MAX_ERROR_CHARS = MAX_ERRORS * (MAX_ERROR_LEN + 1) + 100  # the whole refusal, joined by newlines
TOP_KEYS = {"node", "memberlist", "stateDir", "socket", "metrics", "handover", "logLevel", "resources", "announce",
            "bgp", "connectionSync"}
# Pacing of gratuitous ARP/NA (and probes) per interface: a takeover of 5,000 IPv4 VIPs is 10,000 frames,
# 2 s at the default rate; answers to requests are never paced.
DEFAULT_ANNOUNCE_RATE = 5000.0
DEFAULT_ANNOUNCE_BURST = 200
# A node that starts and reaches none of its join seeds waits this long before taking any VIP: peers
# starting at the same moment join it meanwhile, and it never announces (then hands back) their VIPs.
DEFAULT_START_SETTLE = 3.0


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
    file_digest: str = ""  # sha256 of the file's bytes: a reload of an unchanged file is recognised first
    announce_rate: float = DEFAULT_ANNOUNCE_RATE  # gratuitous frames per second and interface
    announce_burst: int = DEFAULT_ANNOUNCE_BURST
    start_settle: float = DEFAULT_START_SETTLE
    # bgp.flowHandover (BGP mode's flow handover, bgp/flows.py): copied segments/s and burst
    flow_rate: int = 20000
    flow_burst: int = 20000
    # memberlist.witness: an address on the announce segment (the gateway, say) that counts as one vote of
    # the quorum while it answers (nocloudlb.core.quorum): a two-node cluster then fails over on a crash
    witness: str = ""
    # connectionSync: conntrackd's state committed on a takeover of a forwarded VIP (dataplane/connsync.py)
    connection_sync: Any = None  # nocloudlb.core.schema.ConnectionSync, None: off


def _printable(text: str) -> str:
    """``text`` with every non-printable character escaped (no terminal escapes or newlines reach a log)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def bound_errors(errors: list[str]) -> list[str]:
    """At most MAX_ERRORS errors of at most MAX_ERROR_LEN printable characters each, whatever came in."""
    out = []
    for err in errors[:MAX_ERRORS]:
        text = _printable(str(err)[: MAX_ERROR_LEN * 4])
        if len(text) > MAX_ERROR_LEN:
            text = text[: MAX_ERROR_LEN - 20] + f"... ({len(str(err)) - MAX_ERROR_LEN + 20} more chars)"
        out.append(text)
    if len(errors) > MAX_ERRORS:
        out.append(f"... and {len(errors) - MAX_ERRORS} more errors")
    return out


def _short(value: Any, limit: int = 80) -> str:
    """A repr of ``value`` cut to ``limit`` characters (values from a hostile file can be huge)."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_unprintable(text: str) -> str:
    """Where the first non-printable character of ``text`` is, as ``U+001B at 2`` ("" when none)."""
    index = next((i for i, c in enumerate(text) if not c.isprintable()), None)
    return "" if index is None else f"U+{ord(text[index]):04X} at {index}"


def _name_problem(where: str, value: str) -> str | None:
    """Names and labels travel in gossip and logs: printable characters, no whitespace other than spaces."""
    if not value.isprintable():
        return f"{where}: {_short(value)} holds control characters ({first_unprintable(value)})"
    return None


def runtime_label_problem(key: Any, value: Any = "") -> str | None:
    """Why a label set (or, with value "", unset) through the control socket is refused: the rules of
    node.labels in the config (non-empty printable strings) and of the socket (no '=' or whitespace
    in a key, keys up to 317 and values up to 63 characters). The message names the label and the
    first bad character; it is bounded and printable whatever came in."""
    if not isinstance(key, str) or not key:
        return f"label: key {_short(key)} must be a non-empty string"
    if problem := _name_problem("label key", key):
        return problem
    if "=" in key or any(c.isspace() for c in key) or len(key) > 317:
        return f"label: bad key {_short(key)} (no '=' or whitespace, at most 317 characters)"
    if not isinstance(value, str) or len(value) > 63:
        return f"label {_short(key)}: value {_short(value)} must be a string of at most 63 characters"
    return _name_problem(f"label {_short(key)} value", value)


def _addr_problem(where: str, value: Any) -> str | None:
    if not isinstance(value, str) or ":" not in value:
        return f"{where}: {_short(value)} is not \"host:port\""
    host, dummy, port = value.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{where}: {_short(value)} has no valid port (1-65535)"
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not host or " " in host:
            return f"{where}: {_short(value)} has no valid host"
    return None


def _same_addr(a: str, b: str) -> bool:
    """Whether two "host:port" name the same endpoint (IP addresses compared as addresses)."""
    ha, _sep, pa = a.rpartition(":")
    hb, _sep, pb = b.rpartition(":")
    if not (pa.isdigit() and pb.isdigit() and int(pa) == int(pb)):
        return False
    try:
        return ipaddress.ip_address(ha.strip("[]")) == ipaddress.ip_address(hb.strip("[]"))
    except ValueError:
        return ha.strip("[]").lower() == hb.strip("[]").lower()


def resources_digest(resources: list) -> str:
    canon = json.dumps(resources, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:8]


def parse(data: Any, path: str = "") -> SpeakerConfig:
    """Check a loaded YAML document; raise ConfigError listing every problem."""
    from nocloudlb.core.schema import parse_connection_sync, parse_flow_handover, parse_resources

    errors: list[str] = []
    if not isinstance(data, dict):
        raise ConfigError([f"config{' ' + path if path else ''}: expected a mapping at the top, "
                           f"got {type(data).__name__}"])
    for key in sorted(set(data) - TOP_KEYS, key=repr):
        errors.append(f"config: unknown key {_short(key)} (known: {', '.join(sorted(TOP_KEYS))})")

    node = data.get("node")
    name: Any = ""
    labels: dict[str, str] = {}
    if not isinstance(node, dict):
        errors.append(f"node: must be a mapping with a name, got {_short(node)}")
    else:
        name = node.get("name")
        if not isinstance(name, str) or not name or len(name.encode()) > 64:
            errors.append(f"node.name: {_short(name)} must be a non-empty string of at most 64 bytes")
            name = ""
        elif problem := _name_problem("node.name", name):
            errors.append(problem)
            name = ""
        raw_labels = node.get("labels")
        raw_labels = {} if raw_labels is None else raw_labels
        if not isinstance(raw_labels, dict):
            errors.append(f"node.labels: must be a mapping, got {_short(raw_labels)}")
        else:
            for k, v in raw_labels.items():
                if not isinstance(k, str) or not k:
                    errors.append(f"node.labels: key {_short(k)} must be a non-empty string")
                elif v is not None and not isinstance(v, str | int | float | bool):
                    errors.append(f"node.labels.{_short(k)}: value {_short(v)} must be a string")
                elif problem := (_name_problem(f"node.labels: key {_short(k)}", k)
                                 or _name_problem(f"node.labels.{_short(k)}", "" if v is None else str(v))):
                    errors.append(problem)
                else:
                    labels[k] = "" if v is None else str(v)

    ml = data.get("memberlist")
    bind: Any = ""
    join: list[str] = []
    key_file: Any = None
    profile: Any = "lan"
    overrides: dict[str, Any] = {}
    witness = ""
    if not isinstance(ml, dict):
        errors.append(f"memberlist: must be a mapping with bind and join, got {_short(ml)}")
    else:
        bind = ml.get("bind")
        problem = _addr_problem("memberlist.bind", bind)
        if problem:
            errors.append(problem)
        raw_join = ml.get("join")
        raw_join = [] if raw_join is None else raw_join
        if not isinstance(raw_join, list):
            errors.append(f"memberlist.join: must be a list of \"host:port\", got {_short(raw_join)}")
        else:
            for i, item in enumerate(raw_join):
                problem = _addr_problem(f"memberlist.join[{i}]", item)
                if problem:
                    errors.append(problem)
                else:
                    join.append(item)
        key_file = ml.get("keyFile")
        if key_file is not None and (not isinstance(key_file, str) or not key_file):
            errors.append(f"memberlist.keyFile: {_short(key_file)} must be a file path")
        others = [a for a in join if not _same_addr(a, bind)] if isinstance(bind, str) else []
        if key_file is None and others:
            errors.append(
                f"memberlist.keyFile: required when memberlist.join lists other members than this node's bind "
                f"({_short(others[0])}): without a key, gossip and heartbeats are unauthenticated, and two forged "
                "heartbeat datagrams can make this node believe it is cut off and give up its VIPs; "
                "write one key with `nocloudlb keygen` into a file readable by the speaker only, the same on "
                "every node")
        profile = ml.get("profile", "lan")
        if profile not in PROFILES:
            errors.append(f"memberlist.profile: {_short(profile)} is not one of {', '.join(sorted(PROFILES))}")
        raw_witness = ml.get("witness")
        if raw_witness is not None:
            try:
                witness = str(ipaddress.ip_address(raw_witness)) if isinstance(raw_witness, str) else ""
            except ValueError:
                witness = ""
            if not witness:
                errors.append(f"memberlist.witness: {_short(raw_witness)} must be an IP address on the announce "
                              "segment that answers ping (the gateway, say)")
        for key, value in ml.items():
            if key in ("bind", "join", "keyFile", "profile", "witness"):
                continue
            if key not in OVERRIDABLE:
                errors.append(f"memberlist: unknown key {_short(key)} "
                              f"(timing fields: {', '.join(sorted(OVERRIDABLE))})")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or not 0 <= value <= 1e6:
                # kinship raises TypeError (not ValueError) for a list, and takes NaN: refuse here, naming the field
                errors.append(f"memberlist.{key}: {_short(value)} must be a finite number from 0 to 1000000")
                continue
            overrides[OVERRIDABLE[key]] = value
        if profile in PROFILES and not errors:
            try:  # let kinship validate the timings now, naming the field
                from .membership import MembershipSettings

                MembershipSettings(name or "x", bind, join, None, profile, overrides).kinship_config()
            except (ValueError, TypeError, OverflowError) as exc:
                errors.append(str(exc) if str(exc).startswith("memberlist.") else f"memberlist: {exc}")

    def _str(key: str, default: str) -> str:
        value = data.get(key, default)
        if not isinstance(value, str) or not value:
            errors.append(f"{key}: {_short(value)} must be a non-empty string")
            return default
        return value

    state_dir = _str("stateDir", DEFAULT_STATE_DIR)
    sock = _str("socket", DEFAULT_SOCKET)
    log_level = _str("logLevel", "info")
    if log_level.lower() not in ("debug", "info", "warning", "error"):
        errors.append(f"logLevel: {_short(log_level)} is not one of debug, info, warning, error")
    metrics = data.get("metrics") or {}
    metrics_bind = DEFAULT_METRICS
    if not isinstance(metrics, dict):
        errors.append(f"metrics: must be a mapping like {{bind: \"auto:7472\"}}, got {_short(metrics)}")
    else:
        metrics_bind = metrics.get("bind", DEFAULT_METRICS)
        if metrics_bind != "":
            problem = _addr_problem("metrics.bind", metrics_bind)
            if problem:
                errors.append(problem)
            elif isinstance(bind, str) and metrics_bind.rpartition(":")[0] == "auto":
                # the node's management address (the gossip bind), never every address: VIPs are local too
                metrics_bind = f"{bind.rpartition(':')[0]}:{metrics_bind.rpartition(':')[2]}"

    handover = data.get("handover") or {}
    handover_grace = DEFAULT_HANDOVER_GRACE
    if not isinstance(handover, dict) or set(handover) - {"grace"}:
        errors.append(f"handover: must be a mapping like {{grace: 30}}, got {_short(handover)}")
    else:
        grace = handover.get("grace", DEFAULT_HANDOVER_GRACE)
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace <= 3600:
            errors.append(f"handover.grace: {_short(grace)} must be a number of seconds from 0 (off) to 3600")
        else:
            handover_grace = float(grace)

    announce = data.get("announce")
    announce = {} if announce is None else announce
    announce_rate, announce_burst = DEFAULT_ANNOUNCE_RATE, DEFAULT_ANNOUNCE_BURST
    start_settle = DEFAULT_START_SETTLE
    if not isinstance(announce, dict) or set(announce) - {"rate", "burst", "startSettle"}:
        errors.append(f"announce: must be a mapping like {{rate: 5000, burst: 200, startSettle: 3}}, "
                      f"got {_short(announce)}")
    else:
        settle = announce.get("startSettle", DEFAULT_START_SETTLE)
        if isinstance(settle, bool) or not isinstance(settle, int | float) or not 0 <= settle <= 600:
            errors.append(f"announce.startSettle: {_short(settle)} must be a number of seconds from 0 to 600")
        else:
            start_settle = float(settle)
        rate = announce.get("rate", DEFAULT_ANNOUNCE_RATE)
        burst = announce.get("burst", DEFAULT_ANNOUNCE_BURST)
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) \
                or not 10 <= rate <= 1_000_000:
            errors.append(f"announce.rate: {_short(rate)} must be a number of frames per second from 10 to 1000000")
        else:
            announce_rate = float(rate)
        if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 100_000:
            errors.append(f"announce.burst: {_short(burst)} must be a whole number of frames from 1 to 100000")
        else:
            announce_burst = burst

    bgp = data.get("bgp")
    bgp = {} if bgp is None else bgp
    flow_rate, flow_burst = 20000, 20000
    if not isinstance(bgp, dict) or set(bgp) - {"flowHandover"}:
        errors.append(f"bgp: must be a mapping like {{flowHandover: {{rate: 20000, burst: 20000}}}}, "
                      f"got {_short(bgp)}")
    else:
        flow_rate, flow_burst, flow_errors = parse_flow_handover(bgp.get("flowHandover"))
        errors.extend(flow_errors)
    connection_sync, sync_errors = parse_connection_sync(data.get("connectionSync"))
    errors.extend(sync_errors)

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
        path=path, handover_grace=handover_grace, announce_rate=announce_rate, announce_burst=announce_burst,
        start_settle=start_settle, flow_rate=flow_rate, flow_burst=flow_burst, witness=witness,
        connection_sync=connection_sync,
    )


class _Fallback(Exception):
    """The fast builder met a YAML feature it leaves to PyYAML (anchors, tags, merge keys, complex keys)."""


_EV_SCALAR, _EV_ALIAS = yaml.ScalarEvent, yaml.AliasEvent
_EV_SEQ, _EV_MAP = yaml.SequenceStartEvent, yaml.MappingStartEvent
_EV_SEQ_END, _EV_MAP_END = yaml.SequenceEndEvent, yaml.MappingEndEvent
_EV_DOC = yaml.DocumentStartEvent
_STR_TAG = "tag:yaml.org,2002:str"


class _PlainScalars:
    """Plain scalars resolved as SafeLoader resolves them (its implicit resolvers and constructors),
    with the common cases (strings, small ints) answered from a cache."""

    def __init__(self) -> None:
        self.resolvers = yaml.SafeLoader.yaml_implicit_resolvers
        self.constructor = yaml.SafeLoader("")  # only its construct_yaml_* methods are used
        self.cache: dict[str, Any] = {}

    def value(self, text: str) -> Any:
        try:
            return self.cache[text]
        except KeyError:
            pass
        tag = _STR_TAG
        for t, regexp in self.resolvers.get(text[0] if text else "", []) + self.resolvers.get(None, []):
            if regexp.match(text):
                tag = t
                break
        if tag == _STR_TAG:
            value: Any = text
        else:
            fn = self.constructor.yaml_constructors.get(tag)
            if fn is None:
                raise _Fallback(tag)
            value = fn(self.constructor, yaml.ScalarNode(tag, text))
        if len(self.cache) < 4096 and not isinstance(value, list | dict):
            self.cache[text] = value
        return value


def _read_yaml(text: str, where: str) -> list[Any]:
    """The documents of ``text``, as ``yaml.safe_load_all`` gives them, read with libyaml in one pass.

    The same pass refuses, before building anything large, YAML that nests deeper than MAX_DEPTH,
    whose aliases refer to themselves (a recursive anchor), or that expands to more than MAX_NODES
    nodes (exponential anchors): each anchor's expanded size is known when its node ends, and an
    alias adds that size to the count (no recursion, linear in the text).

    The objects are built from libyaml's events directly (PyYAML's constructor costs seconds on a
    10,000-service file); a file with anchors, explicit tags, merge keys or complex keys is checked
    the same way and then built by PyYAML's SafeLoader (libyaml's when present), as before.
    """
    parse_loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    sizes: dict[str, int] = {}
    open_anchors: set[str] = set()
    stack: list[tuple[str | None, int]] = []
    count = 0
    docs: list[Any] = []
    build = True
    plain = _PlainScalars()
    cache = plain.cache
    # the container being built (None: a document's root), whether it is a mapping, and the key
    # read and waiting for its value; the enclosing ones are kept in ``frames``
    cur: Any = None
    is_map = False
    key: Any = None
    has_key = False
    frames: list[tuple[Any, bool, Any, bool]] = []
    for ev in yaml.parse(text, Loader=parse_loader):
        kind = type(ev)
        if kind is _EV_SCALAR:
            count += 1
            if not build:
                if ev.anchor is not None:
                    sizes[ev.anchor] = 1
                continue
            if ev.anchor is not None or (ev.tag is not None and ev.tag != "!"):
                build = False
                if ev.anchor is not None:
                    sizes[ev.anchor] = 1
                continue
            value: Any = ev.value
            if ev.implicit[0]:
                hit = cache.get(value, cache)
                if hit is cache:
                    try:
                        value = plain.value(value)
                    except _Fallback:
                        build = False
                        continue
                else:
                    value = hit
            if is_map:
                if has_key:
                    cur[key] = value
                    has_key = False
                elif value == "<<":
                    build = False  # a merge key: PyYAML's rules apply
                else:
                    key, has_key = value, True
            elif cur is not None:
                cur.append(value)
            else:
                docs.append(value)
        elif kind is _EV_SEQ or kind is _EV_MAP:
            count += 1
            stack.append((ev.anchor, count))
            if ev.anchor is not None:
                open_anchors.add(ev.anchor)
                build = False
            if len(stack) > MAX_DEPTH:
                raise ConfigError([f"config {where}: nested deeper than {MAX_DEPTH} levels ({_mark(ev)})"])
            if build and ev.tag is not None and ev.tag != "!":
                build = False
            if build:
                container: Any = {} if kind is _EV_MAP else []
                if is_map:
                    if not has_key:
                        build = False  # a complex key: PyYAML's rules apply
                        continue
                    cur[key] = container
                    has_key = False
                elif cur is not None:
                    cur.append(container)
                else:
                    docs.append(container)
                frames.append((cur, is_map, key, has_key))
                cur, is_map, key, has_key = container, kind is _EV_MAP, None, False
        elif kind is _EV_SEQ_END or kind is _EV_MAP_END:
            if stack:
                anchor, start = stack.pop()
                if anchor is not None:
                    open_anchors.discard(anchor)
                    sizes[anchor] = count - start + 1
            if build:
                cur, is_map, key, has_key = frames.pop()
        elif kind is _EV_ALIAS:
            build = False
            if ev.anchor in open_anchors:
                raise ConfigError([f"config {where}: recursive YAML anchor &{_short(ev.anchor, 40)} "
                                   f"refers to itself ({_mark(ev)})"])
            count += sizes.get(ev.anchor, 1)
        elif kind is _EV_DOC:
            frames.clear()
            cur, is_map, key, has_key = None, False, None, False
        if count > MAX_NODES:
            raise ConfigError([f"config {where}: expands to more than {MAX_NODES} YAML nodes "
                               f"(aliases of aliases?) ({_mark(ev)})"])
    if build:
        return docs
    return list(yaml.load_all(text, Loader=parse_loader))  # noqa: S506 - a safe loader (CSafeLoader/SafeLoader)


def check_yaml_shape(text: str, where: str) -> None:
    """Refuse YAML that nests deeper than MAX_DEPTH, whose aliases refer to themselves, or that expands
    to more than MAX_NODES nodes (see ``_read_yaml``, which checks the same while reading)."""
    _read_yaml(text, where)


def _mark(ev: Any) -> str:
    mark = getattr(ev, "start_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"


def _read_bytes(path: str | Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"config {path}: cannot read: {exc.strerror or exc}"]) from exc


def file_digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _load(path: str | Path, raw: bytes | None = None) -> SpeakerConfig:
    if raw is None:
        raw = _read_bytes(path)
    if len(raw) > MAX_BYTES:
        raise ConfigError([f"config {path}: larger than {MAX_BYTES >> 20} MiB"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError([f"config {path}: not UTF-8 text: byte {raw[exc.start]:#04x} at offset {exc.start} "
                           f"(line {line})"]) from None
    try:
        docs = _read_yaml(text, str(path))
    except yaml.YAMLError as exc:
        raise ConfigError([f"config {path}: not valid YAML: {exc}"]) from exc
    if len(docs) != 1:
        raise ConfigError([f"config {path}: expected one YAML document, found {len(docs)}"])
    cfg = parse(docs[0], str(path))
    cfg.file_digest = file_digest(raw)
    return cfg


def load(path: str | Path, raw: bytes | None = None) -> SpeakerConfig:
    """Read and check ``path``; raise ConfigError naming every problem, and nothing else.

    Whatever the file holds (any bytes, any YAML), the only exception is ConfigError, with at
    most MAX_ERRORS printable errors of bounded length: ``nocloudlb validate`` and a reload
    therefore refuse the same files, and a reload keeps the last good config.
    """
    try:
        return _load(path, raw)
    except ConfigError as exc:
        raise ConfigError(bound_errors(exc.errors)) from None
    except RecursionError:
        raise ConfigError([f"config {path}: nested too deeply to read"]) from None
    except Exception as exc:  # noqa: BLE001 - the barrier: a bug on a strange file must not escape a reload
        raise ConfigError(bound_errors([f"config {path}: cannot be read: {type(exc).__name__}: {exc}"])) from None


class KeyFileWatch:
    """Whether memberlist.keyFile changed since it was read, at the cost of one ``stat`` per poll.

    The speaker reads the key file at start and on SIGHUP, and creates a watch just before each read
    (so a change made during the read is seen at the next poll). The decision loop calls ``changed``
    on each pass; it looks at the file at most every POLL seconds and answers True once the file's
    identity (device, inode, size, modification and change times) differs from the one read *and*
    has stayed the same over two polls in a row: a file written in place is not taken half written,
    one replaced atomically (a rename, as Ansible's copy does) is taken within one to two polls. A
    file that disappears or cannot be stat'ed is a change too (the reader then says why, once).
    """

    POLL = 0.5  # seconds between two looks at the file

    def __init__(self, path: str) -> None:
        self.path = path
        self.signature = self._stat()  # the file as it was when it was read
        self._seen = self.signature  # the file as the last poll found it
        self._next = -math.inf

    def _stat(self) -> tuple[int, ...]:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            return (-1, exc.errno or 0)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def changed(self, now: float) -> bool:
        """True when the file changed and is stable (see the class); ``now`` is a monotonic time."""
        if now < self._next:
            return False
        self._next = now + self.POLL
        sig = self._stat()
        stable = sig == self._seen
        self._seen = sig
        return stable and sig != self.signature


class ConfigHolder:
    """The config in use and the outcome of the last load (a ConfigurationState-like record)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.current: SpeakerConfig | None = None
        self.state = "error"
        self.errors: list[str] = []
        self.loaded_at = ""  # time of the last load attempt
        self.last_good_at = ""
        self.unchanged = False  # the last reload found the very file in use (same bytes): nothing was parsed
        self._lock = threading.Lock()

    def reload(self) -> tuple[bool, SpeakerConfig | None]:
        """Load the file; on error keep serving the previous config. Returns (ok, config in use).

        Digest first: a file whose bytes are those of the config in use is not parsed again, and the
        config in use (the same object) comes back, with ``unchanged`` set.
        """
        with self._lock:
            self.loaded_at = now_iso()
            self.unchanged = False
            try:
                raw = _read_bytes(self.path)
                cur = self.current
                if cur is not None and self.state == "ok" and cur.file_digest \
                        and len(raw) <= MAX_BYTES and file_digest(raw) == cur.file_digest:
                    self.unchanged = True
                    self.last_good_at = self.loaded_at
                    return True, cur
                cfg = load(self.path, raw)
            except ConfigError as exc:
                self.state, self.errors = "error", list(exc.errors)
                return False, self.current
            except Exception as exc:  # noqa: BLE001 - load raises ConfigError only; belt and braces
                self.state, self.errors = "error", bound_errors([f"config {self.path}: {type(exc).__name__}: {exc}"])
                return False, self.current
            self.current, self.state, self.errors = cfg, "ok", []
            self.last_good_at = self.loaded_at
            return True, cfg

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "errors": list(self.errors), "loadedAt": self.loaded_at,
                "lastGoodAt": self.last_good_at, "path": self.path,
                "digest": self.current.digest if self.current else ""}
