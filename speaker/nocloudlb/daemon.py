"""The speaker: membership + config + health -> election -> layer-2 announcer and lo VIPs.

One main thread owns every decision. Other threads (kinship events, health checks, control
socket, signals) only post to a queue; the main thread drains it and reconciles:

1. build a NodeView per member (labels and Local health decoded from its metadata; this
   node from its own live state),
2. for every VIP (each service's ``status.loadBalancer.ingress``), ``layer2_decision``,
3. ``L2Announcer.set_announced`` with the VIPs this node leads, and ``delivery.sync_lo_vips``
   with every VIP this node may serve (its L2Advertisements select it): failover moves no
   address, drain and health move only the ARP/NDP answers,
4. overlay what the L2 layer really does with each VIP it was given (``L2Announcer.stats()``:
   ``checking`` during the RFC 5227 check, ``announcing``, ``conflict`` when another MAC
   answers for it), so status, metrics and logs never claim an address the announcer holds
   back: such a VIP shows ``announcing: false`` with reason ``conflictCheck`` or ``ipConflict``,
5. log ``serviceAnnounced`` / ``serviceWithdrawn`` (with ``reason``) on every change. The
   ``ipConflict`` event itself is logged once per conflict by the announcer, not here.
6. after a heal (membership's ``on_heal``: a member became alive, this node refuted a rumour of
   its death, or this process was paused), once the election has been re-run: re-announce
   every VIP this node leads (``L2Announcer.reannounce``, the full gratuitous schedule).
   A node that never lost a VIP in its own view sends nothing on its own, yet the interim owner
   may have moved the clients' neighbour caches to its MAC; and a partition merge may leave
   clients pointed at the side that lost the VIP. Logged as ``serviceReannounced`` (reasons,
   nodes, ips), counted in ``nocloudlb_speaker_reannounced_total{reason}``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import kinship
from prometheus_client import Counter

from nocloudlb.core.election import DRAIN_LABEL, NodeView, layer2_decision
from nocloudlb.core.errors import ConfigError

from . import logs, sdnotify
from .config import ConfigHolder, SpeakerConfig, now_iso
from .health import CheckSpec, HealthChecker
from .membership import KeyFileError, Membership, MembershipSettings, read_key_file
from .metadata import MetaCodec
from .state import LabelStore

log = logging.getLogger("nocloudlb.speaker")

REANNOUNCED = Counter("nocloudlb_speaker_reannounced",
                      "Times this node re-announced the VIPs it leads after the cluster healed", ["reason"])

RESTART_FIELDS = ("node_name", "bind", "join", "profile", "overrides", "socket", "metrics_bind", "state_dir",
                  "handover_grace")


@dataclass
class VipRow:
    ip: str
    service: str
    pool: str
    leader: str | None
    announcing: bool  # the election's answer until ``with_l2`` overlays the L2 layer's
    reason: str
    interfaces: list[str]
    on_lo: bool
    l2_state: str = ""  # the announcer's state: "" (not given to it) | checking | announcing | conflict
    conflict: dict | None = None  # ip, mac, iface, at of the other MAC that answers for it

    def view(self) -> dict[str, Any]:
        return {"ip": self.ip, "service": self.service, "pool": self.pool, "leader": self.leader,
                "announcing": self.announcing, "reason": self.reason, "interfaces": self.interfaces,
                "onLo": self.on_lo, "l2State": self.l2_state, "conflict": self.conflict}


@dataclass
class L2View:
    """What the announcer does: ip -> state, and ip -> conflict record. ``known`` False: no stats."""

    states: dict[str, str]
    conflicts: dict[str, dict]
    known: bool = True


def with_l2(rows: list[VipRow], l2: L2View) -> list[VipRow]:
    """Rows as the segment sees them: a VIP this node won is announcing only when the L2 layer says so.

    Won but still under the RFC 5227 check: reason ``conflictCheck``; another MAC answered (also
    while the announcer re-checks a conflicted address): reason ``ipConflict`` with the conflict.
    """
    out = []
    for r in rows:
        state = l2.states.get(r.ip, "")
        conflict = l2.conflicts.get(r.ip)
        if not r.announcing or not l2.known:
            out.append(replace(r, l2_state=state, conflict=conflict))
        elif state == "announcing":
            out.append(replace(r, l2_state=state, conflict=None))
        elif conflict is not None or state == "conflict":
            out.append(replace(r, announcing=False, reason="ipConflict", l2_state=state, conflict=conflict))
        elif state == "checking":
            out.append(replace(r, announcing=False, reason="conflictCheck", l2_state=state))
        else:  # not (yet) taken by the announcer
            out.append(replace(r, announcing=False, reason="l2Pending", l2_state=state))
    return out


def neighbour_table(ips: set[str]) -> dict[str, str]:
    """``ip -> MAC`` (lowercase, colons) from the kernel's neighbour table (ARP and NDP), for ``ips``."""
    if not ips:
        return {}
    from pyroute2 import IPRoute  # noqa: PLC0415

    out: dict[str, str] = {}
    with IPRoute() as ipr:
        for family in (socket.AF_INET, socket.AF_INET6):
            for n in ipr.get_neighbours(family=family):
                dst, lladdr = n.get("NDA_DST"), n.get("NDA_LLADDR")
                if dst and lladdr and lladdr != "00:00:00:00:00:00":
                    ip = str(ipaddress.ip_address(dst))
                    if ip in ips:
                        out[ip] = lladdr.lower()
    return out


