"""One decision pass, and the re-announce after a heal (issue 23: one job out of daemon.py; the pass is
steps 1-4 of daemon.py's module docstring).

``Reconciler.reconcile()``: publish this node's metadata (views.py), build the published view, start
the optional modes a config asks for (modeset.py), hand the view to every mode behind its barrier,
then push the metadata to the heartbeats (peers act on a drain at once: this node's hand-off is armed
first), note a change of the fail-closed exclusion (failclosed.py), and once per config in use let
memory.settle() freeze its objects. When the gossip layer stopped, every mode withdraws instead
(``memberlistClosed``, ``Runtime.closed``: the loop exits). A view that cannot be built raises
``StepFailed`` for the loop's barrier.

``reannounce(heals)``: after a heal, each mode's ``on_heal`` hook re-announces what may have moved.
"""

from __future__ import annotations

import logging
from typing import Any

from . import logs, memory
from .configstate import ConfigState
from .failclosed import FailClosed
from .modes import StepFailed
from .modeset import ModeSet
from .runtime import Runtime
from .views import Views

log = logging.getLogger("nocloudlb.speaker")


class Reconciler:
    def __init__(self, rt: Runtime, config: ConfigState, views: Views, modeset: ModeSet, fail: FailClosed) -> None:
        self.rt = rt  # membership, modes, steps, closed, stopping
        self.config = config
        self.views = views
        self.modeset = modeset
        self.fail = fail
        self._settled: Any = None  # the parsed config whose objects memory.settle() froze
        self.stop_drain: Any = None  # stophandoff.Release: the drain of the last stop, removed after the start

    def reconcile(self) -> None:
        cfg = self.config.cfg
        if cfg is None or self.rt.membership is None or self.rt.stopping:
            return
        if self.rt.membership.closed:
            if not self.rt.closed:
                self.rt.closed = True
                logs.event(log, "memberlistClosed", "the gossip layer stopped: the cluster view is unknown; "
                           "withdrawing everything and exiting so the service manager restarts the speaker",
                           logging.ERROR)
            for m in self.rt.modes:
                m.withdraw_all()
            return
        self.rt.steps.run("publish", self.views.publish)  # failing: decide from the last published state
        ok, nodes = self.rt.steps.run("view", self.views.node_views)
        if not ok:  # no view to hand the modes: the loop's barrier decides (keep, then fail closed)
            raise StepFailed("view", self.rt.steps.failing.get("view", ""))
        self.rt.steps.run("modes", self.modeset.ensure, cfg)
        for m in self.rt.modes:
            m.apply(cfg.node_name, nodes, cfg.parsed)  # behind ModeRunner's barrier
        self.rt.steps.run("push", self.views.push)  # after the modes: a drain's hand-off is armed before peers act
        if self.stop_drain is not None and self.stop_drain.after_reconcile(self.modeset.gate()):
            logs.event(log, "stopDrainCleared", "the drain the last stop set to hand the VIPs over is removed: "
                       "this node takes its VIPs back as from an undrain")
        self.fail.note()
        if self._settled is not cfg.parsed:  # issue 10: no full collection over the config in a reconcile
            self._settled = cfg.parsed
            self.rt.steps.run("settle", memory.settle)

    def reannounce(self, heals: list[tuple[str, str]] | list[str]) -> list[str]:
        """Let each mode re-announce what may have moved behind this node's back after a heal."""
        pairs = [tuple((h.split("\t") + ["", ""])[1:3]) if isinstance(h, str) else h for h in heals]
        out: list[str] = []
        for m in self.rt.modes:
            out.extend(m.hook("on_heal", pairs) or [])
        return out
