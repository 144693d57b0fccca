"""BgpMode: the speaker's BGP mode (the Mode interface of notes/MODES.md).

``apply`` runs on the decision thread and does only pure work: ``bgp_decision`` (core) and
``render`` (Jinja2), then hands the text to the worker thread and returns. The worker:

- withdrawals first and at once: prefixes that left the desired config are removed
  (``no network ...``) before anything else, never debounced, on bgpd's vty socket (one
  session, well under a millisecond; the same lines vtysh would pass on, so the running config
  that frr-reload diffs later is the same); what the socket cannot remove goes through one
  ``vtysh`` call, so a withdrawal is never lost to a socket problem;
- then the new config: when it differs from the one FRR runs only in its ``network`` lines, the
  added networks go to bgpd's vty socket (delta.py; one session, then frr.conf is written);
  anything else, or a delta bgpd did not take whole, reloads the whole config: written beside
  frr.conf, ``frr-reload.py --test``, ``--reload``, and only then frr.conf itself is replaced
  (0640 root:frr). Additions wait ``debounce`` seconds so a burst of changes costs one apply.
  frr-reload changes only the lines that differ, so a session whose neighbour lines did not
  change is not reset;
- a refused or failed reload is logged (``frrReloadFailed``, passwords redacted), the last good
  config is put back (reload of the file that was last applied) and the new one retried every
  ``retry`` seconds.

The watch thread asks bgpd on its vty socket every ``watch_interval`` seconds (0.1) with a
``watch_timeout`` deadline (0.35 s): per-peer session state, uptime and prefixes sent (status, metrics,
``sessionUp``/``sessionDown`` events). When bgpd does not answer (hung or dead), bfdd would still
answer BFD and the routers would keep this node until the hold time; so the watch drops this
node's outgoing BFD packets (an nftables table of its own), the routers' BFD sessions go down
and they drop the node at BFD speed. When bgpd answers again the table is removed. The
trade-off of the short deadline: a bgpd that is merely slow for 0.35 s (a long config load, a
machine starved of CPU) is taken out the same way, and comes back at its next answer; with BFD
100 ms x 3 a frozen bgpd is out of the routers' tables within interval + deadline + the nft call +
0.3 s, about 0.8 s (the goal is 1 s).

``withdraw_all`` (drain of the whole node, shutdown, unknown view) removes every network in the
calling thread, so that the routes are gone from the routers before the process exits.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from nocloudlb.core.bgp import bgp_decision
from nocloudlb.core.election import NodeView
from nocloudlb.core.schema import Config

from .. import logs
from ..backoff import Backoff, backoff_metrics
from .flows import DEFAULT_RATE, OFF_LABEL, FlowHandover
from .frr import FrrControl, FrrError
from .reconcile import Reconciler
from .reload import Reloader
from .render import Rendered, render
from .repair import ReconcileLoop
from .state import BgpState
from .watch import WATCH_RULES, WATCH_TABLE, BgpWatch
from .withdraw import Withdrawer

__all__ = ["WATCH_RULES", "WATCH_TABLE", "BgpMode", "FrrControl", "FrrError", "bgp_metrics"]

log = logging.getLogger("nocloudlb.bgp")

_metrics: dict[int, dict[str, Any]] = {}


def bgp_metrics(registry: CollectorRegistry | None = REGISTRY) -> dict[str, Any]:
    """MetalLB's BGP metrics under our prefix, registered once per registry."""
    key = id(registry)
    if key not in _metrics:
        _metrics[key] = {
            "session_up": Gauge("nocloudlb_bgp_session_up", "BGP session state (1 is up, 0 is down)", ["peer"],
                                registry=registry),
            "announced": Gauge("nocloudlb_bgp_announced_prefixes_total", "Number of prefixes currently being "
                               "advertised on the BGP session", ["peer"], registry=registry),
            "updates": Gauge("nocloudlb_bgp_updates_total", "Number of BGP UPDATE messages sent", ["peer"],
                             registry=registry),
            "frr_healthy": Gauge("nocloudlb_bgp_frr_healthy", "bgpd answers within the watch deadline (1) or "
                                 "not (0, the node's BFD is blocked)", registry=registry),
            "reload_failures": Gauge("nocloudlb_bgp_reload_failures", "Consecutive failed FRR reloads",
                                     registry=registry),
            "repairs": Counter("nocloudlb_bgp_reconcile_repairs", "Differences found between what bgpd "
                               "advertised to a peer and the decision, and repaired", ["peer"], registry=registry),
            "applies": Counter("nocloudlb_bgp_config_applies", "FRR config changes applied, by path: delta "
                               "(network lines on bgpd's vty socket) or reload (frr-reload of the whole file)",
                               ["path"], registry=registry),
            "delta_failures": Counter("nocloudlb_bgp_delta_failures", "Deltas that bgpd did not take whole (a "
                                      "refused line, the socket gone): the config was reloaded instead",
                                      registry=registry),
            "session_down": Counter("nocloudlb_bgp_session_down", "Established BGP sessions that went down "
                                    "(a reset by either side, a hold timer, BFD)", ["peer"], registry=registry),
        }
    return _metrics[key]