def member_ip(addr: str) -> str | None:
    """The IP of a member's gossip address "ip:port" or "[ip6]:port"; None for a host name."""
    try:
        return str(ipaddress.ip_address(addr.rpartition(":")[0].strip("[]")))
    except ValueError:
        return None


def neighbour_macs(ips: set[str]) -> set[bytes]:
    """Link-layer addresses the kernel's neighbour table (ARP and NDP) holds for ``ips``."""
    return {bytes.fromhex(mac.replace(":", "")) for mac in neighbour_table(ips).values()}


def label_keys(parsed: Any) -> set[str]:
    """Label keys the election reads: the drain label and those in advertisement node selectors."""
    keys = {DRAIN_LABEL}
    for adv in parsed.l2_advertisements:
        for sel in adv.node_selectors or []:
            keys.update((sel.get("matchLabels") or {}).keys())
            keys.update(e.get("key") for e in sel.get("matchExpressions") or [] if e.get("key"))
    return keys


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


def check_extra(cfg: SpeakerConfig) -> tuple[list[str] | None, list[str]]:
    """Checks beyond the schema: the key file and the health checks. Returns (keys, errors)."""
    errors: list[str] = []
    keys = None
    if cfg.key_file:
        try:
            keys = read_key_file(cfg.key_file)
        except KeyFileError as exc:
            errors.append(str(exc))
    errors.extend(health_specs(cfg.parsed)[1])
    return keys, errors


