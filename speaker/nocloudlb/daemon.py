"""The speaker: membership + config + health -> the published view -> modes (layer 2, ...).

One main thread owns every decision. Other threads (kinship events, health checks, control
socket, signals) only post to a queue; the main thread drains it and reconciles:

1. publish this node's metadata (labels and Local health, what the modes add: the MACs it
   answers from) when it changed,
2. build the *published* view: a NodeView per member decoded from its metadata, this node
   included, from the metadata it managed to publish (not from newer local labels or health:
   when publishing fails, every node still computes the same answer),
3. hand the view to every mode (``nocloudlb.modes``; layer 2 is ``nocloudlb.l2.mode.L2Mode``)
   behind an exception barrier: a mode whose ``apply`` raises withdraws everything and is
   retried at the next reconcile,
4. after a heal (membership's ``on_heal``), let each mode re-announce what may have moved.

Fail closed. When the gossip layer stops (kinship closed on an internal error) the view is
unknown: every mode withdraws and the process exits non-zero so systemd restarts it. One
exception never stops the loop. A graceful stop withdraws everything first, then leaves the
cluster (so the successor never announces while this node still answers), then closes.

Barriers. Each step of a reconcile runs behind its own barrier (``Steps``: counted in
``nocloudlb_speaker_step_errors_total{step}``, logged ``stepFailed``/``modeFailed``, rate limited),
so one failing step stops neither the others nor the modes' apply:

- ``publish`` fails: decide from the last published state (as for a gossip error);
- ``health`` (reading the checks' results) fails: no service is published healthy, so only the
  Local-policy services move away from this node (unknown health is not health);
- ``heartbeatPeers`` fails: the heartbeats keep their previous peer list;
- ``modes`` (starting an optional mode) fails: the running modes go on, the start is retried;
- a mode's ``apply`` fails: that mode withdraws (``ModeRunner``), the other modes apply;
- ``reload`` fails: the config in use stays; ``status`` fails: the request gets the error.

The view itself failing (``node_views`` raising) is not a step one can skip: the modes cannot be
handed a view, so it goes to the loop's barrier like any exception that escapes an iteration. There
the node *keeps what it holds*: withdrawing at once would leave its VIPs without an owner, since its
peers still elect it. If the errors last ``FAIL_BOUND`` (3 s: three retries at the loop's 1 s tick,
well beyond one glitch, and within a few heartbeat timeouts of the ``lan`` profile), the node fails
closed by a planned move: it publishes itself excluded (the drain label, as ``Views.meta`` does for a mode
that cannot serve), peers take its VIPs, and only then it withdraws; if even that publication fails,
it withdraws at once (it cannot tell peers, and an unknown view must not keep answering). A mode
whose apply fails for ``FAIL_BOUND`` trips the same exclusion: it has withdrawn, yet peers elect the
node. Once iterations (the mode) succeed again for ``RECOVER_HOLD`` (doubled at each new trip, so a
fault that comes back when the node serves again does not flap), the node is no longer excluded.

Parts (issue 23). ``Speaker`` is the lifecycle only, like ExaBGP's reactor: it starts the parts, runs
the loop that waits for events and schedules a pass, and stops; every decision and side effect lives
in a part with one job, which gets what it needs passed in (the live parts in one ``Runtime`` record)
and never imports this module:

- ``configstate.ConfigState``: the config in use, its keys and codec; load, apply, reload, key file;
  ``configcheck``: the checks beyond the schema (also ``nocloudlb validate``);
- ``views.Views``: what this node publishes and the published view; ``gate.StartGate``: may it announce;
- ``reconcile.Reconciler``: one pass (steps 1-4 above); ``failclosed.FailClosed``: the loop's barrier;
- ``modeset.ModeSet``: which modes run and how each is made;
- ``handlers.ControlHandlers``: the control socket's requests; ``peerview.PeerViews``: how other members
  see this node; ``status.StatusReport``: the status document and the metrics snapshot;
- ``leaserenewal.LeaseRenewal``: the layer-2 answering lease, renewed while the loop waits.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import time
from typing import Any

import kinship

from . import logs, sdnotify, stophandoff
from .bgp import hold
from .config import SpeakerConfig
from .configcheck import check_extra, health_specs, label_keys, local_services, metadata_problems, validate
from .configstate import RESTART_FIELDS, ConfigState
from .failclosed import FailClosed
from .gate import StartGate
from .handlers import ControlHandlers
from .health import HealthChecker
from .heartbeat import Heartbeat
from .leaserenewal import LeaseRenewal
from .membership import Membership, MembershipSettings
from .modes import ModeRunner
from .modeset import ModeSet
from .peerview import PeerViews
from .quorumwire import QuorumWiring
from .reconcile import Reconciler
from .runtime import Runtime, mode_rows
from .state import LabelStore
from .status import StatusReport
from .views import Views

log = logging.getLogger("nocloudlb.speaker")

# the config checks live in configcheck.py, mode_rows in runtime.py: their old import path keeps working
__all__ = ["EXIT_MEMBERSHIP_CLOSED", "RESTART_FIELDS", "Speaker", "check_extra", "health_specs", "label_keys",
           "local_services", "metadata_problems", "mode_rows", "validate"]

EXIT_MEMBERSHIP_CLOSED = 3


def _via(part: str, name: str) -> Any:
    """A Speaker attribute kept by one of its parts: callers and tests read and set it under the old name."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


