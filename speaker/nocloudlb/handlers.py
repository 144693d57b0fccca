"""The control socket's requests (issue 23: one job out of daemon.py; control.py is the socket).

``ControlHandlers.handle(req)`` answers one request of control.ControlServer, on its thread:

- ``status``: the status document (status.py); a bad VIP filter is the caller's error, any other
  failure is counted (step ``status``) and answered, never raised;
- ``label``: set or unset runtime labels (the rules of node.labels), persisted (state.LabelStore),
  logged ``labelsChanged``, then the decision thread publishes them;
- ``reload``: the decision thread reloads the config and the answer waits for it (configstate.py);
- ``keys``: the gossip key ids in use; ``peerView``: how another member sees this node (peerview.py).
"""

from __future__ import annotations

import logging
import threading

from . import logs
from .config import runtime_label_problem
from .configstate import ConfigState
from .peerview import PeerViews
from .runtime import Runtime
from .status import StatusReport
from .views import Views

log = logging.getLogger("nocloudlb.speaker")


class ControlHandlers:
    def __init__(self, rt: Runtime, config: ConfigState, views: Views, report: StatusReport,
                 peerview: PeerViews) -> None:
        self.rt = rt  # membership (keys), labels, steps, post
        self.config = config  # reload_and_wait
        self.views = views  # my_labels
        self.report = report
        self.peerview = peerview
        self._lock = threading.Lock()

    def handle(self, req: dict) -> dict:
        cmd = req.get("cmd")
        if cmd == "status":
            try:
                return self.report.status(req)
            except ValueError as exc:  # a bad VIP filter (statusview.select_vips)
                return {"ok": False, "error": str(exc)}
            except Exception as exc:  # noqa: BLE001 - counted; the decision thread is not concerned
                return {"ok": False, "error": f"status failed: {self.rt.steps.failed('status', exc)}"}
        if cmd == "label":
            return self.label(req)
        if cmd == "reload":
            return self.config.reload_and_wait()
        if cmd == "keys":
            return {"ok": True, "keyIds": self.rt.membership.key_ids() if self.rt.membership else []}
        if cmd == "peerView":
            ips = req.get("ips") or []
            if not isinstance(ips, list):
                return {"ok": False, "error": "peerView: 'ips' is a list of addresses"}
            return self.peerview.ask(ips)
        return {"ok": False, "error": f"unknown cmd {cmd!r} (known: status, label, reload, keys, peerView)"}

    def label(self, req: dict) -> dict:
        set_ = req.get("set") or {}
        unset = req.get("unset") or []
        if not isinstance(set_, dict) or not isinstance(unset, list):
            return {"ok": False, "error": "label: 'set' is an object of key: value, 'unset' a list of keys"}
        # the rules of node.labels in the config: what is set here is gossiped and logged too
        for problem in [runtime_label_problem(k, v) for k, v in set_.items()] + [
                runtime_label_problem(k) for k in unset]:
            if problem:
                return {"ok": False, "error": problem}
        assert self.rt.labels is not None
        with self._lock:
            try:
                self.rt.labels.update(set_, unset)
            except OSError as exc:
                return {"ok": False, "error": f"label: cannot persist to {self.rt.labels.path}: {exc}"}
        logs.event(log, "labelsChanged", set=set_, unset=unset, labels=self.views.my_labels())
        self.rt.post()
        return {"ok": True, "labels": self.views.my_labels()}