class Speaker:
    def __init__(self, config_path: str, announcer_factory: Any = None, delivery: Any = None) -> None:
        self.config_path = config_path
        self.holder = ConfigHolder(config_path)
        self.events: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.ready = False
        self.keys: list[str] | None = None
        self.cfg: SpeakerConfig | None = None
        self.membership: Membership | None = None
        self.announcer: Any = None
        self.health: HealthChecker | None = None
        self.control: Any = None
        self.labels: LabelStore | None = None
        self.codec: MetaCodec | None = None
        self._announcer_factory = announcer_factory
        self._delivery = delivery
        self._last_meta: dict[str, str] = {}
        self._rows: list[VipRow] = []  # the election's rows; with_l2 gives what is really announced
        self._l2_busy = False  # a VIP this node won is under the conflict check: reconcile again soon
        self._peer_macs: frozenset[bytes] = frozenset()
        self._peer_macs_at = -1e9
        self._prev: dict[tuple[str, str], tuple[bool, str]] = {}
        self._lo: set[str] = set()
        self._announced: set[str] = set()
        self._leaders: dict[str, str] = {}
        self.handover: Any = None  # l2.handover.HandoverForwarder with the real announcer
        self._forwarded: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = False
        self._restart_pending: list[str] = []
        self._peer_configs: dict[str, str] = {}

    # -- posting from other threads / signal handlers ---------------------------------------
    def post(self, what: str = "change") -> None:
        self.events.put(what)  # SimpleQueue.put is reentrant: safe from signal handlers

    # -- config ---------------------------------------------------------------------------
    def _load(self) -> tuple[bool, SpeakerConfig | None]:
        ok, cfg = self.holder.reload()
        if ok and cfg is not None:
            keys, extra = check_extra(cfg)
            if extra:
                # refuse the whole file: keep the last good config, as for a schema error
                with self.holder._lock:
                    self.holder.current = self.cfg
                    self.holder.state, self.holder.errors = "error", extra
                    self.holder.last_good_at = self._last_good_at
                return False, self.cfg
            self.keys = keys
        return ok, cfg

    _last_good_at = ""

    def _apply_config(self, cfg: SpeakerConfig, first: bool) -> None:
        prev = self.cfg
        self.cfg = cfg
        self._last_good_at = self.holder.last_good_at
        self.codec = MetaCodec(
            [s.key for s in cfg.parsed.services if s.traffic_policy == "Local"], label_keys(cfg.parsed), cfg.digest)
        assert self.health is not None
        self.health.configure(health_specs(cfg.parsed)[0])
        if prev is not None:
            changed = [f for f in RESTART_FIELDS if getattr(prev, f) != getattr(cfg, f)]
            self._restart_pending = changed
            if changed:
                logs.event(log, "configRestartNeeded", "these settings take effect at the next restart",
                           logging.WARNING, settings=changed)
            if self.membership is not None and self.keys is not None and self.keys != self.membership.keys:
                try:
                    self.membership.set_keys(self.keys)
                except (kinship.KinshipError, ValueError, TimeoutError) as exc:
                    logs.event(log, "memberlistKeysFailed", str(exc), logging.ERROR)
        logs.event(log, "configLoaded", path=cfg.path, digest=cfg.digest, pools=len(cfg.parsed.pools),
                   services=len(cfg.parsed.services), l2Advertisements=len(cfg.parsed.l2_advertisements),
                   first=first)

    def reload(self) -> dict[str, Any]:
        ok, cfg = self._load()
        if ok and cfg is not None:
            self._apply_config(cfg, first=False)
            self.post()
        else:
            logs.event(log, "configStale", "the new config is refused; the last good one keeps being served",
                       logging.ERROR, errors=self.holder.errors, lastGoodAt=self.holder.last_good_at)
        return {"ok": ok, "config": self.holder.status()}

    # -- lifecycle -------------------------------------------------------------------------
    def run(self) -> int:
        ok, cfg = self._load()
        if not ok or cfg is None:
            logs.setup("info")
            logs.event(log, "configError", "cannot start: the config is invalid", logging.ERROR,
                       errors=self.holder.errors, path=self.config_path)
            return 1
        logs.setup(cfg.log_level)
        kinship.log_to_python(logging.WARNING)
        try:
            self._start(cfg)
        except (OSError, RuntimeError, ValueError, kinship.KinshipError) as exc:
            # a socket in use, a port taken, sysctls we may not set, a corrupt labels file, ...
            logs.event(log, "speakerFailed", f"cannot start: {exc}", logging.ERROR)
            self._shutdown()
            return 1
        logs.event(log, "speakerStarted", node=cfg.node_name, profile=cfg.profile, pid=os.getpid())
        try:
            self._loop()
        finally:
            self._shutdown()
        return 0

    def _start(self, cfg: SpeakerConfig) -> None:
        self.labels = LabelStore(cfg.state_dir)
        self.health = HealthChecker(self.post)
        self._apply_config(cfg, first=True)

        from .l2 import delivery  # noqa: PLC0415 - heavy raw-socket code only when running
        from .l2.announcer import L2Announcer  # noqa: PLC0415

        self._delivery = self._delivery or delivery
        self._delivery.prepare_host()
        factory = self._announcer_factory or L2Announcer
        self.announcer = factory(cfg.node_name, logging.getLogger("nocloudlb.l2"),
                                 is_peer_mac=lambda mac: mac in self.peer_macs(mac))
        self.announcer.start()
        if self._announcer_factory is None and cfg.handover_grace > 0:
            from .l2.handover import HandoverForwarder  # noqa: PLC0415

            self.handover = HandoverForwarder(logging.getLogger("nocloudlb.l2"), grace=cfg.handover_grace)
            self.handover.start()

        from .control import ControlServer
        from .metrics import serve

        self.control = ControlServer(cfg.socket, self.handle)
        self.control.start()
        self._metrics = serve(cfg.metrics_bind, self.metrics_snapshot)

        settings = MembershipSettings(cfg.node_name, cfg.bind, cfg.join, self.keys, cfg.profile, cfg.overrides)
        self.membership = Membership(settings, self.post, logging.getLogger("nocloudlb.membership"),
                                     on_heal=lambda reason, node: self.post(f"heal\t{reason}\t{node}"))
        self._install_signals()
        self.membership.start(self._meta())

    def _install_signals(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.post("stop"))
        signal.signal(signal.SIGINT, lambda *_: self.post("stop"))
        signal.signal(signal.SIGHUP, lambda *_: self.post("reload"))

    def _loop(self) -> None:
        wd = sdnotify.watchdog_interval()
        next_wd = time.monotonic()
        while True:
            timeout = 1.0 if wd is None else max(0.05, min(1.0, next_wd - time.monotonic()))
            if self._l2_busy:
                timeout = min(timeout, 0.1)  # log serviceAnnounced as soon as the check ends
            try:
                items = [self.events.get(timeout=timeout)]
            except queue.Empty:
                items = ["tick"]
            while True:  # coalesce bursts
                try:
                    items.append(self.events.get_nowait())
                except queue.Empty:
                    break
            if "stop" in items:
                return
            if "reload" in items:
                logs.event(log, "configReload", "reloading on SIGHUP", path=self.config_path)
                self.reload()
            self.reconcile()
            heals = [i for i in items if i.startswith("heal\t")]
            if heals:
                self.reannounce(heals)
            assert self.membership is not None
            if not self.ready and self.membership.first_join_done.is_set():
                self.ready = True
                sdnotify.notify("READY=1\nSTATUS=serving")
                logs.event(log, "speakerReady", members=len(self.membership.members()))
            if wd is not None and time.monotonic() >= next_wd:
                sdnotify.notify("WATCHDOG=1")
                next_wd = time.monotonic() + wd

    def _shutdown(self) -> None:
        self._stopping = True
        logs.event(log, "speakerStopping", "leaving the cluster so peers take over at once")
        sdnotify.notify("STOPPING=1")
        if self.membership is not None:
            self.membership.leave(timeout=1.0)
        if self.announcer is not None:
            self.announcer.set_announced({})
            self.announcer.stop()
        if self.handover is not None:
            self.handover.close()
        for key, (announcing, _reason) in self._prev.items():
            if announcing:
                logs.event(log, "serviceWithdrawn", service=key[0], ip=key[1], reason="shutdown")
        if self.control is not None:
            self.control.stop()
        if self.health is not None:
            self.health.stop()
        if self._metrics is not None:
            self._metrics.shutdown()
        logs.event(log, "speakerStopped")

    _metrics: Any = None

    # -- the decision ----------------------------------------------------------------------
    def my_labels(self) -> dict[str, str]:
        assert self.cfg is not None and self.labels is not None
        return self.labels.apply(self.cfg.node_labels)

    def _meta(self) -> dict[str, str]:
        assert self.codec is not None and self.health is not None
        return self.codec.encode(self.my_labels(), self.health.healthy())

    def node_views(self) -> list[NodeView]:
        assert self.cfg is not None and self.codec is not None and self.health is not None
        me = self.cfg.node_name
        views = [NodeView(me, self.my_labels(), "alive", frozenset(self.health.healthy()))]
        peers: dict[str, str] = {}
        for m in self.membership.members() if self.membership else []:
            if m.name == me:
                continue
            info = self.codec.decode(m.meta)
            peers[m.name] = info.config_hash
            views.append(NodeView(m.name, info.labels, m.state, info.healthy))
        for name, digest in peers.items():
            if digest and digest != self.cfg.digest and self._peer_configs.get(name) != digest:
                logs.event(log, "configMismatch", "a peer runs another config version", logging.WARNING,
                           node=name, theirs=digest, ours=self.cfg.digest)
        self._peer_configs = peers
        return views

    def reconcile(self) -> None:
        cfg = self.cfg
        if cfg is None or self.membership is None or self._stopping:
            return
        meta = self._meta()
        if meta != self._last_meta:
            try:
                self.membership.set_meta(meta)
                self._last_meta = meta
            except kinship.MetaTooLarge:
                logs.event(log, "metadataTooLarge", "labels used by node selectors do not fit in 512 bytes",
                           logging.ERROR, labels=sorted(self.codec.label_keys if self.codec else []))
            except (kinship.KinshipError, TimeoutError) as exc:
                logs.event(log, "metadataFailed", str(exc), logging.WARNING)
        nodes = self.node_views()
        me = cfg.node_name
        parsed = cfg.parsed
        my_labels = self.my_labels()
        rows: list[VipRow] = []
        joined = self.membership.first_join_done.is_set()
        refused = self.membership.join_state == "joinFailed" and self.membership.join_refused
        skip: set[str] = set()
        handed: dict[str, str] = {}
        states = {n.name: n.state for n in nodes}
        announce: dict[str, list[str] | None] = {}
        lo: set[str] = set()
        for svc in parsed.services:
            for ip in svc.ingress_ips:
                pool = parsed.pool_for_ip(ip)
                if pool is None:
                    rows.append(VipRow(ip, svc.key, "", None, False, "notInAnyPool", [], False))
                    continue
                ads = parsed.l2_advertisements_for_pool(pool.name)
                leader, reason = layer2_decision(me, nodes, ads, svc, ip)
                if reason == "" and not joined:
                    reason = "notReady"  # never take addresses before the first join: peers may hold them
                if reason == "" and refused:
                    reason = "joinRefused"  # peers are up but refuse our gossip (wrong key): do not fight them
                if reason == "" and ip not in self._announced:
                    # gained from a member we saw lead it (failover, drain, leave): skip the RFC 5227
                    # check, it would only cost failover time. Otherwise (first start, a new VIP, a
                    # restart that preempts) check: answers from members' MACs are a handover and
                    # ignored (L2Announcer.is_peer_mac), any other MAC is a conflict and never fought.
                    before = self._leaders.get(ip)
                    if before and before != me:
                        skip.add(ip)
                        if states.get(before) == "alive":
                            handed[ip] = before  # a planned move: its in-flight connections go on there
                mine = [a for a in ads if a.selects_service(svc.labels) and a.selects_node(my_labels)]
                ifaces: list[str] = []
                if any(not a.interfaces for a in mine):
                    ifaces = []
                else:
                    ifaces = sorted({i for a in mine for i in a.interfaces})
                if mine:
                    lo.add(ip)
                if reason == "":
                    prev = announce.get(ip)
                    if prev is None:
                        announce[ip] = ifaces
                    elif prev and ifaces:
                        announce[ip] = sorted(set(prev) | set(ifaces))
                    else:
                        announce[ip] = []
                rows.append(VipRow(ip, svc.key, pool.name, leader, reason == "", reason, ifaces, bool(mine)))
        final = {ip: v or [] for ip, v in announce.items()}
        assert self.announcer is not None and self._delivery is not None
        if hasattr(self._delivery, "verify_host"):  # edges (issue 8 defect 8): ARP sysctls, every reconcile
            self._delivery.verify_host()
        if self.handover is not None:
            self._handover(final, handed)
        self.announcer.set_announced(final, skip_check=skip & set(final))
        self._announced = set(final)
        self._leaders = {r.ip: r.leader for r in rows if r.leader}
        if lo != self._lo:
            try:
                self._delivery.sync_lo_vips(lo, state_file=os.path.join(cfg.state_dir, "lo-vips.json"))
                self._lo = lo
            except Exception as exc:  # noqa: BLE001 - report and retry at the next tick
                logs.event(log, "loSyncFailed", str(exc), logging.ERROR)
        seen = with_l2(rows, self.l2_view())
        self._l2_busy = any(r.l2_state == "checking" and r.reason == "conflictCheck" for r in seen)
        self._log_changes(seen, me)
        with self._lock:
            self._rows = rows

    def reannounce(self, heals: list[str]) -> list[str]:
        """Re-announce every VIP this node leads now (run after ``reconcile``). ``heals`` are
        ``heal<TAB>reason<TAB>node`` items. Returns the addresses re-announced."""
        reasons: dict[str, set[str]] = {}
        for item in heals:
            dummy, reason, node = (item.split("\t") + ["", ""])[:3]
            reasons.setdefault(reason, set()).add(node)
        if self.announcer is None or not self._announced:
            return []
        ips = self.announcer.reannounce(sorted(self._announced))
        if ips:
            for reason in reasons:
                REANNOUNCED.labels(reason).inc()
            logs.event(log, "serviceReannounced", "the cluster healed: announcing again the VIPs this node leads",
                       reasons=sorted(reasons), nodes=sorted(set().union(*reasons.values())), count=len(ips),
                       ips=ips[:50], node=self.cfg.node_name if self.cfg else "")
        return ips

    def _handover(self, final: dict[str, list[str]], handed: dict[str, str]) -> None:
        """Before announcing VIPs taken over from a live member, forward the TCP connections still in
        flight to it (l2/handover.py); end the forwarding of VIPs this node no longer leads."""
        assert self.handover is not None and self.announcer is not None
        lost = sorted(self._forwarded - set(final))
        self.handover.stop_forwarding(lost)
        self._forwarded.difference_update(lost)
        handed = {ip: n for ip, n in handed.items() if ip in final}
        if not handed:
            return
        members = self.membership.members() if self.membership else []
        addrs = {m.name: ip for m in members if m.name in handed.values() and (ip := member_ip(m.addr))}
        try:
            macs = neighbour_table(set(addrs.values()))
        except (OSError, ValueError) as exc:
            logs.event(log, "neighboursFailed", f"cannot read the neighbour table: {exc}", logging.WARNING)
            return
        all_ifaces = self.announcer.stats().get("interfaces", [])
        moves = {ip: (macs.get(addrs.get(n, ""), ""), final[ip] or all_ifaces) for ip, n in handed.items()}
        self._forwarded.update(self.handover.forward(moves))

    def peer_macs(self, mac: bytes | None = None) -> frozenset[bytes]:
        """MACs of the members' gossip addresses, from the kernel's neighbour table (kinship talks to
        every member, so they are resolved). Re-read at most every 0.2 s when ``mac`` is unknown, else
        every 2 s. Called from the announcer's thread while it checks an address."""
        now = time.monotonic()
        age = now - self._peer_macs_at
        if age > 2.0 or (mac is not None and mac not in self._peer_macs and age > 0.2):
            self._peer_macs_at = now
            ips: set[str] = set()
            me = self.cfg.node_name if self.cfg else ""
            for m in self.membership.members() if self.membership else []:
                ip = member_ip(m.addr)  # None for a member known by host name: no neighbour entry to match
                if m.name != me and ip:
                    ips.add(ip)
            try:
                self._peer_macs = frozenset(neighbour_macs(ips))
            except (OSError, ValueError) as exc:
                logs.event(log, "neighboursFailed", f"cannot read the neighbour table: {exc}", logging.WARNING)
        return self._peer_macs

    def l2_view(self) -> L2View:
        """The announcer's per-VIP state and conflicts, read now (it changes them on its own thread)."""
        if self.announcer is None:
            return L2View({}, {}, known=False)
        try:
            vips = self.announcer.stats().get("vips", {})
            conflicts = {c["ip"]: c for c in self.announcer.conflicts()}
        except (AttributeError, KeyError, TypeError):  # an announcer without stats(): trust the election
            return L2View({}, {}, known=False)
        return L2View({ip: v.get("state", "") for ip, v in vips.items()}, conflicts)

    def rows(self) -> tuple[list[VipRow], L2View]:
        """Every VIP row with the L2 layer's live state overlaid, and that state."""
        with self._lock:
            rows = list(self._rows)
        l2 = self.l2_view()
        return with_l2(rows, l2), l2

    def _log_changes(self, rows: list[VipRow], me: str) -> None:
        seen: dict[tuple[str, str], tuple[bool, str]] = {}
        for r in rows:
            key = (r.service, r.ip)
            now = (r.announcing, r.reason)
            seen[key] = now
            before = self._prev.get(key)
            if before == now:
                continue
            if r.announcing:
                logs.event(log, "serviceAnnounced", service=r.service, ip=r.ip, node=me, pool=r.pool,
                           protocol="layer2", interfaces=r.interfaces or "all eligible")
            elif before is None or before[0] or before[1] != r.reason:
                withdrawn = bool(before and before[0])
                logs.event(log, "serviceWithdrawn" if withdrawn else "serviceNotAnnounced",
                           level=logging.INFO if withdrawn else logging.DEBUG,
                           service=r.service, ip=r.ip, reason=r.reason, leader=r.leader, node=me)
        for key, was in self._prev.items():
            if key not in seen and was[0]:
                logs.event(log, "serviceWithdrawn", service=key[0], ip=key[1], reason="serviceDeleted", node=me)
        self._prev = seen

    # -- control ---------------------------------------------------------------------------
    def handle(self, req: dict) -> dict:
        cmd = req.get("cmd")
        if cmd == "status":
            return self.status()
        if cmd == "label":
            return self._label(req)
        if cmd == "reload":
            self.post("reload")
            return {"ok": True, "queued": True}
        if cmd == "keys":
            return {"ok": True, "keyIds": self.membership.key_ids() if self.membership else []}
        return {"ok": False, "error": f"unknown cmd {cmd!r} (known: status, label, reload, keys)"}

    def _label(self, req: dict) -> dict:
        set_ = req.get("set") or {}
        unset = req.get("unset") or []
        if not isinstance(set_, dict) or not isinstance(unset, list):
            return {"ok": False, "error": "label: 'set' is an object of key: value, 'unset' a list of keys"}
        for k, v in set_.items():
            if not isinstance(k, str) or not k or "=" in k or any(c.isspace() for c in k) or len(k) > 317:
                return {"ok": False, "error": f"label: bad key {k!r}"}
            if not isinstance(v, str) or len(v) > 63:
                return {"ok": False, "error": f"label {k}: value {v!r} must be a string of at most 63 characters"}
        for k in unset:
            if not isinstance(k, str) or not k:
                return {"ok": False, "error": f"label: bad key to unset {k!r}"}
        assert self.labels is not None
        with self._lock:
            try:
                self.labels.update(set_, unset)
            except OSError as exc:
                return {"ok": False, "error": f"label: cannot persist to {self.labels.path}: {exc}"}
        logs.event(log, "labelsChanged", set=set_, unset=unset, labels=self.my_labels())
        self.post()
        return {"ok": True, "labels": self.my_labels()}

    def status(self) -> dict[str, Any]:
        cfg = self.cfg
        me = cfg.node_name if cfg else ""
        members = []
        if self.membership is not None and self.codec is not None:
            for m in self.membership.members():
                if m.name == me:
                    labels = self.my_labels()
                else:
                    labels = self.codec.decode(m.meta).labels
                members.append({"name": m.name, "addr": m.addr, "state": m.state, "labels": labels,
                                "configDigest": m.meta.get("c", "")})
        rows, l2 = self.rows()
        ml = self.membership
        return {
            "node": me,
            "ready": self.ready,
            "profile": cfg.profile if cfg else "",
            "members": members,
            "vips": [r.view() for r in rows],
            "config": self.holder.status() | {"restartPending": self._restart_pending},
            "conflicts": sorted(l2.conflicts.values(), key=lambda c: c["ip"]),
            "labels": self.my_labels() if cfg and self.labels else {},
            "memberlist": {"state": ml.join_state if ml else "starting", "error": ml.join_error if ml else "",
                           "keyIds": ml.key_ids() if ml else [],
                           "encrypted": bool(ml and ml.settings.keys)},
            "health": self.health.status() if self.health else {},
            "arpSysctls": getattr(self._delivery, "sysctl_status", dict)(),  # edges (issue 8 defect 8)
            "time": now_iso(),
        }

    def metrics_snapshot(self) -> dict[str, Any]:
        rows, l2 = self.rows()
        counts: dict[str, int] = {}
        stats: dict[str, int] = {}
        if self.membership is not None:
            for m in self.membership.members():
                counts[m.state] = counts.get(m.state, 0) + 1
            try:
                stats = self.membership.stats()
            except kinship.KinshipError:
                stats = {}
        return {
            "announced": [{"ip": r.ip, "node": self.cfg.node_name if self.cfg else "", "service": r.service}
                          for r in rows if r.announcing],
            "config_ok": self.holder.state == "ok",
            "config_stale": self.holder.state != "ok" and self.cfg is not None,
            "members": counts,
            "kinship": stats,
            "conflicts": len(l2.conflicts),
        }


def validate(path: str) -> tuple[bool, list[str]]:
    """``nocloudlb validate``: the same checks as a (re)load."""
    from .config import load

    try:
        cfg = load(path)
    except ConfigError as exc:
        return False, list(exc.errors)
    _keys, errors = check_extra(cfg)
    return not errors, errors
