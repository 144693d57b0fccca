"""The decision loop's failure accounting: fail closed by a planned move (issue 23: one job out of
daemon.py; the rule is daemon.py's module docstring, "The view itself failing ...").

``FailClosed`` keeps the loop's ``FailClock`` (modes.py) and what makes this node publish itself
excluded for failing (``noted``: "loop", a mode's name whose clock tripped, or ""; ``since``):

- ``iteration_failed(exc)``: the loop's barrier: count the error (``loopError``, unless a step's own
  barrier did, ``StepFailed``) and keep what the node holds; once the errors have lasted FAIL_BOUND,
  publish this node excluded (views.py publishes the drain label while ``reason()`` says why), then
  withdraw every mode; ``failClosedUnpublished`` when even that publication failed;
- ``iteration_ok()``: a pass that worked; after RECOVER_HOLD of them the exclusion ends;
- ``note()``: log a change of the exclusion (``failClosed``, ``failClosedEnded``) and reconcile at once.
"""

from __future__ import annotations

import logging

from nocloudlb.core.election import DRAIN_LABEL

from . import logs
from .config import now_iso
from .modes import FAIL_BOUND, FailClock, StepFailed
from .runtime import Runtime
from .views import Views

log = logging.getLogger("nocloudlb.speaker")


class FailClosed:
    def __init__(self, rt: Runtime, views: Views) -> None:
        self.rt = rt  # steps, modes, post
        self.views = views  # publish, published, meta_error
        self.clock = FailClock()  # iterations failing: fail closed after FAIL_BOUND
        self.noted = ""  # what makes this node publish itself excluded: "loop", a mode's name, or ""
        self.since = ""
        self._withdrawn_unpublished = False

    def iteration_failed(self, exc: Exception) -> None:
        """The loop's barrier (the module docstring): keep what the node holds; once the errors have lasted
        FAIL_BOUND, publish this node excluded, then withdraw (at once when the publication fails)."""
        if isinstance(exc, StepFailed):
            error = f"{exc.step}: {exc.error}"  # counted and logged by its own barrier
        else:
            error = self.rt.steps.failed("loop", exc, "loopError", "the decision loop failed: this node keeps what "
                                         "it holds and retries")
        self.clock.failed(error)
        if not self.clock.tripped:
            return
        self.note()
        self.rt.steps.run("publish", self.views.publish)
        self.rt.steps.run("push", self.views.push)
        mine = self.views.published()
        if not (mine is not None and DRAIN_LABEL in mine.labels) and not self._withdrawn_unpublished:
            logs.event(log, "failClosedUnpublished", "cannot publish this node excluded: withdrawing at once",
                       logging.ERROR, error=self.views.meta_error)
        self._withdrawn_unpublished = not (mine is not None and DRAIN_LABEL in mine.labels)
        for m in self.rt.modes:  # after the drain went out: peers take over by a planned move
            m.withdraw_all()

    def iteration_ok(self) -> None:
        if self.clock.since is not None or self.clock.tripped:
            self.rt.steps.ok("loop")
            if self.clock.succeeded():
                self.note()

    def reason(self) -> str:
        """Why this node publishes itself excluded for failing ("" when it does not)."""
        if self.clock.tripped:
            return f"the decision loop has failed for over {FAIL_BOUND:g}s: {self.clock.reason}"
        for m in list(self.rt.modes):
            if m.clock.tripped:
                return f"the {m.name} mode has failed for over {FAIL_BOUND:g}s: {m.clock.reason}"
        return ""

    def note(self) -> None:
        """Log a change of the fail-closed exclusion and reconcile at once, so that it is published now
        (a change of what fails, not of its error text: that would reconcile in a tight loop)."""
        what = "loop" if self.clock.tripped else next((m.name for m in self.rt.modes if m.clock.tripped), "")
        if what == self.noted:
            return
        if what:
            logs.event(log, "failClosed", "publishing this node excluded (the drain label) so that peers take its "
                       "VIPs by a planned move", logging.ERROR, reason=self.reason(), step=what)
        else:
            logs.event(log, "failClosedEnded", "working again: this node is no longer excluded",
                       step=self.noted)
            self._withdrawn_unpublished = False
        self.noted, self.since = what, now_iso() if what else ""
        self.rt.post()

    def status(self) -> dict[str, str]:
        """The status document's ``failClosed``: why and since when, {} when this node is not excluded."""
        return {"reason": self.reason(), "since": self.since} if self.noted else {}
