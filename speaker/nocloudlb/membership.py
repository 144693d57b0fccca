"""Cluster membership: the one module that wraps kinship (SWIM + Lifeguard).

Timing profiles, key handling, joining, events and metadata live here so the daemon and
the tests see one small surface:

    m = Membership(MembershipSettings(...), on_change=callback, logger=log)
    m.start(meta)            # bind, join (with diagnosis of a wrong key), event thread
    m.members()              # [MemberView], this node included, tombstones of known peers too
    m.set_meta(meta)         # re-gossip labels/health at once
    m.set_keys(keys)         # rotation: install all, use the first, remove the rest
    m.leave()                # graceful leave: peers fail over at once, without waiting
    m.closed                 # True once kinship stopped on its own (the view is unknown: fail closed)

Healing. ``on_heal(reason, node)`` (optional) is called from the event thread whenever the
cluster may just have healed, i.e. the other nodes may have moved this node's VIPs away and
are giving them back while this node, in its own view, never lost them:

- ``memberJoined`` / ``memberRecovered``: a member became alive (new, back from dead or left,
  or a suspect that refuted): a frozen peer thawed, a link came back, a partition merged;
- ``refuted``: this node refuted a rumour that it was suspect or dead (kinship's
  ``refutations`` counter grew): the others doubted it, maybe declared it dead;
- ``resumed``: this process did not run for a while (SIGSTOP, a VM pause, a stalled host):
  the event thread's wake-ups were ``pause_threshold`` seconds late.

A heal also starts an anti-entropy push-pull (``Cluster.join([addr])``) with the member that
came back from dead or left, or joined (after a pause: with every member), in the background; only
the few members healsync.py pairs with it do, never every member (that was a suspicion storm).
A merge can be one-sided: the isolated node hears its peers refute the deaths it gossiped and sees them alive, while
they still hold it dead (nothing tells it so until the next periodic push-pull, 30 s away)
and both sides announce its VIPs. Exchanging full states at once makes it hear the rumour of
its death, refute it, and be taken back: the cluster agrees again within a round trip.

A full partition (a leader's switch port down long enough that each side declared the other
dead) would otherwise heal only by kinship's periodic reconnect and push-pull, tens of seconds
during which both sides answer for the same VIPs. So every member this node holds dead (not
left) gets a push-pull attempt every ``RECONNECT_FAST`` s for ``RECONNECT_FAST_FOR`` s after it
died from the members healsync.py pairs with it (every ``RECONNECT_SLOW`` s from the others, and
after that time): a healed link merges the cluster within about a second.
An attempt at a really dead node costs one refused (or timed out) TCP connection.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kinship
from kinship.blocking import Cluster

from .logs import event
from .memberevents import EventPump
from .memberheal import RECONNECT_FAST, RECONNECT_FAST_FOR, RECONNECT_SLOW, HealSync
from .memberjoin import Joiner
from .memberview import MemberView, member_view, split_addr

__all__ = ["CLUSTER_LABEL", "HEARTBEAT_FIELDS", "OVERRIDABLE", "PROFILES", "RECONNECT_FAST", "RECONNECT_FAST_FOR",
           "RECONNECT_SLOW", "KeyFileError", "MemberView", "Membership", "MembershipSettings", "generate_key",
           "read_key_file", "split_addr"]

#: Timing profiles. Gossip (kinship) declares members dead; direct heartbeats (heartbeat.py)
#: suspect a silent member within ``heartbeat_interval x heartbeat_miss`` and move its VIPs to the
#: next nodes (with handover forwarding toward it) until gossip decides. ``lan`` (default): gossip
#: declares a crash dead in ~1.5-2.5 s, heartbeats suspect it after 0.6 s (150 ms x 4): four lost
#: packets in a row or a 0.6 s stall are needed for a false suspicion. ``fast``: heartbeats every
#: 25 ms, suspected after 100 ms (about 0.15 s to the new owner's first gratuitous ARP), for quiet,
#: dedicated links and hosts that never stall 100 ms; gossip sub-second (~0.6-0.95 s).
#: Heartbeats cost ``members / interval`` packets per second per node (fast, 3 nodes: 80/s).
PROFILES: dict[str, dict[str, float | int]] = {
    "lan": {"probe_interval": 0.5, "probe_timeout": 0.25, "suspicion_mult": 2, "gossip_interval": 0.2,
            "heartbeat_interval": 0.15, "heartbeat_miss": 4, "heartbeat_port_offset": 1},
    "fast": {"probe_interval": 0.2, "probe_timeout": 0.1, "suspicion_mult": 2, "gossip_interval": 0.1,
             "heartbeat_interval": 0.025, "heartbeat_miss": 4, "heartbeat_port_offset": 1},
}

#: Fields of a profile that belong to the heartbeat (heartbeat.py), not to kinship.
HEARTBEAT_FIELDS = ("heartbeat_interval", "heartbeat_miss", "heartbeat_port_offset")

#: Config keys (camelCase, as in the speaker's YAML) that override kinship's fields.
OVERRIDABLE: dict[str, str] = {
    "probeInterval": "probe_interval",
    "probeTimeout": "probe_timeout",
    "suspicionMult": "suspicion_mult",
    "suspicionMaxMult": "suspicion_max_mult",
    "indirectChecks": "indirect_checks",
    "gossipInterval": "gossip_interval",
    "gossipNodes": "gossip_nodes",
    "gossipToTheDead": "gossip_to_the_dead",
    "retransmitMult": "retransmit_mult",
    "pushPullInterval": "push_pull_interval",
    "reconnectInterval": "reconnect_interval",
    "rejoinInterval": "rejoin_interval",
    "awarenessMax": "awareness_max",
    "deadReclaim": "dead_reclaim",
    "tcpTimeout": "tcp_timeout",
    "tcpFallbackPing": "tcp_fallback_ping",
    "expectedConfirmations": "expected_confirmations",
    "cluster": "cluster",
    "advertise": "advertise",
    "heartbeatInterval": "heartbeat_interval",
    "heartbeatMiss": "heartbeat_miss",
    "heartbeatPortOffset": "heartbeat_port_offset",
}

CLUSTER_LABEL = "nocloudlb"


class KeyFileError(ValueError):
    pass


def read_key_file(path: str | Path) -> list[str]:
    """Keys from ``path``: one base64 32-byte key per line, '#' comments and blank lines skipped.

    The first key encrypts; every key decrypts (kinship's keyring). Rotation: write
    "old\\nnew" on every node and reload, then "new\\nold", then "new".
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise KeyFileError(f"memberlist.keyFile: cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError:  # edges (issue 8 fuzz): escaped validate and reload
        raise KeyFileError(f"memberlist.keyFile: {path} is not base64 text (not UTF-8)") from None
    keys: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            raw = base64.b64decode(line, validate=True)
        except (binascii.Error, ValueError):
            raise KeyFileError(f"memberlist.keyFile: {path} line {lineno}: not base64 text") from None
        if len(raw) != 32:
            raise KeyFileError(
                f"memberlist.keyFile: {path} line {lineno}: a key is 32 bytes (base64), got {len(raw)} bytes")
        if line not in keys:
            keys.append(line)
    if not keys:
        raise KeyFileError(f"memberlist.keyFile: {path} holds no key")
    return keys


def generate_key() -> str:
    return kinship._kinship.generate_key()


@dataclass
class MembershipSettings:
    name: str
    bind: str
    join: list[str] = field(default_factory=list)
    keys: list[str] | None = None  # None: unencrypted (warned)
    profile: str = "lan"
    overrides: dict[str, Any] = field(default_factory=dict)  # kinship field name -> value

    def kinship_config(self, meta: Mapping[str, str] | None = None) -> kinship.Config:
        if self.profile not in PROFILES:
            raise ValueError(f"memberlist.profile: {self.profile!r} is not one of {sorted(PROFILES)}")
        fields: dict[str, Any] = dict(PROFILES[self.profile])
        fields.update(self.overrides)
        errors = self.heartbeat_problems(fields)
        if errors:
            raise ValueError("; ".join(errors))
        for name in HEARTBEAT_FIELDS:
            fields.pop(name, None)
        fields.setdefault("cluster", CLUSTER_LABEL)
        # kinship wants gossip_interval <= probe_interval
        if "gossip_interval" not in self.overrides:
            fields["gossip_interval"] = min(float(fields["gossip_interval"]), float(fields["probe_interval"]))
        if self.keys:
            fields["keys"] = list(self.keys)
        else:
            fields["insecure_plaintext"] = True
        return kinship.Config.lan(name=self.name, bind=self.bind, seeds=self.seeds(), meta=dict(meta or {}),
                                  **fields)

    @staticmethod
    def heartbeat_problems(fields: Mapping[str, Any]) -> list[str]:
        from .heartbeat import check_settings  # noqa: PLC0415

        dead_after = float(fields.get("probe_interval", 1.0)) * (1 + float(fields.get("suspicion_mult", 4)))
        return check_settings(fields.get("heartbeat_interval"), fields.get("heartbeat_miss"),
                              fields.get("heartbeat_port_offset"), dead_after)

    def heartbeat(self) -> tuple[float, int, int]:
        """(interval s, miss, port offset; 0 = off) of the heartbeats (validated by kinship_config)."""
        t = self.timing()
        return float(t["heartbeat_interval"]), int(t["heartbeat_miss"]), int(t["heartbeat_port_offset"])

    def seeds(self) -> list[str]:
        return [s for s in self.join if _norm(s) != _norm(self.bind)]

    def timing(self) -> dict[str, Any]:
        fields: dict[str, Any] = dict(PROFILES.get(self.profile, {}))
        fields.update(self.overrides)
        return fields


def _norm(addr: str) -> str:
    return addr.strip().lower()


class Membership:
    """The kinship node and what the daemon reads of it and writes to it (see the module docstring).
    Its parts: the join thread (memberjoin.Joiner), the event thread (memberevents.EventPump) and
    the push-pulls after a heal (memberheal.HealSync)."""

    def __init__(self, settings: MembershipSettings, on_change: Callable[[], None],
                 logger: logging.Logger | None = None,
                 on_heal: Callable[[str, str], None] | None = None,
                 on_message: Callable[[str, bytes], None] | None = None) -> None:
        self.settings = settings
        self.on_change = on_change
        self.on_heal = on_heal
        self.on_message = on_message  # (sender name, data) of a user message, on the event thread
        timing = settings.timing()
        # A pause longer than a probe round plus a suspicion may have got this node declared dead.
        self.pause_threshold = max(1.0, 2 * float(timing.get("probe_interval", 1.0)))
        self.log = logger or logging.getLogger("nocloudlb.membership")
        self.cluster: Cluster | None = None
        self._known: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._join_thread: threading.Thread | None = None
        self._keys: list[str] = list(settings.keys or [])
        self._lock = threading.Lock()
        #: True once kinship stopped without leave() (an internal error): members() is meaningless then,
        #: and the daemon fails closed (withdraws everything and exits so it is restarted).
        self.closed = False
        self._joiner = Joiner(lambda: self.cluster, self._stop, self._changed, self.log)
        self._heals = HealSync(settings.name, lambda: self.cluster, self.members, self._stop, self._lock, self.log)
        self._pump = EventPump(settings.name, lambda: self.cluster, self.stats, self.members, self._joiner,
                               self._heals, known=self._known, lock=self._lock, stop=self._stop,
                               pause_threshold=self.pause_threshold, on_change=self._changed,
                               on_heal=self._heal, on_message=lambda: self.on_message, on_closed=self._set_closed,
                               log=self.log)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, meta: Mapping[str, str]) -> None:
        if not self.settings.keys:
            event(self.log, "memberlistUnencrypted", "gossip runs without encryption: set memberlist.keyFile",
                  logging.WARNING)
        cfg = self.settings.kinship_config(meta)
        self.cluster = Cluster(cfg).start()
        event(self.log, "memberlistStarted", node=self.settings.name, bind=self.cluster.local.addr,
              profile=self.settings.profile, timing=self.settings.timing(),
              keyIds=self.key_ids())
        self._thread = threading.Thread(target=self._pump.run, name="membership-events", daemon=True)
        self._thread.start()
        join_timeout = max(2.0, float(self.settings.timing().get("probe_interval", 1)) * 4)
        self._join_thread = threading.Thread(target=self._joiner.run, args=(self.settings.seeds(), join_timeout),
                                             name="membership-join", daemon=True)
        self._join_thread.start()

    def leave(self, timeout: float = 2.0) -> None:
        """Graceful leave then close: peers see ``left`` at once and take over."""
        self._stop.set()
        cl = self.cluster
        if cl is None:
            return
        try:
            cl.close(timeout=timeout)
        except kinship.KinshipClosed:
            pass
        event(self.log, "memberlistLeft", node=self.settings.name)

    close = leave

    def _changed(self) -> None:
        self.on_change()  # the callback as it is now (the parts hold this method, not the callback)

    def _set_closed(self) -> None:
        """The gossip layer stopped on its own: the view of the cluster is unknown from now on."""
        self.closed = True
        self.on_change()

    def _heal(self, reason: str, node: str) -> None:
        if self.on_heal is not None:
            self.on_heal(reason, node)

    # -- the join state (memberjoin.Joiner) ------------------------------------------------
    @property
    def join_state(self) -> str:
        """starting | joined | alone | joinFailed"""
        return self._joiner.join_state

    @property
    def join_error(self) -> str:
        return self._joiner.join_error

    @property
    def join_refused(self) -> bool:
        """Seeds reachable but our gossip refused (wrong key / cluster label)."""
        return self._joiner.join_refused

    @property
    def first_join_done(self) -> threading.Event:
        return self._joiner.first_join_done

    # -- reads -----------------------------------------------------------------------------
    def members(self) -> list[MemberView]:
        cl = self.cluster
        if cl is None:
            return []
        out: dict[str, MemberView] = {}
        try:
            for m in cl.members():
                out[m.name] = member_view(m)
            if not out and not self._stop.is_set():
                raise kinship.KinshipClosed("no local member: the cluster is closed")
            with self._lock:
                known = set(self._known)
            for name in known - set(out):
                tomb = cl.member(name)
                if tomb is not None:
                    out[name] = member_view(tomb)
        except kinship.KinshipClosed:
            if not self._stop.is_set() and not self.closed:
                self._set_closed()
        return sorted(out.values(), key=lambda v: v.name)

    def stats(self) -> dict[str, int]:
        if self.cluster is None:
            return {}
        return _stats_dict(self.cluster.stats())

    @property
    def keys(self) -> list[str]:
        """The keys in the keyring now, the one in use first (never logged)."""
        return list(self._keys)

    def key_ids(self) -> list[str]:
        if self.cluster is None or not self._keys:
            return []
        try:
            return self.cluster.keyring.key_ids()
        except (kinship.KinshipError, RuntimeError):
            return []

    # -- writes ----------------------------------------------------------------------------
    def set_meta(self, meta: Mapping[str, str]) -> None:
        if self.cluster is None:
            return
        self.cluster.set_meta(dict(meta), timeout=2.0)

    def send(self, name: str, data: bytes, timeout: float = 1.0) -> None:
        """Send ``data`` to the live member ``name`` (best effort; kinship's user message)."""
        if self.cluster is None:
            raise RuntimeError("membership is not started")
        self.cluster.send(name, data, timeout=timeout)

    def set_keys(self, keys: list[str]) -> list[str]:
        """Rotate to ``keys``: install every one, encrypt with the first, drop the others.

        Returns the key ids now installed. Raises ``kinship.KeyringError`` with kinship's reason
        (e.g. switching between encrypted and plaintext needs a restart)."""
        if self.cluster is None:
            raise RuntimeError("membership is not started")
        if not self._keys or not keys:
            if self._keys != keys:
                raise kinship.KeyringError(
                    "switching between an encrypted and an unencrypted cluster needs a restart of the speaker")
            return []
        ring = self.cluster.keyring
        for key in keys:
            ring.install(key, timeout=2.0)
        ring.use(keys[0], timeout=2.0)
        for key in self._keys:
            if key not in keys:
                ring.remove(key, timeout=2.0)
        self._keys = list(keys)
        ids = ring.key_ids()
        event(self.log, "memberlistKeysChanged", keyIds=ids)
        return ids


def _stats_dict(stats: Any) -> dict[str, int]:
    from dataclasses import asdict

    return asdict(stats)
