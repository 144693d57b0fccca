"""Back-off for every external tool the speaker runs (vtysh, frr-reload.py, nft, health probes).

One ``Backoff`` per tool and purpose. After a failure the next try waits ``base * factor**(n-1)``
seconds (n consecutive failures), capped at ``ceiling``, with "equal jitter": the wait is drawn
uniformly from [delay/2, delay], so nodes that failed together do not retry together, and the
tool never runs more often than once per ``base/2`` seconds while it keeps failing. A success
resets it. ``state()`` is what ``nocloudlb status`` shows; ``backoff_metrics`` exports the same
as ``nocloudlb_backoff_*{tool}`` gauges and a failure counter.

The class is pure (the clock and the random source are injected) so the schedule is table-tested
in tests/unit/speaker/test_backoff.py.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class Backoff:
    def __init__(self, tool: str, *, base: float = 0.5, factor: float = 2.0, ceiling: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, rand: Callable[[], float] = random.random) -> None:
        if base <= 0 or factor < 1 or ceiling < base:
            raise ValueError(f"backoff {tool}: need base > 0, factor >= 1, ceiling >= base "
                             f"(base={base}, factor={factor}, ceiling={ceiling})")
        self.tool = tool
        self.base = base
        self.factor = factor
        self.ceiling = ceiling
        self._clock = clock
        self._rand = rand
        self._lock = threading.Lock()
        self.failures = 0  # consecutive
        self.total = 0  # every failure since start
        self.error = ""
        self.next_try = 0.0  # monotonic time before which the tool is not run again; 0 = now

    def delay(self, failures: int) -> float:
        """The upper bound of the wait after ``failures`` consecutive failures (0 = no wait)."""
        if failures <= 0:
            return 0.0
        return min(self.ceiling, self.base * self.factor ** min(failures - 1, 64))

    def failed(self, error: str = "") -> float:
        """Count a failure; returns the wait chosen before the next try."""
        with self._lock:
            self.failures += 1
            self.total += 1
            self.error = error or self.error
            upper = self.delay(self.failures)
            wait = upper / 2 + self._rand() * upper / 2
            self.next_try = self._clock() + wait
            return wait

    def succeeded(self) -> None:
        with self._lock:
            self.failures = 0
            self.error = ""
            self.next_try = 0.0

    def ready(self) -> bool:
        return self._clock() >= self.next_try

    def remaining(self) -> float:
        """Seconds until the next try is allowed (0 when it may run now)."""
        return max(0.0, self.next_try - self._clock())

    @property
    def backing_off(self) -> bool:
        return self.failures > 0

    def state(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {"state": "backoff" if self.failures else "ok", "failures": self.failures,
                                   "failuresTotal": self.total}
            if self.failures:
                out["error"] = self.error
                out["nextTrySeconds"] = round(max(0.0, self.next_try - self._clock()), 3)
            return out


class BackoffCollector(Collector):
    """Exports every registered Backoff at scrape time."""

    def __init__(self) -> None:
        self._items: dict[str, Backoff] = {}
        self._lock = threading.Lock()

    def add(self, backoff: Backoff) -> Backoff:
        with self._lock:
            self._items[backoff.tool] = backoff
        return backoff

    def discard(self, tool: str) -> None:
        """Stop exporting ``tool`` (a health check whose service went away)."""
        with self._lock:
            self._items.pop(tool, None)

    def collect(self) -> Iterator[Any]:
        with self._lock:
            items = sorted(self._items.items())
        failing = GaugeMetricFamily("nocloudlb_backoff_failures", "Consecutive failures of an external tool "
                                    "(0 = working)", labels=["tool"])
        wait = GaugeMetricFamily("nocloudlb_backoff_next_try_seconds", "Seconds until the next try of a failing "
                                 "external tool (0 = not backing off)", labels=["tool"])
        total = CounterMetricFamily("nocloudlb_backoff_tool_failures", "Failures of an external tool since start",
                                    labels=["tool"])
        for name, item in items:
            failing.add_metric([name], item.failures)
            wait.add_metric([name], item.remaining() if item.failures else 0.0)
            total.add_metric([name], item.total)
        yield failing
        yield wait
        yield total


_collectors: dict[int, BackoffCollector] = {}


def backoff_metrics(registry: CollectorRegistry | None = REGISTRY) -> BackoffCollector:
    """The collector of a registry (registered once); ``.add(Backoff(...))`` to export one."""
    key = id(registry)
    if key not in _collectors:
        _collectors[key] = BackoffCollector()
        if registry is not None:
            registry.register(_collectors[key])
    return _collectors[key]
