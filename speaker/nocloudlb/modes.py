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
mode withdraw everything (fail closed); the next reconcile tries again.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from nocloudlb.core.election import NodeView

from . import logs

log = logging.getLogger("nocloudlb.speaker")


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

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.failing = ""  # the last apply error, "" while it works

    @property
    def name(self) -> str:
        return self.mode.name

    def apply(self, me: str, nodes: list[NodeView], parsed: Any) -> bool:
        try:
            self.mode.apply(me, nodes, parsed)
        except Exception as exc:  # noqa: BLE001 - the barrier: fail closed, retry at the next reconcile
            first = not self.failing
            self.failing = f"{type(exc).__name__}: {exc}"[:500]
            logs.event(log, "modeFailed", "a mode failed to apply the decision: it withdraws everything "
                       "and retries", logging.ERROR if first else logging.DEBUG, mode=self.name, error=self.failing)
            if first:
                log.debug("modeFailed traceback", exc_info=True)
            self.withdraw_all()
            return False
        if self.failing:
            logs.event(log, "modeRecovered", mode=self.name)
            self.failing = ""
        return True

    def withdraw_all(self) -> None:
        try:
            self.mode.withdraw_all()
        except Exception as exc:  # noqa: BLE001 - nothing more to do than say so
            logs.event(log, "modeWithdrawFailed", str(exc)[:500], logging.ERROR, mode=self.name)

    def status(self) -> dict:
        try:
            st = dict(self.mode.status())
        except Exception as exc:  # noqa: BLE001
            st = {"error": str(exc)[:500]}
        if self.failing:
            st["failing"] = self.failing
        return st

    def hook(self, name: str, *args: Any) -> Any:
        fn = getattr(self.mode, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001
            logs.event(log, "modeHookFailed", str(exc)[:500], logging.ERROR, mode=self.name, hook=name)
            return None

    def close(self) -> None:
        try:
            self.mode.close()
        except Exception as exc:  # noqa: BLE001
            logs.event(log, "modeCloseFailed", str(exc)[:500], logging.ERROR, mode=self.name)
