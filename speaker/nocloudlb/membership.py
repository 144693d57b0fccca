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
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kinship
from kinship.blocking import Cluster

from .healsync import heal_sync
from .logs import event

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

#: Push-pull attempts with members held dead: seconds between attempts, at first and later.
RECONNECT_FAST = 1.0
RECONNECT_FAST_FOR = 120.0
RECONNECT_SLOW = 10.0


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


def split_addr(addr: str) -> tuple[str, int]:
    """``(host, port)`` of a gossip address "ip:port" or "[ip6]:port"; ValueError for a bad port."""
    host, dummy, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class MemberView:
    name: str
    addr: str
    state: str  # alive | suspect | dead | left
    meta: Mapping[str, str]
    epoch: int = 0


_EVENT_NAMES = {
    kinship.MemberJoined: ("nodeJoined", logging.INFO),
    kinship.MemberSuspect: ("nodeSuspect", logging.WARNING),
    kinship.MemberRecovered: ("nodeRecovered", logging.INFO),
    kinship.MemberDead: ("nodeFailed", logging.WARNING),
    kinship.MemberLeft: ("nodeLeft", logging.INFO),
    kinship.MemberUpdated: ("nodeUpdated", logging.DEBUG),
}


class Membership:
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
        self._refutations = 0
        self._synced: dict[str, float] = {}  # member name -> when we last push-pulled with it after a heal
        self._syncing: set[str] = set()  # push-pulls in flight
        self._dead_since: dict[str, float] = {}  # members held dead -> monotonic time we saw them die
        self._next_reconnect = 0.0
        self.log = logger or logging.getLogger("nocloudlb.membership")
        self.cluster: Cluster | None = None
        self._known: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._join_thread: threading.Thread | None = None
        self._keys: list[str] = list(settings.keys or [])
        self.join_state = "starting"  # starting | joined | alone | joinFailed
        self.join_error = ""
        self.join_refused = False  # seeds reachable but our gossip refused (wrong key / cluster label)
        self.first_join_done = threading.Event()
        self._decrypt_seen = 0
        self._lock = threading.Lock()
        #: True once kinship stopped without leave() (an internal error): members() is meaningless then,
        #: and the daemon fails closed (withdraws everything and exits so it is restarted).
        self.closed = False

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
        self._thread = threading.Thread(target=self._events, name="membership-events", daemon=True)
        self._thread.start()
        self._join_thread = threading.Thread(target=self._join_loop, name="membership-join", daemon=True)
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

    # -- joining ---------------------------------------------------------------------------
    def _join_loop(self) -> None:
        seeds = self.settings.seeds()
        delay = 1.0
        while not self._stop.is_set():
            assert self.cluster is not None
            if not seeds:
                self.join_state = "alone"
                self.first_join_done.set()
                return
            if len(self.cluster.members()) > 1:
                self._joined()
                return
            error = ""
            try:
                self.cluster.join(seeds, timeout=max(2.0, float(self.settings.timing().get("probe_interval", 1)) * 4))
            except kinship.JoinError as exc:
                error = str(exc)
            except (TimeoutError, kinship.KinshipClosed):
                if self._stop.is_set():
                    return
                error = "join timed out"
            # Another member may have joined us while our own attempt failed (a slow seed, a loaded
            # host): then we are in a cluster, and calling it refused would withdraw every VIP.
            if len(self.cluster.members()) > 1 or self._stop.is_set():
                self._joined()
                return
            if error:
                self._join_failed(seeds, error)
            self.first_join_done.set()
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, 10.0)

    def _joined(self) -> None:
        was = self.join_state
        self.join_state, self.join_error, self.join_refused = "joined", "", False
        self.first_join_done.set()
        if was != "joined":
            assert self.cluster is not None
            event(self.log, "memberlistJoined", members=sorted(m.name for m in self.cluster.members()))
        self.on_change()

    def _join_failed(self, seeds: list[str], error: str) -> None:
        reachable = [s for s in seeds if _tcp_reachable(s)]
        if reachable:
            reason = (f"seeds {', '.join(reachable)} accept connections but refused our gossip: the gossip key "
                      "(memberlist.keyFile) or the cluster label most likely differs from the cluster's")
        else:
            reason = f"no seed reachable ({', '.join(seeds)}): {error}; starting alone and retrying"
        changed = reason != self.join_error
        self.join_state, self.join_error, self.join_refused = "joinFailed", reason, bool(reachable)
        if changed:
            event(self.log, "memberlistJoinFailed", reason, logging.ERROR, seeds=seeds, reachable=reachable)
            self.on_change()

    # -- events ----------------------------------------------------------------------------
    def _events(self) -> None:
        assert self.cluster is not None
        last_check = 0.0
        wait = 0.25
        last_wake = time.monotonic()
        try:
            self._refutations = self.stats().get("refutations", 0)
            for ev in self.cluster.events(timeout=wait):
                if self._stop.is_set():
                    return
                now = time.monotonic()
                late = now - last_wake - wait
                last_wake = now
                if late > self.pause_threshold:
                    event(self.log, "speakerResumed", "this process did not run for a while (stopped, paused "
                          "or starved): peers may have declared it dead", logging.WARNING, paused=round(late, 3))
                    self._heal("resumed", self.settings.name)
                    self._sync([m for m in self.members() if m.name != self.settings.name
                                and m.state in ("alive", "suspect")])
                if ev is not None:
                    self._handle(ev)
                self._check_refuted()
                if now >= self._next_reconnect:
                    self._next_reconnect = now + 0.5
                    self._reconnect_dead(now)
                if now - last_check > 5.0:
                    last_check = now
                    self._check_decrypt()
            if not self._stop.is_set():  # the event stream ended: kinship closed on its own
                event(self.log, "memberlistClosed", "membership stopped on an internal error", logging.ERROR)
                self._set_closed()
        except kinship.KinshipClosed:
            if not self._stop.is_set():
                event(self.log, "memberlistClosed", "membership stopped on an internal error", logging.ERROR)
                self._set_closed()
        except Exception:  # keep the daemon informed, never die silently
            self.log.exception("membership event thread failed")
            if not self._stop.is_set():
                self._set_closed()  # no more events: the view would go stale, so it is unknown

    def _set_closed(self) -> None:
        """The gossip layer stopped on its own: the view of the cluster is unknown from now on."""
        self.closed = True
        self.on_change()

    def _handle(self, ev: Any) -> None:
        if isinstance(ev, kinship.EventsLost):
            event(self.log, "memberlistEventsLost", count=ev.count, level=logging.WARNING)
            self.on_change()
            return
        if isinstance(ev, kinship.UserMessage):
            if self.on_message is not None and ev.sender is not None:
                try:
                    self.on_message(ev.sender.name, bytes(ev.data))
                except Exception:  # noqa: BLE001 - a bad message never stops the event thread
                    self.log.debug("user message handler failed", exc_info=True)
            return
        member = getattr(ev, "member", None)
        if isinstance(ev, kinship.NameConflict):
            event(self.log, "nodeNameConflict", "two nodes claim the same name", logging.ERROR,
                  node=member.name if member else None, otherAddr=ev.other_addr)
            return
        if member is None:
            return
        with self._lock:
            self._known.add(member.name)
        name, level = _EVENT_NAMES.get(type(ev), ("nodeEvent", logging.DEBUG))
        event(self.log, name, level=level, node=member.name, addr=member.addr)
        if isinstance(ev, kinship.MemberJoined) and self.join_state != "joined":
            self._joined()
        self.on_change()
        with self._lock:
            if isinstance(ev, kinship.MemberDead):
                self._dead_since.setdefault(member.name, time.monotonic())
            elif isinstance(ev, (kinship.MemberJoined, kinship.MemberRecovered, kinship.MemberLeft)):
                self._dead_since.pop(member.name, None)
        if member.name != self.settings.name and isinstance(ev, (kinship.MemberJoined, kinship.MemberRecovered)):
            self._heal("memberJoined" if isinstance(ev, kinship.MemberJoined) else "memberRecovered", member.name)
            # an exchange only on MemberJoined (kinship: alive again after unknown, dead or left; a refuted
            # suspicion is MemberRecovered, and nobody held that member dead), and only between the few
            # members healsync.py pairs: never one per member (a storm)
            if self.first_join_done.is_set() and isinstance(ev, kinship.MemberJoined):
                alive = [m.name for m in self.members() if m.state == "alive"]
                if heal_sync(self.settings.name, member.name, alive):
                    # not again if the reconnect that healed it exchanged with it moments ago
                    self._sync([_view(member)], every=RECONNECT_SLOW / 2)

    def _reconnect_dead(self, now: float) -> None:
        """Push-pull with the members held dead that are due (see the module docstring)."""
        with self._lock:
            dead = dict(self._dead_since)
        if not dead:
            return
        due = []
        members = self.members()
        alive = [m.name for m in members if m.state == "alive"]
        for m in members:
            since = dead.get(m.name)
            if since is None or m.state != "dead" or m.name == self.settings.name:
                continue
            # every RECONNECT_FAST s only from the few members paired with it (healsync.py): a member held
            # dead by all that comes back meets about 2k exchanges at once, not one per member
            fast = now - since < RECONNECT_FAST_FOR and heal_sync(self.settings.name, m.name, alive)
            every = RECONNECT_FAST if fast else RECONNECT_SLOW
            # the others' first attempt comes RECONNECT_SLOW s after the death, not at once with the pairs'
            last = self._synced.get(m.name, -1e9) if fast else max(self._synced.get(m.name, -1e9), since)
            if now - last >= every:
                due.append(m)
        self._sync(due, every=0.0)

    def _sync(self, members: list[MemberView], every: float = 1.0) -> None:
        """Push-pull with ``members`` in the background (see the module docstring), each at most once
        per ``every`` seconds and never twice at the same time."""
        now = time.monotonic()
        with self._lock:
            todo = [m for m in members if m.name not in self._syncing
                    and now - self._synced.get(m.name, -1e9) >= every]
            for m in todo:
                self._synced[m.name] = now
                self._syncing.add(m.name)
        if todo:
            threading.Thread(target=self._push_pull, args=(todo,), name="membership-sync", daemon=True).start()

    def _push_pull(self, members: list[MemberView]) -> None:
        for m in members:
            try:
                if self._stop.is_set() or self.cluster is None:
                    continue
                self.cluster.join([m.addr], timeout=2.0)
                event(self.log, "memberlistSynced", "exchanged full state", logging.DEBUG, node=m.name,
                      addr=m.addr, state=m.state)
            except (kinship.KinshipError, TimeoutError, OSError, ValueError) as exc:
                event(self.log, "memberlistSyncFailed", str(exc), logging.DEBUG, node=m.name, addr=m.addr,
                      state=m.state)
            finally:
                with self._lock:
                    self._syncing.discard(m.name)

    def _heal(self, reason: str, node: str) -> None:
        if self.on_heal is not None:
            self.on_heal(reason, node)

    def _check_refuted(self) -> None:
        try:
            count = self.stats().get("refutations", 0)
        except kinship.KinshipClosed:
            return
        if count > self._refutations:
            event(self.log, "memberlistRefuted", "peers suspected or declared this node dead; it refuted that",
                  logging.WARNING, count=count - self._refutations, total=count)
            self._refutations = count
            self._heal("refuted", self.settings.name)

    def _check_decrypt(self) -> None:
        try:
            failures = self.stats().get("decrypt_failures", 0)
        except kinship.KinshipClosed:
            return
        if failures > self._decrypt_seen:
            event(self.log, "memberlistDecryptFailures",
                  "gossip packets that our keys cannot decrypt: a node with another gossip key "
                  "(memberlist.keyFile) is trying to reach this cluster", logging.WARNING,
                  count=failures - self._decrypt_seen, total=failures)
            self._decrypt_seen = failures

    # -- reads -----------------------------------------------------------------------------
    def members(self) -> list[MemberView]:
        cl = self.cluster
        if cl is None:
            return []
        out: dict[str, MemberView] = {}
        try:
            for m in cl.members():
                out[m.name] = _view(m)
            if not out and not self._stop.is_set():
                raise kinship.KinshipClosed("no local member: the cluster is closed")
            with self._lock:
                known = set(self._known)
            for name in known - set(out):
                tomb = cl.member(name)
                if tomb is not None:
                    out[name] = _view(tomb)
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


def _view(m: kinship.Member) -> MemberView:
    return MemberView(m.name, m.addr, m.state.name.lower(), dict(m.meta), m.epoch)


def _tcp_reachable(addr: str, timeout: float = 0.5) -> bool:
    try:
        host, port = split_addr(addr)
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False
