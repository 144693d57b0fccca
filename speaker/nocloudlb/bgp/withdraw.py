"""Withdrawals, at once and never debounced: the ``no network`` lines for what left the desired config
go to bgpd's vty socket (one session, no process), and what that could not remove through one
``vtysh`` call, so a withdrawal is never lost to a socket problem; frr.conf loses those lines first.
Also the writing of frr.conf itself (what a bgpd that starts reads)."""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import logs
from ..backoff import Backoff
from .frr import FrrControl, FrrError
from .render import strip_networks
from .state import BgpState, Nets, has_any, minus

log = logging.getLogger("nocloudlb.bgp")


class Withdrawer:
    """Removes networks from FRR (``withdraw``) and writes frr.conf (``write_disk``); ``backoff`` spaces
    failed withdrawals. ``vty_withdraw`` (False: vtysh only, for benchmarks) and ``last_withdraw`` (the
    last withdrawal's times, wall clock, and path) are the mode's."""

    def __init__(self, frr: FrrControl, state: BgpState, backoff: Backoff) -> None:
        self.frr = frr
        self.state = state
        self.backoff = backoff
        self.vty_withdraw = True
        self.last_withdraw: dict[str, Any] = {}

    def due(self) -> bool:
        """Networks FRR has that the desired config dropped: now (never debounced), unless the
        last withdrawal failed and its back-off has not run out (the caller holds the condition)."""
        st = self.state
        return st.desired is not None and has_any(minus(st.announced, st.desired.networks)) and self.backoff.ready()

    def withdraw(self, target: Nets | None) -> None:
        """Remove now every network FRR has that ``target`` lacks (None: all): through bgpd's vty
        socket (one session, no process), and what that could not remove through vtysh."""
        st = self.state
        with st.frr_lock:
            with st.cond:
                gone = minus(st.announced, target or {})
            if not has_any(gone):
                return
            t0 = time.monotonic()
            started = time.time()
            self.write_disk_without(gone)  # first: a bgpd that starts now reads the withdrawal
            via = "vty"
            left = gone
            if self.vty_withdraw:
                try:
                    left = self._withdraw_vty(gone)
                except FrrError as exc:
                    logs.event(log, "bgpWithdrawVtyFailed", "bgpd's vty socket failed: withdrawing through vtysh",
                               logging.WARNING, error=str(exc)[:300])
            if has_any(left):
                via = "vtysh" if left is gone else "vty+vtysh"
                failed = self._withdraw_vtysh(left)
                if failed:
                    with st.cond:  # some are still in bgpd, some maybe not: the next change reloads
                        st.announced_sure = False
                    wait = self.backoff.failed(failed[0])
                    logs.event(log, "bgpWithdrawFailed", "vtysh could not remove the networks", logging.ERROR,
                               failed=failed[:20], retryIn=round(wait, 3), failures=self.backoff.failures)
                    return
            self.backoff.succeeded()
            sent = time.time()
            with st.cond:
                st.announced = minus(st.announced, gone)
                st.changed_at = time.monotonic()
                self.last_withdraw = {"at": started, "sent": sent, "seconds": round(time.monotonic() - t0, 4),
                                      "via": via, "prefixes": sum(len(ps) for fams in gone.values()
                                                                  for ps in fams.values())}
                st.cond.notify_all()
        logs.event(log, "bgpWithdrawn", node=st.node, seconds=round(time.monotonic() - t0, 4), via=via,
                   prefixes=sorted({p for fams in gone.values() for ps in fams.values() for p in ps}))

    def _withdraw_vty(self, gone: Nets) -> Nets:
        """``no network`` lines on bgpd's vty socket; returns what it did not remove (for vtysh).
        The same lines vtysh would pass to bgpd, so the running config (what frr-reload reads and
        diffs) is the same either way. FrrError when the socket cannot be used at all."""
        lines = _withdraw_lines(gone)
        count = sum(len(ps) for fams in gone.values() for ps in fams.values())
        answers = self.frr.configure_vty(lines, timeout=2.0 + 0.005 * count)
        left: Nets = {}
        context_ok = True
        for line, status, text in answers:
            # a refused router bgp / address-family leaves bgpd in another node, where the
            # lines that follow mean something else or nothing: they all go to vtysh
            if line.startswith("router bgp"):
                context_ok = status == 0
            elif line.startswith("address-family"):
                context_ok = context_ok and status == 0
            if not line.startswith("no network "):
                continue
            if context_ok and (status == 0 or "Can't find" in text):
                continue  # removed, or already gone
            prefix = line.split()[2]
            for key, fams in gone.items():
                for family, prefixes in fams.items():
                    if prefix in prefixes:
                        left.setdefault(key, {}).setdefault(family, []).append(prefix)
        return left

    def _withdraw_vtysh(self, gone: Nets) -> list[str]:
        """The same ``no network`` lines through one vtysh call; returns the prefixes it failed."""
        lines = _withdraw_lines(gone)
        try:
            self.frr.configure(lines, timeout=5.0)
        except FrrError:
            # vtysh stops at the first line it refuses (a network FRR no longer has): remove the
            # others one by one, so that one stale prefix never keeps the rest announced
            failed: list[str] = []
            for key, fams in gone.items():
                for family, prefixes in fams.items():
                    for prefix in prefixes:
                        if failed and "% " not in failed[-1]:
                            failed.append(f"{prefix}: not tried (vtysh cannot reach bgpd)")
                            continue  # one vtysh run per prefix only while bgpd answers
                        try:
                            self.frr.configure(_router_lines(key, family, [prefix]), timeout=5.0)
                        except FrrError as one:
                            if "Can't find" not in str(one):
                                failed.append(f"{prefix}: {one}")
            return failed
        return []

    def write_disk(self, text: str) -> None:
        """frr.conf becomes ``text`` (the caller holds ``frr_lock``); a failure is logged."""
        try:
            self.frr.write(text)  # frr.conf: what FRR reads when it (re)starts
            self.state.disk = text
        except OSError as exc:
            logs.event(log, "frrConfWriteFailed", str(exc), logging.ERROR)

    def write_disk_without(self, gone: Nets) -> None:
        """frr.conf without the ``network`` lines of ``gone`` (the caller holds ``frr_lock``)."""
        st = self.state
        base = st.disk if st.disk is not None else (st.applied.text if st.applied else None)
        if base is None:
            try:
                with open(self.frr.path(self.frr.conf), encoding="utf-8") as fh:
                    base = fh.read()
            except OSError:
                return
        text = strip_networks(base, gone)
        if text != base:
            self.write_disk(text)


def _router_lines(key: tuple[str, int], family: str, prefixes: list[str]) -> list[str]:
    vrf, asn = key
    return ([f"router bgp {asn}" + (f" vrf {vrf}" if vrf else ""), f"address-family {family} unicast"]
            + [f"no network {p}" for p in prefixes] + ["exit-address-family", "exit"])


def _withdraw_lines(gone: Nets) -> list[str]:
    """The ``no network`` lines (with their router and address-family lines) removing ``gone``."""
    lines: list[str] = []
    for key, fams in gone.items():
        for family, prefixes in fams.items():
            if prefixes:
                lines += _router_lines(key, family, prefixes)
    return lines
