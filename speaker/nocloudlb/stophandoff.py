"""A stop of the speaker hands its layer-2 VIPs over first: planned moves, not a leave.

A plain stop (SIGTERM) withdraws and leaves the cluster; a peer then takes the VIPs as from a member
that left: at once and without handover forwarding, so a TCP connection in flight at the moment the
clients switch MACs reaches a node that has no socket for it and is reset (own-hosts-test, the upgrade
by site.yml: one request of about 1,500 in about one run of eight). ``nocloudlb stop-handoff`` is the
unit's ``ExecStop``: systemd runs it before it sends SIGTERM. It drains the node by its runtime drain
label, as the ``node_drain`` module does, and waits until every layer-2 VIP this node announced is
led by another member and no hand-off is left (each taker announced, with handover forwarding back
here for the connections in flight; they stay served: the VIPs stay on lo, the servers keep running).
The speaker then stops with nothing left to move.

Before the label it writes ``MARKER`` in the state directory; the next speaker to start keeps the drain
until it has decided with it, its start gate open for ``RELEASE_AFTER`` s (it then knows which member
leads each of its VIPs), and only then removes the label and the marker (``Release``): it takes its VIPs
back as an undrain does, a planned move with handover forwarding toward the member that held them.
Removed at once instead, the node would take them back as on a first start, from nobody it knows, with
no forwarding: the request in flight at that member when the clients switch back is reset.

Nothing is done, and the stop goes on at once as before, when the node is drained already
(an operator's drain stays), announces no layer-2 VIP, announces any BGP VIP (a drain would take its
next hop from the routers, where bgp/hold.py keeps its routes over a restart), has no live undrained
peer to take over, or the speaker does not answer. It talks to whatever speaker runs (the ``status``
and ``label`` commands of 0.2.0 too), so the first stop of an upgrade is a planned move as well.
Bounded by ``timeout`` (then the stop goes on); it never fails a stop: every outcome prints one line
and exits 0.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nocloudlb.core.election import DRAIN_LABEL

from .state import atomic_write

MARKER = "stop-drained"
RELEASE_AFTER = 1.0  # seconds with the start gate open before the drain of the last stop is removed
LIVE = ("alive", "suspect")


def _request(sock: str, req: dict[str, Any]) -> dict[str, Any]:
    from .core.control_client import request  # noqa: PLC0415 - the module_utils copy installed with the package

    answer = request(sock, req, 3.0)
    if answer.get("ok") is False:
        raise ValueError(f"the speaker refused {req.get('cmd')}: {answer.get('error')}")
    return answer


def _l2_announced(status: dict[str, Any], me: str) -> list[str]:
    return sorted(v["ip"] for v in status.get("vips") or [] if v.get("leader") == me and v.get("announcing")
                  and v.get("protocol", "layer2") == "layer2")


def _takers(status: dict[str, Any], me: str) -> list[str]:
    """The members that may take this node's VIPs: live and not drained."""
    return [m.get("name") for m in status.get("members") or [] if m.get("name") != me
            and m.get("state") in LIVE and DRAIN_LABEL not in (m.get("labels") or {})]


def handoff(sock: str, state_dir: str, timeout: float = 8.0, poll: float = 0.05) -> str:
    """Drain this node and wait for its layer-2 VIPs to be taken (module docstring). Returns what happened."""
    try:
        status = _request(sock, {"cmd": "status", "vips": "all"})
    except (OSError, ValueError) as exc:
        return f"nothing handed over: the speaker does not answer ({exc})"
    me = str(status.get("node") or "")
    if DRAIN_LABEL in (status.get("labels") or {}):
        return f"nothing handed over: {me} is drained already"
    owned = _l2_announced(status, me)
    if not owned:
        return f"nothing handed over: {me} announces no layer-2 VIP"
    if any(v.get("protocol") == "bgp" and v.get("announcing") for v in status.get("vips") or []):
        # a drain would take its next hop from the routers; a restart keeps its routes (bgp/hold.py)
        return f"nothing handed over: {me} announces BGP VIPs too (their routes are kept over a restart)"
    if not _takers(status, me):
        return f"nothing handed over: no live undrained member would take {len(owned)} VIPs"
    marker = Path(state_dir) / MARKER
    try:  # first: a stop cut short after the label still undrains at the next start
        atomic_write(marker, json.dumps({"node": me, "at": time.time(), "vips": owned[:50]}).encode() + b"\n", 0o640)
        _request(sock, {"cmd": "label", "set": {DRAIN_LABEL: "true"}})
    except (OSError, ValueError) as exc:
        return f"nothing handed over: cannot drain {me} ({exc})"
    start = time.monotonic()
    left: list[str] = owned
    while time.monotonic() - start < timeout:
        time.sleep(poll)
        try:
            status = _request(sock, {"cmd": "status", "vips": "all"})
        except (OSError, ValueError):
            continue
        if not _takers(status, me):
            return f"handing over from {me} stopped: no live undrained member is left (all stopping?)"
        leaders = {v["ip"]: v.get("leader") for v in status.get("vips") or []}
        handing = ((status.get("modes") or {}).get("l2") or {}).get("handingOff") or {}
        left = sorted(ip for ip in owned if leaders.get(ip) in (None, me) or ip in handing)
        if not left and not _l2_announced(status, me):
            return f"handed over {len(owned)} VIPs from {me} in {time.monotonic() - start:.2f} s"
    return f"handing over from {me} not finished after {timeout:g} s ({', '.join(left[:10])}); stopping anyway"


class Release:
    """At start: the drain the last stop set (the marker is there) is removed once this node has decided with
    it for ``RELEASE_AFTER`` s with its start gate open (``after_reconcile``); then the marker goes. Only the
    runtime label set for the stop goes; an operator's unset list is left as it was."""

    def __init__(self, labels: Any, state_dir: str, post: Callable[[], None]) -> None:
        self.labels = labels
        self.marker = Path(state_dir) / MARKER
        self.post = post
        self.pending = self.marker.exists()
        self._open_since: float | None = None

    def after_reconcile(self, gate: str) -> bool:
        """Called after each decision pass with the start gate's reason; True when the drain was removed now."""
        if not self.pending:
            return False
        now = time.monotonic()
        if gate:
            self._open_since = None
            return False
        if self._open_since is None:
            self._open_since = now
            timer = threading.Timer(RELEASE_AFTER + 0.01, self.post)  # decide again then, even if nothing changes
            timer.daemon = True
            timer.start()
            return False
        if now - self._open_since < RELEASE_AFTER:
            return False
        if DRAIN_LABEL in self.labels.set:
            self.labels.drop(DRAIN_LABEL)
        self.marker.unlink(missing_ok=True)
        self.pending = False
        self.post()
        return True
