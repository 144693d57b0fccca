"""Programming the tables: one ``nft -f`` transaction per try, the last good tables kept on failure.

nft applies a script as one transaction: when it fails, the kernel keeps the tables as they were.
So a failure never leaves them half written, and ``Programmer`` remembers a plan as programmed
only after nft accepted it. A try, for the plan of one ``sync``:

1. the change alone (``nft.render`` against what the tables hold), unless the last try failed;
2. else, or when that fails (the tables were flushed by hand, a device went away): everything
   in one script, the tables deleted and written again in the same transaction;
3. when that fails too (and not as the last try did): is it the tool or one service? ``nft -c``
   (validates, commits nothing) of the tables without services: if that fails, the tool is
   broken (a failure, back-off);
   else a bisection of the services with ``nft -c`` (at most ``PROBES_MAX`` checks) finds the
   ones whose own rules nft refuses, and the rest is applied. A refused service keeps its last
   good rules if it had some (else it is not forwarded), with nft's reason in ``refused``, and
   is tried again when its config changes or after ``RETRY_REFUSED`` seconds.

A failed try waits for the back-off (``nocloudlb.backoff.Backoff``, tool ``nft``) before the
next: the mode's worker retries until nft works again, whatever the config does meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nocloudlb.core.backends import Rule

from ..backoff import Backoff
from ..logs import event
from . import nft
from .tool import NftError, NftTool

RETRY_REFUSED = 30.0
PROBES_MAX = 64

Ifaces = dict[str, tuple[int, list[str]]]


@dataclass
class Held:
    """A service whose own rules nft refused: why, and for which config."""

    signature: tuple
    reason: str
    at: float


def by_service(rules: list[Rule]) -> dict[str, list[Rule]]:
    out: dict[str, list[Rule]] = {}
    for r in rules:
        out.setdefault(r.service, []).append(r)
    return out


def signature(rules: list[Rule]) -> tuple:
    """A service's rules as configured (health left out: a health flip is no reason to try again)."""
    return tuple((r.vip, r.protocol, r.port, r.method, r.scheduler, r.selector, r.snat_address,
                  tuple((t.address, t.port, t.weight) for t in r.targets)) for r in rules)


def changed(old: list[Rule], new: list[Rule]) -> list[str]:
    """Services whose rules differ between ``old`` and ``new``."""
    a, b = by_service(old), by_service(new)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def full(rules: list[Rule], ifaces: Ifaces) -> nft.Rendered:
    """Everything in one script: the tables replaced and written in the same transaction."""
    out = nft.render(rules, ifaces, None)
    out.script = nft.base_script() + out.script
    return out


