"""The back-off schedule every external tool shares (speaker/nocloudlb/backoff.py), with a fake clock."""

from __future__ import annotations

import pytest
from nocloudlb.backoff import Backoff, BackoffCollector
from prometheus_client import CollectorRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("failures", "upper"), [(0, 0.0), (1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0),
                                                 (500, 30.0)])
def test_delay_doubles_up_to_the_ceiling(failures, upper):
    assert Backoff("t", base=0.5, factor=2, ceiling=30).delay(failures) == upper


@pytest.mark.parametrize(("rand", "wait"), [(0.0, 1.0), (0.5, 1.5), (0.999, 1.999)])
def test_jitter_draws_between_half_and_the_whole_delay(rand, wait):
    clock = Clock()
    b = Backoff("t", base=1, ceiling=8, clock=clock, rand=lambda: rand)
    b.failed("one")
    assert b.failed("two") == pytest.approx(wait)
    assert b.next_try == pytest.approx(clock.now + wait)


def test_ready_only_after_the_wait_and_success_resets():
    clock = Clock()
    b = Backoff("nft", base=1, ceiling=4, clock=clock, rand=lambda: 1.0)
    assert b.ready() and b.state() == {"state": "ok", "failures": 0, "failuresTotal": 0}
    b.failed("exit 1: syntax error")
    assert not b.ready()
    assert b.state() == {"state": "backoff", "failures": 1, "failuresTotal": 1, "error": "exit 1: syntax error",
                         "nextTrySeconds": 1.0}
    clock.now += 1.0
    assert b.ready()
    b.succeeded()
    assert b.ready() and b.failures == 0 and b.total == 1


def test_runs_per_second_stay_bounded_whatever_fails():
    # a tool failing at every try for 30 s, tried whenever allowed: at most 2 runs/s on average
    clock = Clock()
    b = Backoff("vtysh", base=0.5, ceiling=5, clock=clock)
    runs, end = 0, clock.now + 30
    while clock.now < end:
        if b.ready():
            runs += 1
            b.failed("down")
        clock.now += 0.01
    assert runs / 30 <= 2


@pytest.mark.parametrize("kwargs", [{"base": 0}, {"factor": 0.5}, {"base": 5, "ceiling": 1}])
def test_bad_settings_are_refused_by_name(kwargs):
    with pytest.raises(ValueError, match="backoff x"):
        Backoff("x", **kwargs)


def test_metrics_show_each_tool():
    registry = CollectorRegistry()
    collector = BackoffCollector()
    registry.register(collector)
    clock = Clock()
    collector.add(Backoff("nft", clock=clock, rand=lambda: 1.0)).failed("boom")
    collector.add(Backoff("vtysh", clock=clock))
    assert registry.get_sample_value("nocloudlb_backoff_failures", {"tool": "nft"}) == 1
    assert registry.get_sample_value("nocloudlb_backoff_failures", {"tool": "vtysh"}) == 0
    assert registry.get_sample_value("nocloudlb_backoff_next_try_seconds", {"tool": "nft"}) == 0.5
    assert registry.get_sample_value("nocloudlb_backoff_tool_failures_total", {"tool": "nft"}) == 1