class BgpMode:
    """The Mode interface and the flow handover's thread; it owns the parts, which share ``state``
    (state.BgpState): the worker (reload.Reloader, withdrawals through withdraw.Withdrawer), the watch
    (watch.BgpWatch) and the reconcile (repair.ReconcileLoop)."""

    name = "bgp"

    def __init__(self, node: str, frr: FrrControl | None = None, *, debounce: float = 0.3, retry: float = 5.0,
                 watch_interval: float = 0.1, watch_timeout: float = 0.35, watch_failures: int = 1,
                 registry: CollectorRegistry | None = REGISTRY, flow_peers: list[str] | None = None,
                 flow_interval: float = 2.0, flow_rate: int = DEFAULT_RATE, flow_burst: int | None = None) -> None:
        self.node = node
        self.frr = frr or FrrControl()
        # point 8: the other nodes' addresses, for the flow handover (flows.py); none = off
        self.flows = FlowHandover(flow_peers or [], self._run, flow_rate, flow_burst)
        self.flow_interval = flow_interval
        self.retry = retry
        self.metrics = bgp_metrics(registry)
        self.state = BgpState(node)
        self._threads: list[threading.Thread] = []
        # every tool that can fail backs off (exponential, jitter, ceiling): frr-reload (and its
        # --test) from ``retry`` seconds, withdrawals (vty socket, then vtysh) from 0.5 s
        self.reload_backoff = Backoff("frr-reload", base=retry, ceiling=max(retry, 30.0))
        self.withdraw_backoff = Backoff("vtysh", base=0.5, ceiling=10.0)
        collector = backoff_metrics(registry)
        collector.add(self.reload_backoff)
        collector.add(self.withdraw_backoff)
        self.withdrawer = Withdrawer(self.frr, self.state, self.withdraw_backoff)
        self.reloader = Reloader(self.frr, self.state, self.withdrawer, self.reload_backoff, self.metrics, debounce)
        self.watch = BgpWatch(self.frr, self.state, self.metrics, (self.reload_backoff, self.withdraw_backoff),
                              watch_interval, watch_timeout, watch_failures)
        self.reconcile = ReconcileLoop(self.frr, self.state, self.metrics, self.reload_backoff, self.withdraw_backoff)
        self.reconciler: Reconciler = self.reconcile.reconciler

    @property
    def debounce(self) -> float:
        """Seconds additions wait so that a burst of changes costs one reload (may change while running)."""
        return self.reloader.debounce

    @debounce.setter
    def debounce(self, seconds: float) -> None:
        self.reloader.debounce = seconds

    @property
    def delta(self) -> bool:
        """Apply a change of networks only as ``network`` lines on bgpd's vty socket; False: reload always."""
        return self.reloader.delta

    @delta.setter
    def delta(self, on: bool) -> None:
        self.reloader.delta = on

    @property
    def vty_withdraw(self) -> bool:
        """Withdraw through bgpd's vty socket (vtysh only when it fails); False: vtysh only."""
        return self.withdrawer.vty_withdraw

    @vty_withdraw.setter
    def vty_withdraw(self, on: bool) -> None:
        self.withdrawer.vty_withdraw = on

    @property
    def last_withdraw(self) -> dict[str, Any]:
        """The last withdrawal's times (wall clock, for benchmarks) and path."""
        return self.withdrawer.last_withdraw

    # -- Mode interface -------------------------------------------------------------------
    def start(self) -> None:
        self.state.forwarding = self.frr.forwarding()
        self.watch.unblock(force=True)  # a table a crashed speaker left behind
        for target, name in ((self.reloader.run, "bgp-reload"), (self.watch.run, "bgp-watch"),
                             (self._flows, "bgp-flows"), (self.reconcile.run, "bgp-reconcile")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def apply(self, me: str, nodes: list[NodeView], parsed: Config) -> None:
        st = self.state
        decision = bgp_decision(me, nodes, parsed)
        rendered = render(me, decision, parsed, st.switches(parsed))
        mine = next((n for n in nodes if n.name == me), None)
        with st.cond:
            st.decision, st.config = decision, parsed
            st.flows_off = mine is not None and (mine.labels or {}).get(OFF_LABEL) == "off"
            st.withdrawn = False
            if st.desired is None or rendered.text != st.desired.text:
                st.desired = rendered
                st.desired_at = time.monotonic()
                st.cond.notify_all()

    def withdraw_all(self) -> None:
        """Stop announcing everything now (this thread, bgpd's vty socket, vtysh if that fails); the
        sessions stay up."""
        st = self.state
        with st.cond:
            st.withdrawn = True
            if st.config is not None:
                st.desired = st.render_withdrawn(st.decision, st.config)
                st.desired_at = time.monotonic()
            st.cond.notify_all()
        self.withdrawer.withdraw(None)

    def keeps_routes(self) -> bool:
        """Whether bgpd's networks may outlive a restart of the speaker (hold.py): FRR runs the config
        this mode last decided (nothing pending, so no withdrawal either), none withdrawn, bgpd answers."""
        st = self.state
        with st.cond:
            return st.applied is not None and not st.withdrawn and st.healthy is not False and not st.pending()

    def wait_sent(self, timeout: float = 1.0) -> bool:
        """Wait until bgpd has nothing left to advertise to any peer (``pfxSnt`` and ``outq`` 0 in its
        summary): after ``withdraw_all``, the withdrawal has left this node. bgpd holds a change about 50 ms
        before it sends it (its route queue), longer than the vty socket takes to hand it over; on
        shutdown ``close`` waits for it (at most ``timeout``), so the process never leaves first."""
        return self.watch.wait_sent(timeout)

    def lo_vips(self) -> set[str]:
        """VIPs this node may serve through BGP, from the last apply: the Mode hook for lo (the
        layer-2 mode holds them there, see modeset.ModeSet.other_lo)."""
        with self.state.cond:
            return set(self.state.decision.serve)

    def status(self) -> dict[str, Any]:
        st = self.state
        with st.cond:
            routes = {name: [r.prefix for r in rs] for name, rs in st.decision.routes.items()}
            peers = []
            for p in st.decision.peers:
                s = st.sessions.get(p.name, {})
                peers.append({"name": p.name, "address": p.address or p.interface, "vrf": p.vrf, "myASN": p.my_asn,
                              "peerASN": p.peer_asn or p.dynamic_asn, "state": s.get("state", "unknown"),
                              "uptimeMsec": s.get("uptimeMsec", 0), "prefixesSent": s.get("prefixesSent", 0),
                              "sessionDowns": s.get("downs", 0),
                              "bfd": p.bfd_profile, "routes": routes.get(p.name, [])})
            pending = st.pending()
            return {
                "peers": peers,
                # per VIP, keyed by address; not "vips", which the speaker's status keeps for the
                # layer-2 rows (one owner per VIP), while in BGP every eligible node announces
                "bgpVips": {ip: {"announcing": a, "reason": r, "services": s}
                            for ip, (a, r, s) in sorted(st.decision.vips.items())},
                "withdrawn": st.withdrawn,
                "flowHandover": self.flows.status(),
                "frr": {"healthy": st.healthy, "error": self.watch.error, "bfdBlocked": self.watch.blocked},
                "config": {"applied": st.applied is not None, "pending": pending, "error": st.reload_error,
                           "failures": self.reload_backoff.failures, "reloads": self.reloader.reloads,
                           "lastReloadSeconds": round(self.reloader.last_reload_seconds, 3),
                           "deltas": self.reloader.delta_applies,
                           "lastDeltaSeconds": round(self.reloader.last_delta_seconds, 4),
                           "lastPath": self.reloader.last_path,
                           "reload": self.reload_backoff.state(), "withdraw": self.withdraw_backoff.state()},
                "reconcile": self.reconciler.status(),
            }

    def close(self) -> None:
        st = self.state
        with st.cond:
            withdrawn = st.withdrawn
            st.stop = True
            st.cond.notify_all()
        if withdrawn:
            self.wait_sent()
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []
        self.watch.unblock()
        self.flows.clear()

    def rendered(self) -> Rendered | None:
        """The config FRR runs (last good), for tests and status."""
        with self.state.cond:
            return self.state.applied

    def wait_applied(self, timeout: float = 30.0) -> bool:
        """Wait until the desired config is the applied one (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        with self.state.cond:
            while self.state.pending():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.state.cond.wait(min(left, 0.05))
        return True

    # -- flow handover (point 8): its own thread, nft and ip calls off the others' paths --------
    def _run(self, argv: list[str], stdin: str | None) -> str:
        proc = self.frr.run(argv, timeout=10.0, input_text=stdin)
        if proc.returncode != 0:
            raise FrrError(f"{' '.join(argv[:3])}: {(proc.stderr or proc.stdout).strip()[:300]}")
        return proc.stdout

    def _flows(self) -> None:
        st = self.state
        if not self.flows.addresses:
            return
        served: set[str] | None = None
        next_at = 0.0
        while True:
            with st.cond:
                while (not st.stop and time.monotonic() < next_at
                       and served == (set() if st.flows_off else st.decision.serve)):
                    st.cond.wait(max(0.05, min(0.5, next_at - time.monotonic())))
                if st.stop:
                    return
                served = set() if st.flows_off else set(st.decision.serve)
            try:
                self.flows.refresh(served)
            except Exception as exc:  # noqa: BLE001 - one failure never stops the thread
                logs.event(log, "bgpFlowHandoverFailed", str(exc)[:500], logging.ERROR)
            next_at = time.monotonic() + self.flow_interval
