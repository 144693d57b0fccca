"""The BGP mode's reconcile thread: what bgpd advertised to each peer checked against the decision
(reconcile.Reconciler), often for 10 s after a change and seldom after, and the differences it
confirms repaired (re-add and remove a lonely prefix, a soft then a hard clear of the session)."""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import logs
from ..backoff import Backoff
from .frr import FrrControl, FrrError
from .reconcile import Diff, PeerView, Reconciler, advertised_command, advertised_prefixes
from .render import peer_families, peer_wants
from .state import BgpState, count, has_any, minus

log = logging.getLogger("nocloudlb.bgp")


class ReconcileLoop:
    """The thread's loop (``run``); ``reconciler`` keeps the evidence, ``interval`` the seconds between
    checks (for 10 s after a change, then), ``settle`` a session's age before a prefix it lacks counts
    as missing. ``reload_backoff`` and ``withdraw_backoff`` say whether those are backing off."""

    def __init__(self, frr: FrrControl, state: BgpState, metrics: dict[str, Any], reload_backoff: Backoff,
                 withdraw_backoff: Backoff) -> None:
        self.frr = frr
        self.state = state
        self.metrics = metrics
        self.reload_backoff = reload_backoff
        self.withdraw_backoff = withdraw_backoff
        self.reconciler = Reconciler(self._advertised, self._repair)
        self.interval = (0.5, 2.0)  # seconds between checks: for 10 s after a change, then
        self.settle = 5.0  # a session's age before a prefix it lacks counts as missing

    def run(self) -> None:
        st = self.state
        next_at = time.monotonic()
        while True:
            with st.cond:
                fast = time.monotonic() - st.changed_at < 10.0
                next_at = max(next_at + self.interval[0 if fast else 1], time.monotonic())
                while not st.stop and time.monotonic() < next_at:
                    st.cond.wait(next_at - time.monotonic())
                if st.stop:
                    return
                views = self.views()
            if not views:
                continue
            try:
                self.reconciler.check(views)
            except FrrError as exc:
                log.debug("reconcile: bgpd did not tell: %s", exc)
            except Exception as exc:  # noqa: BLE001 - one failure never stops the thread
                logs.event(log, "bgpReconcileFailed", str(exc)[:500], logging.ERROR)

    def views(self) -> list[PeerView]:
        """The peers and families to check now (the caller holds the condition): none while a
        withdrawal is on its way or backs off, or bgpd does not answer; only Established sessions.

        While a reload is on its way or fails (backs off), what it would change is no difference
        yet: only a prefix bgpd advertises without holding its ``network`` line counts (a withdrawal
        bgpd lost), so a withdrawal is repaired whatever state the reload is in, and a reload that
        keeps failing never makes the reconcile escalate to a session reset."""
        st = self.state
        if (st.healthy is not True or st.desired is None
                or has_any(minus(st.announced, st.desired.networks)) or self.withdraw_backoff.backing_off):
            return []
        pending = st.pending() or self.reload_backoff.backing_off
        wants = peer_wants(st.decision)
        views = []
        for p in st.decision.peers:
            session = st.sessions.get(p.name, {})
            if session.get("state") != "Established":
                continue
            nets = st.announced.get((p.vrf, p.my_asn), {})
            settled = count(session.get("uptimeMsec")) >= self.settle * 1000
            for fam in peer_families(p):
                want = frozenset() if st.withdrawn else frozenset(wants.get(p.name, {}).get(fam, ()))
                held = frozenset(nets.get(fam, ()))
                views.append(PeerView(p.name, p.address or p.interface, p.vrf, p.my_asn, fam,
                                      want | held if pending else want, held,
                                      missing_counts=settled and not pending))
        return views

    def _advertised(self, view: PeerView) -> set[str]:
        return advertised_prefixes(self.frr.query_json(advertised_command(view), timeout=2.0))

    def _repair(self, view: PeerView, step: int, found: Diff) -> None:
        """Repair a difference the reconciler confirmed (the steps: reconcile.py)."""
        st = self.state
        self.metrics["repairs"].labels(view.name).inc()
        logs.event(log, "bgpReconcileRepair", "bgpd's advertisements to a peer differ from the decision",
                   logging.WARNING, peer=view.name, address=view.address, family=view.family, step=step,
                   **found.as_dict())
        if found.missing:
            with st.cond:
                st.applied = None  # frr-reload puts back any network bgpd lacks
                st.cond.notify_all()
        vrf = f" vrf {view.vrf}" if view.vrf else ""
        lonely = sorted(found.extra - view.networks)
        with st.frr_lock:
            if step == 1 and lonely:
                lines = [f"router bgp {view.asn}{vrf}", f"address-family {view.family} unicast"]
                for prefix in lonely:
                    lines += [f"network {prefix}", f"no network {prefix}"]
                self.frr.configure_vty(lines + ["exit-address-family", "exit"])
                if not (found.missing or found.extra & view.networks):
                    return
            hard = step >= 3
            self.frr.exec_vty(f"clear bgp{vrf} {view.address}" + ("" if hard else " soft out"))