def _calls(part: str, name: str) -> Any:
    """A Speaker method done by one of its parts: ``sp.status(req)`` is ``sp.report.status(req)``."""
    return property(lambda self: getattr(getattr(self, part), name))


class Speaker:
    """The lifecycle: ``run`` = ``_start`` (make the live parts, start the modes, control socket, metrics,
    gossip, heartbeats), ``_loop`` (wait, coalesce, one ``_iteration`` behind the barrier) and
    ``_shutdown``. The attributes and methods below the loop keep the names callers and tests use."""

    # the live parts (runtime.py) under the names callers and tests use
    membership = _via("rt", "membership")
    heartbeat = _via("rt", "heartbeat")
    health = _via("rt", "health")
    labels = _via("rt", "labels")
    l2 = _via("rt", "l2")
    modes = _via("rt", "modes")
    steps = _via("rt", "steps")
    ready = _via("rt", "ready")
    # the config in use (configstate.py); tests set sp.cfg after sp._load()
    cfg = _via("config", "cfg")
    keys = _via("config", "keys")
    codec = _via("config", "codec")
    holder = _via("config", "holder")

    def __init__(self, config_path: str, announcer_factory: Any = None, delivery: Any = None) -> None:
        self.config_path = config_path
        self.events: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.rt = Runtime(self.post, delivery=delivery)  # the live parts, made at start (runtime.py)
        self.config = ConfigState(config_path, self.rt)  # the config in use, its keys and codec; reloads
        self.views = Views(self.rt, self.config, self._fail_reason)  # what this node publishes, sees
        self.fail = FailClosed(self.rt, self.views)  # the loop's failure accounting: fail closed by a planned move
        self.gate = StartGate(self.rt, self.config)  # may this node announce yet (the first join, the settle)
        self.report = StatusReport(self.rt, self.config, self.views, self.fail)  # status and metrics
        self.peerview = PeerViews(self.rt, self.config, self.views)  # how other members see this node
        self.handlers = ControlHandlers(self.rt, self.config, self.views, self.report, self.peerview)
        self.modeset = ModeSet(self.rt, announcer_factory, self.gate.reason, self.views.member_macs,
                               self.views.led_off_wire)  # makes the modes
        self.reconciler = Reconciler(self.rt, self.config, self.views, self.modeset, self.fail)  # the decision pass
        self.lease = LeaseRenewal(self.rt)  # the layer-2 answering lease, renewed while the loop waits
        self.control: Any = None
        self._metrics: Any = None

    # -- posting from other threads / signal handlers ---------------------------------------

    def _fail_reason(self) -> str:
        """Why the loop fails closed now (``FailClosed``, made after ``Views``, which asks for it)."""
        return self.fail.reason()

    def post(self, what: str = "change") -> None:
        self.events.put(what)  # SimpleQueue.put is reentrant: safe from signal handlers

    # -- lifecycle -------------------------------------------------------------------------
    def run(self) -> int:
        ok, cfg = self.config.load()
        if not ok or cfg is None:
            logs.setup("info")
            logs.event(log, "configError", "cannot start: the config is invalid", logging.ERROR,
                       errors=self.config.holder.errors, path=self.config_path)
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
            code = self._loop()
        finally:
            self._shutdown()
        return code

    def _start(self, cfg: SpeakerConfig) -> None:
        self.rt.labels = LabelStore(cfg.state_dir)
        # the drain the last stop set (the unit's ExecStop) goes once this node decided with it (stophandoff.py)
        self.reconciler.stop_drain = stophandoff.Release(self.rt.labels, cfg.state_dir, self.post)
        self.rt.health = HealthChecker(self.post)
        self.config.apply(cfg, first=True)
        for mode in self.modeset.build(cfg):
            runner = ModeRunner(mode, self.rt.steps)
            self.rt.modes.append(runner)
            mode.start()

        from .control import ControlServer
        from .metrics import serve

        self.control = ControlServer(cfg.socket, self.handlers.handle)
        self.control.start()
        self._metrics = serve(cfg.metrics_bind, self.report.metrics_snapshot)

        settings = MembershipSettings(cfg.node_name, cfg.bind, cfg.join, self.config.keys, cfg.profile, cfg.overrides)
        self.rt.quorum = QuorumWiring(cfg, lambda: self.rt.membership, self.post)
        self.rt.membership = Membership(settings, self.post, logging.getLogger("nocloudlb.membership"),
                                        on_heal=lambda reason, node: self.post(f"heal\t{reason}\t{node}"),
                                        on_message=self.peerview.on_message)
        self._install_signals()
        meta = self.views.meta()
        self.rt.membership.start(meta)
        self.views.last_meta = meta
        self._start_heartbeat(settings, meta)

    def _start_heartbeat(self, settings: MembershipSettings, meta: dict[str, str]) -> None:
        """Direct heartbeats beside gossip (heartbeat.py); without them (offset 0, the port taken) the
        speaker runs on gossip's slower detection and says so."""
        interval, miss, offset = settings.heartbeat()
        if not offset:
            return
        host, _sep, port = settings.bind.rpartition(":")
        hb = Heartbeat(settings.name, host.strip("[]"), int(port) + offset, self.config.keys, interval, miss,
                       on_change=self.post, logger=logging.getLogger("nocloudlb.heartbeat"))
        if self.rt.quorum is not None:
            # the configured members from the start: before gossip's first list a node alone counted 1 of 1,
            # "gained" quorum, lost it at the list, and its next gain armed the settling of a quorum gained back
            # (l2/disagree.py): a takeover within ~1 s of start waited that out (a SIGTERM's successor: 0.3-1 s)
            hb.set_quorum_basis(self.rt.quorum.configured(), 1)
        try:
            hb.start()
        except OSError as exc:
            logs.event(log, "heartbeatFailed", f"cannot bind the heartbeat port {int(port) + offset}: {exc}; "
                       "failure detection falls back to gossip (slower)", logging.ERROR)
            return
        self.rt.heartbeat = hb
        hb.set_meta(meta)
        if self.rt.quorum is not None:
            self.rt.quorum.attach(hb, self.rt.l2)

    def _install_signals(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.post("stop"))
        signal.signal(signal.SIGINT, lambda *_: self.post("stop"))
        signal.signal(signal.SIGHUP, lambda *_: self.post("reload"))

    def _loop(self) -> int:
        """The decision loop; returns the exit code (0 on stop, non-zero when the gossip layer closed)."""
        wd = sdnotify.watchdog_interval()
        next_wd = time.monotonic()
        while True:
            timeout = 1.0 if wd is None else max(0.05, min(1.0, next_wd - time.monotonic()))
            if any(m.hook("busy") for m in self.rt.modes):
                timeout = min(timeout, 0.1)  # log serviceAnnounced as soon as the check ends
            settle_left = self.gate.settle_until - time.monotonic()
            if settle_left > 0:  # decide again as soon as the start-up settle ends
                timeout = min(timeout, settle_left + 0.01)
            try:
                items = [self._next_event(timeout)]  # renews the layer-2 lease while it waits
            except queue.Empty:
                items = ["tick"]
            while True:  # coalesce bursts
                try:
                    items.append(self.events.get_nowait())
                except queue.Empty:
                    break
            if "stop" in items:
                return 0
            try:
                self._iteration(items)
            except Exception as exc:  # noqa: BLE001 - the barrier: one exception never stops the loop
                self.fail.iteration_failed(exc)
                time.sleep(0.05)
            else:
                self.fail.iteration_ok()
            if self.rt.closed:
                return EXIT_MEMBERSHIP_CLOSED
            if wd is not None and time.monotonic() >= next_wd:
                sdnotify.notify("WATCHDOG=1")
                next_wd = time.monotonic() + wd

    def _next_event(self, timeout: float) -> str:
        """The loop's wait for the next event (queue.Empty after ``timeout``), renewing the layer-2 answering
        lease (l2/lease.py) at its start, whenever it is due meanwhile and just before the pass it returns to:
        a renewal wakes only this wait (no reconcile), every lease / 3 while the announcer holds addresses.
        Length: two heartbeat timeouts within [0.3 s, 2 s] (``fast``: 0.3 s, ``lan``: 1.2 s), so a frozen
        daemon's responder falls silent soon after its peers have taken its VIPs. After a stall longer than the
        lease (a freeze, or a pass that long) no renewal until the heartbeat thread has read what arrived
        meanwhile (two intervals) and a pass has reconciled from that (``Renewal``): the wait then ends early
        for it."""
        end = time.monotonic() + timeout
        while True:
            sleep = self.lease.step()  # also just before each pass: what it announces is answered at once
            left = end - time.monotonic()
            if sleep <= 0.0 or left <= 0.0:
                raise queue.Empty  # a pass now: the loop's own timeout, or the reconcile that ends a stall
            try:
                item = self.events.get(timeout=min(left, sleep))
            except queue.Empty:
                continue
            self.lease.step()
            return item

    def _iteration(self, items: list[str]) -> None:
        if "reload" in items:
            logs.event(log, "configReload", "reloading on SIGHUP", path=self.config_path)
            self.rt.steps.run("reload", self.config.reload)
        self.rt.steps.run("keyFile", self.config.poll_key_file)
        self.reconciler.reconcile()
        if self.rt.closed:
            return
        heals = []
        for item in items:
            if item.startswith("heal\t"):
                _h, reason, node = (item.split("\t") + ["", ""])[:3]
                heals.append((reason, node))
        if heals:
            self.reconciler.reannounce(heals)
        assert self.rt.membership is not None
        if not self.rt.ready and self.rt.membership.first_join_done.is_set():
            self.rt.ready = True
            sdnotify.notify("READY=1\nSTATUS=serving")
            logs.event(log, "speakerReady", members=len(self.rt.membership.members()))

    def _shutdown(self) -> None:
        self.rt.stopping = True
        # a restart keeps the BGP routes for the next speaker (bgp/hold.py); the unit's ExecStopPost
        # withdraws them if the stop was not clean or the start does not follow
        kept = hold.kept_on_stop(self.rt.modes, self.fail.reason())
        logs.event(log, "speakerStopping", "withdrawing, then leaving the cluster so peers take over at once",
                   kept=sorted(kept))
        sdnotify.notify("STOPPING=1")
        # stop answering first: the successor announces when it sees us leave, and by then nobody
        # here answers any more (a stop costs a few ms of no answer, never two answers)
        for m in self.rt.modes:
            if m.name not in kept:
                m.withdraw_all()
        if self.rt.membership is not None:
            self.rt.membership.leave(timeout=1.0)
        if self.rt.heartbeat is not None:
            self.rt.heartbeat.close()
        if self.rt.quorum is not None:
            self.rt.quorum.close()
        for m in self.rt.modes:
            m.close()
        if self.rt.connsync is not None:
            self.rt.connsync.close()
        if self.control is not None:
            self.control.stop()
        if self.rt.health is not None:
            self.rt.health.stop()
        if self._metrics is not None:
            self._metrics.shutdown()
        logs.event(log, "speakerStopped")
        logs.flush()  # every queued line written before the process goes (the log writer is a thread)

    # -- below: the names callers and tests use, kept by the parts ------------------------------
    @property
    def announcer(self) -> Any:
        return self.rt.l2.announcer if self.rt.l2 is not None else None

    quorum = _calls("rt", "has_quorum")  # connected to a majority of the cluster's votes: it may take VIPs
    _load = _calls("config", "load")
    reload = _calls("config", "reload")
    my_labels = _calls("views", "my_labels")
    member_macs = _calls("views", "member_macs")
    published = _calls("views", "published")
    node_views = _calls("views", "node_views")
    reconcile = _calls("reconciler", "reconcile")
    reannounce = _calls("reconciler", "reannounce")
    handle = _calls("handlers", "handle")
    peer_view = _calls("peerview", "ask")
    rows = _calls("report", "rows")
    status = _calls("report", "status")
    metrics_snapshot = _calls("report", "metrics_snapshot")