class Programmer:
    def __init__(self, tool: NftTool, log: logging.Logger, backoff: Backoff,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tool = tool
        self.log = log
        self.backoff = backoff
        self._clock = clock
        self.rendered: nft.Rendered | None = None  # what the tables hold
        self.rules: list[Rule] = []  # the rules they hold
        self.held: dict[str, Held] = {}
        self.pending: list[str] = []  # services whose change is not in the tables (the last try failed)
        self.error = ""
        self.probes = 0  # nft -c runs of bisections since start

    def program(self, plan: list[Rule], ifaces: Ifaces) -> bool:
        """Make the tables hold ``plan`` (less what nft refuses); True when nft applied a change."""
        self._expire(plan)
        want = self._with_held(plan)
        error = ""
        if self.rendered is not None:
            inc = nft.render(want, ifaces, self.rendered)
            if not inc.script:
                self._succeeded(want, inc)
                return False
            if not self.backoff.backing_off:
                try:
                    self.tool.apply(inc.script)
                    self._succeeded(want, inc)
                    return True
                except NftError as exc:
                    event(self.log, "dataplaneRetry", f"nft refused the change ({exc}): writing the tables whole",
                          logging.WARNING, services=",".join(changed(self.rules, want)) or "-")
        whole = full(want, ifaces)
        try:
            self.tool.apply(whole.script)
            self._succeeded(want, whole)
            return True
        except NftError as exc:
            error = str(exc)
        if self.backoff.backing_off and error == self.error:
            return self._failed(error, want)  # failing as on the last try: isolate after a change only
        return self._isolate(want, ifaces, error)

    def status(self) -> dict[str, Any]:
        return {"programmed": not self.pending and not self.backoff.backing_off, "pending": list(self.pending),
                "backoff": self.backoff.state(), "bisectionChecks": self.probes}

    # -- a failed whole script: the tool, or some services? ----------------------------------
    def _isolate(self, want: list[Rule], ifaces: Ifaces, error: str) -> bool:
        try:
            self.tool.check(full([], ifaces).script)
        except NftError as exc:
            return self._failed(str(exc), want)  # nft fails without any service: the tool itself
        bad = self._bisect(want, ifaces, error)
        if not bad:
            return self._failed(error, want)
        good = [r for r in want if r.service not in bad]
        old = [r for r in self.rules if r.service in bad]
        tries = [good + old, good] if old and old != [r for r in want if r.service in bad] else [good]
        for rules in tries:
            whole = full(rules, ifaces)
            try:
                self.tool.apply(whole.script)
            except NftError as exc:
                error = str(exc)
                continue
            self._refuse(bad, want)
            self._succeeded(rules, whole)
            return True
        return self._failed(error, want)

    def _bisect(self, want: list[Rule], ifaces: Ifaces, error: str) -> dict[str, str]:
        """service -> nft's reason, for each service whose own rules nft refuses (``nft -c``)."""
        groups = by_service(want)
        bad: dict[str, str] = {}
        stack: list[tuple[list[str], str]] = [(sorted(groups), error)]
        budget = PROBES_MAX
        while stack:
            keys, err = stack.pop()
            if not err:
                continue
            if len(keys) == 1:
                bad[keys[0]] = err
                continue
            for half in (keys[: len(keys) // 2], keys[len(keys) // 2:]):
                if budget <= 0:
                    return bad
                budget -= 1
                self.probes += 1
                try:
                    self.tool.check(full([r for k in half for r in groups[k]], ifaces).script)
                    stack.append((half, ""))
                except NftError as exc:
                    stack.append((half, str(exc)))
        return bad

    # -- bookkeeping ---------------------------------------------------------------------
    def _expire(self, plan: list[Rule]) -> None:
        groups = by_service(plan)
        now = self._clock()
        for key, h in list(self.held.items()):
            if signature(groups.get(key, [])) != h.signature or now - h.at >= RETRY_REFUSED:
                del self.held[key]

    def _with_held(self, plan: list[Rule]) -> list[Rule]:
        return [r for r in plan if r.service not in self.held] + [r for r in self.rules if r.service in self.held]

    def _refuse(self, bad: dict[str, str], want: list[Rule]) -> None:
        groups = by_service(want)
        kept = by_service(self.rules)
        for key, why in bad.items():
            before = self.held.get(key)
            self.held[key] = Held(signature(groups.get(key, [])), why, self._clock())
            if before is None or before.reason != why:
                rest = "its last good rules stay in place" if key in kept else "it is not forwarded"
                event(self.log, "backendsRefused", f"nft refuses the rules of this service: {why} ({rest}; "
                      f"the other services are programmed; tried again in {RETRY_REFUSED:g}s or at a change)",
                      logging.ERROR, service=key)

    def _succeeded(self, rules: list[Rule], rendered: nft.Rendered) -> None:
        failures = self.backoff.failures
        self.backoff.succeeded()
        self.rendered, self.rules = rendered, rules
        self.pending, self.error = [], ""
        if failures:
            event(self.log, "dataplaneRecovered", f"nft works again after {failures} failed tries: the tables "
                  "hold the plan")

    def _failed(self, error: str, want: list[Rule]) -> bool:
        wait = self.backoff.failed(error)
        services = changed(self.rules, want)
        self.pending, self.error = services, error
        n = self.backoff.failures
        if n & (n - 1) == 0:  # 1, 2, 4, 8...: the log keeps up without one line per try
            event(self.log, "dataplaneFailed", f"nft failed: {error}; the last good tables stay in place, next "
                  f"try in {wait:.2f}s", logging.ERROR, services=",".join(services) or "-", failures=n)
        return False
