"""The BGP mode's worker thread: withdrawals first and at once (withdraw.py), then the new config:
when it differs from the one FRR runs only in its ``network`` lines, the added networks go to
bgpd's vty socket (delta.py); otherwise, or when that fails, the whole config through frr-reload:
written beside frr.conf, ``--test``, ``--reload``, and only then frr.conf itself. Additions wait
``debounce`` seconds so that a burst of changes costs one apply, and a refused or failed reload
backs off and is retried."""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import logs
from ..backoff import Backoff
from .delta import DeltaApplier, additions, prefix_count, switches_differ
from .frr import FrrControl, FrrError
from .render import Rendered, redact
from .state import BgpState, has_any, minus, union
from .withdraw import Withdrawer

log = logging.getLogger("nocloudlb.bgp")


class Reloader:
    """The worker's loop (``run``), the deltas and the reloads; ``backoff`` spaces failed reloads (from
    ``retry`` s), ``debounce`` (s) is read at each apply, so it may be changed while the mode runs;
    ``delta`` False reloads every change (benchmarks compare the two paths)."""

    def __init__(self, frr: FrrControl, state: BgpState, withdrawer: Withdrawer, backoff: Backoff,
                 metrics: dict[str, Any], debounce: float) -> None:
        self.frr = frr
        self.state = state
        self.withdrawer = withdrawer
        self.backoff = backoff
        self.metrics = metrics
        self.debounce = debounce
        self.delta = True
        self.deltas = DeltaApplier(frr, state, withdrawer)
        self.reloads = 0
        self.delta_applies = 0
        self.last_reload_at = 0.0
        self.last_reload_seconds = 0.0
        self.last_delta_seconds = 0.0
        self.last_path = ""

    def run(self) -> None:
        st = self.state
        while True:
            with st.cond:
                while not st.stop and not self._due():
                    st.cond.wait(self._wait_time())
                if st.stop:
                    return
                desired = st.desired
            assert desired is not None
            self.withdrawer.withdraw(desired.networks)
            with st.cond:
                if not self._reload_due():
                    continue
                wait = st.desired_at + self.debounce - time.monotonic()
                if wait > 0 and not self.backoff.backing_off and not st.stop:
                    st.cond.wait(wait)  # debounce: later changes join this reload
                    continue
                desired = st.desired
            assert desired is not None
            try:
                self._apply(desired)
            except Exception as exc:  # noqa: BLE001 - one failure never stops the worker
                logs.event(log, "frrReloadFailed", "unexpected error", logging.ERROR,
                           error=redact(str(exc), desired.secrets))

    def _due(self) -> bool:
        return self.withdrawer.due() or self._reload_due()

    def _reload_due(self) -> bool:
        st = self.state
        if st.desired is None or not self.backoff.ready():
            return False
        if st.applied is not None and st.desired.text == st.applied.text:
            # the same config, but networks withdrawn by vtysh since its reload (a drain undone
            # before the drained config was reloaded) must be announced again: reload it
            return has_any(minus(st.desired.networks, st.announced))
        return True

    def _wait_time(self) -> float:
        waits = [1.0]
        for b in (self.backoff, self.withdrawer.backoff):
            if b.backing_off:
                waits.append(b.remaining())
        return max(0.05, min(waits))

    def _apply(self, desired: Rendered) -> None:
        """``desired`` to FRR: by delta when only networks differ from what FRR runs, else (or when
        the delta fails) by a full reload."""
        st = self.state
        t0 = time.monotonic()
        desired = self._with_live_switches(desired)
        with st.cond:
            adds = None
            # a switch the data plane needs on and the node has off is turned on by a reload only
            if self.delta and st.announced_sure and not switches_differ(desired.text, st.forwarding):
                adds = additions(st.applied, desired, st.announced)
        if adds is not None:
            outcome = self.deltas.apply(desired)
            if outcome == "applied":
                self._applied(desired, time.monotonic() - t0, "delta", prefix_count(adds))
            if outcome != "failed":
                return
            self.metrics["delta_failures"].inc()
        self._reload(desired)

    def _reload(self, desired: Rendered) -> None:
        st = self.state
        t0 = time.monotonic()
        staged = self.frr.staged()
        try:
            # --test only reads FRR's running config: outside the lock, so a withdrawal waits at
            # most for the --reload itself (only this thread writes the staged file)
            self.frr.write(desired.text, staged)
            self.frr.test(staged)
            with st.frr_lock:
                with st.cond:
                    newest = st.desired
                if newest is not desired and newest is not None and has_any(minus(desired.networks, newest.networks)):
                    return  # a newer config withdraws some of these (drain, withdraw_all): never re-announce them
                # frr.conf is the decision before bgpd hears it (a bgpd (re)start reads the same),
                # and the file reloaded: from another file frr-reload would `vtysh write` the
                # running config over it
                self.withdrawer.write_disk(desired.text)
                try:
                    self.frr.reload(self.frr.conf if st.disk == desired.text else staged)
                except FrrError:
                    with st.cond:  # FRR may hold part of it: the next round withdraws what it must
                        st.announced = union(st.announced, desired.networks)
                        st.announced_sure = False
                    raise
                with st.cond:  # before the lock goes: a withdrawal waiting for it sees these networks
                    st.announced = desired.networks
                    st.announced_sure = True
        except (FrrError, OSError) as exc:
            error = redact(str(exc), desired.secrets)
            wait = self.backoff.failed(error)
            with st.cond:
                st.reload_error = error
                st.cond.notify_all()  # what FRR may have taken of it and the decision dropped: withdraw now
            self.metrics["reload_failures"].set(self.backoff.failures)
            # no going back to the last good file: it would announce again what this config withdrew
            logs.event(log, "frrReloadFailed", "the new FRR config is refused; FRR keeps what it runs, withdrawals "
                       "still go to bgpd at once", logging.ERROR, error=error,
                       failures=self.backoff.failures, retryIn=round(wait, 3))
            return
        self._applied(desired, time.monotonic() - t0, "reload", 0)

    def _applied(self, desired: Rendered, seconds: float, path: str, added: int) -> None:
        """Bookkeeping after FRR took ``desired`` by ``path`` ("delta" or "reload")."""
        st = self.state
        self.backoff.succeeded()
        with st.cond:
            recovered = st.reload_error != ""
            st.applied = desired
            st.reload_error = ""
            if path == "delta":
                self.delta_applies += 1
                self.last_delta_seconds = seconds
            else:
                self.reloads += 1
                self.last_reload_seconds = seconds
            self.last_reload_at = time.time()
            self.last_path = path
            st.changed_at = time.monotonic()
            st.cond.notify_all()
        self.metrics["reload_failures"].set(0)
        self.metrics["applies"].labels(path).inc()
        prefixes = sorted({p for fams in desired.networks.values() for ps in fams.values() for p in ps})
        if path == "delta":
            logs.event(log, "frrDeltaApplied", node=st.node, seconds=round(seconds, 4), recovered=recovered,
                       added=added, vtySeconds=round(self.deltas.last_vty_seconds, 4), path=path, prefixes=prefixes)
        else:
            logs.event(log, "frrReloaded", node=st.node, seconds=round(seconds, 3), recovered=recovered,
                       path=path, prefixes=prefixes)

    def _with_live_switches(self, desired: Rendered) -> Rendered:
        """``desired`` rendered again if the forwarding switches changed since it was rendered (the
        data plane turned forwarding on): a reload never sets them back."""
        st = self.state
        try:
            live = self.frr.forwarding()
        except FrrError as exc:
            logs.event(log, "forwardingUnreadable", str(exc), logging.WARNING)
            return desired
        with st.cond:
            if live == st.forwarding or st.config is None or desired is not st.desired:
                st.forwarding = live
                return desired
            st.forwarding = live
            if st.withdrawn:
                again = st.render_withdrawn(st.decision, st.config)
            else:
                again = st.render(st.decision, st.config)
            if again.networks != desired.networks:
                return desired  # never announce through a re-render what the decision has not
            st.desired = again
            return again
