"""The speaker's modes: what the decision thread hands each reconcile's published view to.

A mode (layer 2, BGP, data plane) is a class with five methods (docs: /work/notes/MODES.md)::

    name: str
    start()                        open sockets / files; may raise (the speaker then fails closed)
    apply(me, nodes, parsed)       idempotent: compute this node's part with a pure core function,
                                   then act; withdrawals first and fast, slow work in its own thread
    withdraw_all()                 fail closed: stop announcing everything, fast
    status() -> dict               JSON-able; shown under status()["modes"][name]
    close()                        stop threads; leave nothing stale

``nodes`` is the *published* view: every member as the others see it (this node from the
metadata it managed to publish, not from newer local labels or health), so every speaker
computes the same answer.

Optional hooks a mode may add (the daemon calls them when present, for every mode alike):

    on_heal(heals)                 the cluster may just have healed: ``[(reason, node), ...]``
    meta() -> dict[str, bytes]     published with this node's metadata (``macs``: the MACs it answers from)
    busy() -> bool                 reconcile again soon (e.g. a conflict check runs)

A status dict may carry ``vips`` (rows with ip, service, announcing, reason, ...) and
``conflicts``: the speaker's status lists them at the top level too.

``ModeRunner`` is the exception barrier around one mode: an ``apply`` that raises makes the
mode withdraw everything (fail closed); the next reconcile tries again. Its hooks, ``status``,
``withdraw_all`` and ``close`` are behind the same barrier; a failing ``meta`` hook publishes the
mode's last good meta. A mode whose apply keeps failing for longer than ``FAIL_BOUND`` has its
``clock`` tripped: the speaker then publishes the node excluded (the drain label) so that peers
take its VIPs by a planned move, since peers still elect a node whose mode withdrew.

``Steps`` counts each failing step (``nocloudlb_speaker_step_errors_total{step}``) and logs it,
rate limited: at level error the first time and then at most once a minute per step (debug in
between), with the count; the step that works again logs ``stepRecovered`` (as rate limited).
``FailClock`` is the bound and the hold time of a failure that persists (the daemon's loop and each
mode have one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from nocloudlb.core.election import NodeView

from . import logs

log = logging.getLogger("nocloudlb.speaker")

#: Seconds a failure must persist before the node fails closed by a planned move (publishes itself
#: drained). Longer than one retry (reconciles run at least once a second), so a single error moves
#: nothing; short enough that a node whose modes withdrew is handed over within a few seconds.
FAIL_BOUND = 3.0
#: Seconds of success before a node drained that way returns; doubled at each new trip (up to
#: RECOVER_HOLD_MAX) so that a failure that comes back as soon as the node serves again does not flap.
RECOVER_HOLD = 3.0
RECOVER_HOLD_MAX = 300.0
#: A tripped clock's doubling is forgotten after this long without a trip.
TRIP_MEMORY = 600.0
#: At most one loud (level error) event per failing step in this many seconds.
LOUD_EVERY = 60.0


class StepFailed(Exception):
    """A step failed behind its barrier (already counted and logged) and the caller cannot go on."""

    def __init__(self, step: str, error: str) -> None:
        super().__init__(f"{step}: {error}")
        self.step, self.error = step, error


class FailClock:
    """When a failure has lasted ``bound`` seconds the clock trips; once tripped it stays so until the
    failing thing has succeeded for the hold time (``RECOVER_HOLD``, doubled at each trip within
    ``TRIP_MEMORY``). ``now`` is time.monotonic()."""

    def __init__(self, bound: float = FAIL_BOUND, hold: float = RECOVER_HOLD) -> None:
        self.bound, self.hold = bound, hold
        self.since: float | None = None  # first failure of the current run of failures
        self.ok_since: float | None = None  # first success since the clock tripped
        self.tripped = False
        self.tripped_at = 0.0
        self.trips = 0
        self.reason = ""

    def failed(self, reason: str, now: float | None = None) -> bool:
        """Record a failure; True when this one trips the clock."""
        now = time.monotonic() if now is None else now
        self.reason = reason
        self.ok_since = None
        if self.since is None:
            self.since = now
        if self.tripped or now - self.since < self.bound:
            return False
        self.trips = self.trips + 1 if now - self.tripped_at < TRIP_MEMORY else 1
        self.tripped, self.tripped_at = True, now
        return True

    def succeeded(self, now: float | None = None) -> bool:
        """Record a success; True when it clears a tripped clock."""
        now = time.monotonic() if now is None else now
        if not self.tripped:
            self.since = None
            return False
        if self.ok_since is None:
            self.ok_since = now
        if now - self.ok_since < min(self.hold * 2 ** (self.trips - 1), RECOVER_HOLD_MAX):
            return False
        self.tripped, self.since, self.ok_since, self.reason = False, None, None, ""
        return True


class Steps:
    """Failure counts per step and their rate-limited events (see the module docstring)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.failing: dict[str, str] = {}
        self._loud_at: dict[str, float] = {}
        self._recovered_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def failed(self, step: str, exc: BaseException, event: str = "stepFailed", msg: str = "",
               **fields: Any) -> str:
        """Count and log one failure of ``step``; returns its text ("Type: message")."""
        error = f"{type(exc).__name__}: {exc}"[:500]
        now = time.monotonic()
        with self._lock:
            count = self.counts[step] = self.counts.get(step, 0) + 1
            self.failing[step] = error
            # a step that fails, works, fails again ... is loud once a minute too, not at every failure
            loud = now - self._loud_at.get(step, -1e9) >= LOUD_EVERY
            if loud:
                self._loud_at[step] = now
        logs.event(log, event, msg or f"the {step} step failed; the other steps go on and it is retried",
                   logging.ERROR if loud else logging.DEBUG, step=step, error=error, count=count, **fields)
        if loud:
            log.debug("%s traceback (%s)", event, step, exc_info=exc)
        return error

    def ok(self, step: str) -> None:
        if step not in self.failing:
            return
        now = time.monotonic()
        with self._lock:
            error = self.failing.pop(step, None)
            loud = now - self._recovered_at.get(step, -1e9) >= LOUD_EVERY
            if error is not None and loud:
                self._recovered_at[step] = now
        if error is not None:
            logs.event(log, "stepRecovered", "", logging.INFO if loud else logging.DEBUG, step=step,
                       errors=self.counts.get(step, 0), lastError=error)

    def run(self, step: str, fn: Callable[..., Any], *args: Any, default: Any = None) -> tuple[bool, Any]:
        """``fn(*args)`` behind the barrier: (True, its result) or (False, ``default``) after counting."""
        try:
            out = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the barrier: one step's bug never stops the others
            self.failed(step, exc)
            return False, default
        self.ok(step)
        return True, out

    def status(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {s: {"errors": n, "failing": self.failing.get(s, "")} for s, n in sorted(self.counts.items())}

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


@runtime_checkable
class Mode(Protocol):
    name: str

    def start(self) -> None: ...

    def apply(self, me: str, nodes: list[NodeView], parsed: Any) -> None: ...

    def withdraw_all(self) -> None: ...

    def status(self) -> dict: ...

    def close(self) -> None: ...


class ModeRunner:
    """Calls a mode's methods behind an exception barrier (see the module docstring)."""

    def __init__(self, mode: Mode, steps: Steps | None = None) -> None:
        self.mode = mode
        self.steps = steps if steps is not None else Steps()
        self.failing = ""  # the last apply error, "" while it works
        self.clock = FailClock()
        self._meta: Any = None  # the last meta the hook returned

    @property
    def name(self) -> str:
        return self.mode.name

    def apply(self, me: str, nodes: list[NodeView], parsed: Any) -> bool:
        try:
            self.mode.apply(me, nodes, parsed)
        except Exception as exc:  # noqa: BLE001 - the barrier: fail closed, retry at the next reconcile
            self.failing = self.steps.failed(f"{self.name}.apply", exc, "modeFailed",
                                             "a mode failed to apply the decision: it withdraws everything "
                                             "and retries", mode=self.name)
            self.clock.failed(self.failing)
            self.withdraw_all()
            return False
        self.clock.succeeded()
        if self.failing:
            self.steps.ok(f"{self.name}.apply")
            logs.event(log, "modeRecovered", mode=self.name)
            self.failing = ""
        return True

    def withdraw_all(self) -> None:
        try:
            self.mode.withdraw_all()
        except Exception as exc:  # noqa: BLE001 - nothing more to do than say so
            self.steps.failed(f"{self.name}.withdraw", exc, "modeWithdrawFailed", mode=self.name)

    def status(self) -> dict:
        try:
            st = dict(self.mode.status())
        except Exception as exc:  # noqa: BLE001
            st = {"error": self.steps.failed(f"{self.name}.status", exc, "modeHookFailed", mode=self.name,
                                             hook="status")}
        if self.failing:
            st["failing"] = self.failing
        return st

    def hook(self, name: str, *args: Any) -> Any:
        fn = getattr(self.mode, name, None)
        if fn is None:
            return None
        try:
            out = fn(*args)
        except Exception as exc:  # noqa: BLE001
            self.steps.failed(f"{self.name}.hook.{name}", exc, "modeHookFailed", mode=self.name, hook=name)
            # what this mode published last stays published (its MACs): peers keep recognising them
            return self._meta if name == "meta" else None
        if name == "meta":
            self._meta = out
        self.steps.ok(f"{self.name}.hook.{name}")
        return out

    def close(self) -> None:
        try:
            self.mode.close()
        except Exception as exc:  # noqa: BLE001
            self.steps.failed(f"{self.name}.close", exc, "modeCloseFailed", mode=self.name)
