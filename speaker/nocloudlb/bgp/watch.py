"""The BGP mode's watch thread: asks bgpd on its vty socket every ``interval`` s with a ``timeout``
deadline for each session's state, uptime and prefixes sent (status, metrics, ``sessionUp`` and
``sessionDown`` events); when bgpd does not answer, it drops this node's outgoing BFD (an nftables
table of its own) so that the routers drop the node at BFD speed, and removes the table when bgpd
answers again (mode.py's module docstring gives the timing)."""

from __future__ import annotations

import logging
import time
from typing import Any

from nocloudlb.core.schema import BGPPeer

from .. import logs
from ..backoff import Backoff
from .frr import FrrControl, FrrError
from .state import BgpState, count

log = logging.getLogger("nocloudlb.bgp")

WATCH_TABLE = "nocloudlb_bgp_watch"
# BFD control (single hop 3784, multihop 4784) and echo (3785)
WATCH_RULES = f"""table inet {WATCH_TABLE} {{
  chain out {{
    type filter hook output priority 0; policy accept;
    udp dport {{ 3784, 3785, 4784 }} drop
  }}
}}
"""


class BgpWatch:
    """The watch's loop (``run``) and what it learnt: ``state.sessions``, ``state.healthy``, ``error``
    (bgpd's last failure to answer) and ``blocked`` (this node's BFD dropped). bgpd answering again
    resets ``backoffs`` (the reload's and the withdrawal's) and has its config checked."""

    def __init__(self, frr: FrrControl, state: BgpState, metrics: dict[str, Any], backoffs: tuple[Backoff, ...],
                 interval: float, timeout: float, failures: int) -> None:
        self.frr = frr
        self.state = state
        self.metrics = metrics
        self.backoffs = backoffs
        self.interval = interval
        self.timeout = timeout
        self.failures = failures
        self.error = ""
        self.blocked = False
        self._fails = 0

    def run(self) -> None:
        st = self.state
        ticks = 0
        next_at = time.monotonic()
        while True:
            # a fixed pace, whatever wakes the condition (every change notifies it)
            next_at = max(next_at + self.interval, time.monotonic())
            with st.cond:
                while not st.stop and time.monotonic() < next_at:
                    st.cond.wait(next_at - time.monotonic())
                if st.stop:
                    return
            try:
                self.once(ticks)
            except Exception as exc:  # noqa: BLE001 - one failure never stops the watch
                logs.event(log, "bgpWatchFailed", str(exc), logging.ERROR)
            ticks += 1

    def once(self, ticks: int) -> None:
        st = self.state
        try:
            summary = self.frr.query_json("show bgp vrf all summary json", timeout=self.timeout)
        except FrrError as exc:
            self._unanswered(exc)
            return
        self._fails = 0
        self.error = ""
        if st.healthy is not True:
            if st.healthy is False:
                logs.event(log, "frrHealthy", "bgpd answers again: BFD restored, its config checked now")
                for b in self.backoffs:
                    b.succeeded()
                with st.cond:
                    st.applied = None  # a bgpd that restarted: frr-reload puts back what it lacks
                    st.cond.notify_all()
            st.healthy = True
            self.metrics["frr_healthy"].set(1)
            self.unblock()
        updates: dict[str, int] = {}
        if ticks % max(1, round(2.0 / max(self.interval, 0.01))) == 0:  # about every 2 s
            try:
                # the same deadline: a bgpd that hangs during this question is seen now, not
                # one question later
                updates = _updates_sent(self.frr.query_json("show bgp vrf all neighbors json",
                                                            timeout=self.timeout))
            except FrrError as exc:
                self._unanswered(exc)
                return
        self._sessions_from(summary, updates)

    def _unanswered(self, exc: FrrError) -> None:
        st = self.state
        self._fails += 1
        self.error = str(exc)
        if self._fails >= self.failures and st.healthy is not False:
            st.healthy = False
            self.metrics["frr_healthy"].set(0)
            self.block()
            logs.event(log, "frrUnhealthy", "bgpd does not answer: blocking this node's BFD so routers drop "
                       "it now", logging.ERROR, error=str(exc))

    def _sessions_from(self, summary: Any, updates: dict[str, int]) -> None:
        st = self.state
        found: dict[tuple[str, str], dict[str, Any]] = {}
        if isinstance(summary, dict):
            for vrf_name, afs in summary.items():
                if not isinstance(afs, dict):
                    continue
                for af in afs.values():
                    if not isinstance(af, dict):
                        continue
                    for addr, p in (af.get("peers") or {}).items():
                        vrf = "" if vrf_name == "default" else vrf_name
                        cur = found.setdefault((vrf, addr), {"state": p.get("state", "unknown"),
                                                             "uptimeMsec": p.get("peerUptimeMsec", 0),
                                                             "prefixesSent": 0})
                        cur["prefixesSent"] += int(p.get("pfxSnt", 0) or 0)
        with st.cond:
            peers: list[BGPPeer] = list(st.decision.peers)
        sessions: dict[str, dict[str, Any]] = {}
        for p in peers:
            s = found.get((p.vrf, p.address or p.interface), {"state": "unknown", "uptimeMsec": 0,
                                                              "prefixesSent": 0})
            prev = st.sessions.get(p.name, {})
            s["updatesSent"] = updates.get(p.address or p.interface, prev.get("updatesSent", 0))
            sessions[p.name] = s
            up = s["state"] == "Established"
            was = prev.get("state") == "Established"
            s["downs"] = prev.get("downs", 0) + (1 if was and not up else 0)
            if up != was and (prev or up):
                if was:
                    self.metrics["session_down"].labels(p.name).inc()
                logs.event(log, "sessionUp" if up else "sessionDown", peer=p.name, address=p.address or p.interface,
                           state=s["state"], node=st.node, downs=s["downs"],
                           level=logging.INFO if up else logging.WARNING)
            self.metrics["session_up"].labels(p.name).set(1 if up else 0)
            self.metrics["announced"].labels(p.name).set(s["prefixesSent"])
            self.metrics["updates"].labels(p.name).set(s["updatesSent"])
        with st.cond:
            st.sessions = sessions

    def wait_sent(self, timeout: float = 1.0) -> bool:
        """Wait until bgpd has nothing left to advertise to any peer (``pfxSnt`` and ``outq`` 0 in its
        summary), at most ``timeout`` s (BgpMode.wait_sent says why)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                summary = self.frr.query_json("show bgp vrf all summary json", timeout=self.timeout)
                peers = [p for afs in (summary or {}).values() if isinstance(afs, dict)
                         for af in afs.values() if isinstance(af, dict)
                         for p in (af.get("peers") or {}).values() if isinstance(p, dict)]
                sent = sum(count(p.get("pfxSnt")) + count(p.get("outq")) for p in peers)
                if sent == 0:
                    return True
            except FrrError:
                return False  # bgpd does not answer: nothing to wait for here (the watch blocks BFD)
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def block(self) -> None:
        try:
            proc = self.frr.run(["nft", "-f", "-"], timeout=5.0, input_text=WATCH_RULES)
            if proc.returncode != 0:
                raise FrrError(proc.stderr.strip())
            self.blocked = True
        except FrrError as exc:
            logs.event(log, "bfdBlockFailed", str(exc), logging.ERROR)

    def unblock(self, force: bool = False) -> None:
        if not (self.blocked or force):
            return
        try:
            self.frr.run(["nft", "delete", "table", "inet", WATCH_TABLE], timeout=5.0)
            self.blocked = False
        except FrrError as exc:
            logs.event(log, "bfdUnblockFailed", str(exc), logging.ERROR)


def _updates_sent(neighbors: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    if not isinstance(neighbors, dict):
        return out
    for vrf in neighbors.values():
        if not isinstance(vrf, dict):
            continue
        for addr, n in vrf.items():
            if isinstance(n, dict) and isinstance(n.get("messageStats"), dict):
                out[addr] = int(n["messageStats"].get("updatesSent", 0) or 0)
    return out
