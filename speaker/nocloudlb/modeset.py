"""Which modes run and how each one is made (issue 23: one job out of daemon.py; modes.py says what a
mode is).

``ModeSet`` makes the speaker's modes into ``Runtime.modes`` (runtime.py), in apply order:

- ``build(cfg)``: the modes every speaker runs at start (layer 2: the L2Mode with its announcer,
  the delivery module on lo, the handover forwarder), each one's few lines marked ``# mode: NAME``;
- ``ensure(cfg)``: the optional modes a config asks for (data plane for Backends, BGP for BGPPeers),
  started on the first reconcile that needs one, before layer 2; one whose start fails is logged
  ``modeFailed`` and tried again 30 s later, the other modes going on;
- ``other_lo()``: the VIPs the modes other than layer 2 serve, which the layer-2 mode holds on lo too;
- ``sync_settings(cfg)`` (from ``ensure``): the data plane's connection sync (dataplane/connsync.py) as
  ``connectionSync`` says, and ``before_gain(ips)``, layer 2's hook before it announces VIPs it did not:
  the synced conntrack state is committed when one of them is forwarded by the data plane here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from . import logs
from .config import SpeakerConfig
from .modes import Mode, ModeRunner
from .runtime import Runtime

log = logging.getLogger("nocloudlb.speaker")


class ModeSet:
    def __init__(self, rt: Runtime, announcer_factory: Any, gate: Callable[[], str],
                 member_macs: Callable[[], dict[str, tuple[bytes, ...]]],
                 led_off_wire: Callable[[str, str], bool] = lambda member, ip: False) -> None:
        self.rt = rt  # modes, steps, post; l2 and delivery are set here
        self._announcer_factory = announcer_factory  # tests record instead of sending (None: L2Announcer)
        self.gate = gate  # may this node announce now (gate.py)
        self.member_macs = member_macs  # the members' MACs (views.py)
        self.led_off_wire = led_off_wire  # (member, ip): it leads ip without answering it (views.py)
        self._mode_failed_at: dict[str, float] = {}  # optional modes whose start failed, when

    def build(self, cfg: SpeakerConfig) -> list[Mode]:
        """The modes this speaker runs (each one's few construction lines, marked ``# mode: NAME``)."""
        from .l2 import delivery  # noqa: PLC0415 - heavy raw-socket code only when running
        from .l2.announcer import L2Announcer  # noqa: PLC0415
        from .l2.handoff import MEMBER_WAIT  # noqa: PLC0415
        from .l2.mode import L2Mode  # noqa: PLC0415

        modes: list[Mode] = []
        # mode: l2
        self.rt.delivery = self.rt.delivery or delivery
        self.rt.delivery.prepare_host()
        factory = self._announcer_factory or L2Announcer
        handover = None
        if self._announcer_factory is None and cfg.handover_grace > 0:
            from .l2.handover import HandoverForwarder  # noqa: PLC0415

            handover = HandoverForwarder(logging.getLogger("nocloudlb.l2"), grace=cfg.handover_grace)
        self.rt.l2 = L2Mode(None, self.rt.delivery, cfg.state_dir, gate=self.gate,
                            member_macs=self.member_macs, led_off_wire=self.led_off_wire,
                            handover=handover, post=self.rt.post,
                            other_lo=self.other_lo, suspecters=self.rt.suspecters, quorum=self.rt.has_quorum,
                            before_gain=self.before_gain)
        self.rt.l2.announcer = factory(cfg.node_name, logging.getLogger("nocloudlb.l2"),
                                       is_peer_mac=self.rt.l2.is_peer_mac, rate=cfg.announce_rate,
                                       burst=cfg.announce_burst, member_wait=MEMBER_WAIT)
        if hasattr(self.rt.l2.announcer, "on_contest"):  # another member announcing a VIP we hold: the wire rule
            self.rt.l2.announcer.on_contest = self.rt.l2.wire.contest
        modes.append(self.rt.l2)
        return modes

    # Modes a config may ask for after start (a reload that adds Backends or BGPPeers): each
    # is (name, does this config need it, how to make it). Started on the first reconcile
    # that needs it; a start that fails is logged and tried again 30 s later, while the
    # other modes go on.
    def optional(self) -> list[tuple[str, Any, Any]]:
        def dataplane(cfg: SpeakerConfig) -> Mode:  # mode: dataplane
            from .dataplane import DataplaneMode  # noqa: PLC0415

            return DataplaneMode()

        def bgp(cfg: SpeakerConfig) -> Mode:  # mode: bgp
            from .bgp.mode import BgpMode, FrrControl  # noqa: PLC0415

            def host(addr: str) -> str:
                return addr.rsplit(":", 1)[0].strip("[]")

            # point 8's flow handover goes to the other members (the join list, this node left out)
            peers = [host(a) for a in cfg.join if host(a) != host(cfg.bind)]
            return BgpMode(cfg.node_name, FrrControl(workdir=os.path.dirname(cfg.socket)), flow_peers=peers,
                           flow_rate=cfg.flow_rate, flow_burst=cfg.flow_burst)

        return [
            ("dataplane", lambda parsed: bool(getattr(parsed, "backends", None)), dataplane),
            ("bgp", lambda parsed: bool(getattr(parsed, "bgp_peers", None)), bgp),
        ]

    def other_lo(self) -> set[str]:
        """VIPs the modes other than layer 2 serve (BGP): the layer-2 mode holds them on lo too."""
        held: set[str] = set()
        for m in self.rt.modes:
            lo_vips = getattr(m.mode, "lo_vips", None)
            if m.name != "l2" and lo_vips is not None:
                held |= set(lo_vips())
        return held

    def sync_settings(self, cfg: SpeakerConfig) -> None:
        """Connection sync started, restarted with new settings or stopped, as ``connectionSync`` says."""
        want = cfg.connection_sync if cfg.connection_sync is not None and cfg.connection_sync.enabled else None
        current = self.rt.connsync
        if current is not None and current.settings != want:
            current.close()
            self.rt.connsync = None
            logs.event(log, "connSyncStopped")
        if want is not None and self.rt.connsync is None:
            from .dataplane.connsync import ConnSync  # noqa: PLC0415

            sync = ConnSync(want, cfg.state_dir)
            sync.start()
            self.rt.connsync = sync
            logs.event(log, "connSyncStarted", socket=want.socket, commitTimeout=want.commit_timeout)

    def before_gain(self, ips: list[str]) -> None:
        """Layer 2 is about to announce ``ips`` (not announced before): commit the synced state first when the
        data plane forwards one of them here (bounded by ``connectionSync.commitTimeout``)."""
        sync = self.rt.connsync
        if sync is None:
            return
        forwarded: set[str] = set()
        for m in self.rt.modes:
            vips = getattr(m.mode, "forwarded_vips", None)
            if vips is not None:
                forwarded |= set(vips())
        mine = [ip for ip in ips if ip in forwarded]
        if mine:
            sync.commit(mine)

    def ensure(self, cfg: SpeakerConfig) -> None:
        self.sync_settings(cfg)
        running = {m.name for m in self.rt.modes}
        for name, needed, make in self.optional():
            if name in running or not needed(cfg.parsed):
                continue
            if time.monotonic() - self._mode_failed_at.get(name, -1e9) < 30:
                continue
            try:
                mode = make(cfg)
                mode.start()
            except Exception as exc:  # noqa: BLE001 - one mode that cannot start never stops the others
                self._mode_failed_at[name] = time.monotonic()
                logs.event(log, "modeFailed", f"cannot start the {name} mode: {exc}", logging.ERROR, mode=name)
                continue
            # before layer 2, which applies last: it holds on lo what the others serve (lo_vips)
            self.rt.modes.insert(0, ModeRunner(mode, self.rt.steps))
            logs.event(log, "modeStarted", mode=name)
