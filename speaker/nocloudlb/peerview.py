"""Another member's view of this node (issue 23: one job out of daemon.py).

node_drain confirms a drain from a peer: ``nocloudlb`` asks the speaker (control socket ``peerView``),
which asks up to three other live members over kinship user messages how they see this node (state,
labels) and who leads the given VIPs, and answers with the first reply.

``PeerViews.on_message`` is membership's user-message callback: it answers a view query (from the
published view, views.py, and the modes' VIP rows) and hands a reply to the ``ask`` waiting for it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

import kinship

from . import logs
from .configstate import ConfigState
from .runtime import Runtime, mode_rows
from .views import Views

log = logging.getLogger("nocloudlb.speaker")


class PeerViews:
    def __init__(self, rt: Runtime, config: ConfigState, views: Views) -> None:
        self.rt = rt  # membership, modes
        self.config = config  # cfg.node_name
        self.views = views  # peers: the members' decoded metadata
        self._lock = threading.Lock()
        self._waiters: dict[str, tuple[threading.Event, dict]] = {}

    def on_message(self, sender: str, data: bytes) -> None:
        """A user message from a member: a view query (answered) or the answer to ours."""
        if len(data) > 65536:
            return
        try:
            msg = json.loads(data)
        except ValueError:
            return
        if not isinstance(msg, dict):
            return
        if msg.get("q") == "view" and isinstance(msg.get("id"), str) and self.rt.membership is not None:
            ips = [str(ip) for ip in (msg.get("ips") or [])[:256]] if isinstance(msg.get("ips"), list) else []
            info = self.views.peers.get(sender)
            state = next((m.state for m in self.rt.membership.members() if m.name == sender), "unknown")
            leaders = {v["ip"]: v.get("leader") for m in self.rt.modes for v in mode_rows(m.status())
                       if v.get("ip") in ips}
            reply = {"r": msg["id"][:64], "node": self.config.cfg.node_name if self.config.cfg else "",
                     "about": sender, "state": state, "labels": dict(info.labels) if info else {}, "leaders": leaders}
            try:
                self.rt.membership.send(sender, json.dumps(reply).encode(), timeout=1.0)
            except (kinship.KinshipError, TimeoutError, RuntimeError) as exc:
                logs.event(log, "peerViewFailed", f"cannot answer {sender}: {exc}", logging.DEBUG)
        elif isinstance(msg.get("r"), str):
            with self._lock:
                waiter = self._waiters.get(msg["r"])
            if waiter is not None:
                waiter[1].update(msg, sender=sender)
                waiter[0].set()

    def ask(self, ips: list[str], timeout: float = 2.0) -> dict:
        """Ask the other live members how they see this node and who leads ``ips``; the first answer."""
        me = self.config.cfg.node_name if self.config.cfg else ""
        peers = [m.name for m in (self.rt.membership.members() if self.rt.membership else [])
                 if m.name != me and m.state == "alive"]
        if not peers:
            return {"ok": False, "error": "no other live member to ask"}
        qid = os.urandom(8).hex()
        ev, answer = threading.Event(), dict[str, Any]()
        with self._lock:
            self._waiters[qid] = (ev, answer)
        try:
            data = json.dumps({"q": "view", "id": qid, "ips": [str(i) for i in ips][:256]}).encode()
            for name in peers[:3]:
                try:
                    assert self.rt.membership is not None
                    self.rt.membership.send(name, data, timeout=1.0)
                except (kinship.KinshipError, TimeoutError, RuntimeError):
                    continue
            if not ev.wait(timeout):
                return {"ok": False, "error": f"no member answered within {timeout:g}s (asked {peers[:3]})"}
        finally:
            with self._lock:
                self._waiters.pop(qid, None)
        return {"ok": True, "peer": answer.get("sender") or answer.get("node"), "state": answer.get("state"),
                "labels": answer.get("labels") or {}, "leaders": answer.get("leaders") or {}}
