"""Health checks never run an external tool more than a few times a second, whatever fails (issue 21,
deliver 4): a check that cannot run (its command does not start, exit status 126/127) backs off
exponentially with jitter (``Backoff``: state and next try in the status, ``nocloudlb_backoff_*`` metrics), a
check that runs and fails runs at most every FAILING_GAP seconds whatever its interval, and a check that
recovers is healthy again after its ``rise`` passes. Real commands; each run appends a line to a file."""

from __future__ import annotations

import socket
import time

from nocloudlb.backoff import backoff_metrics
from nocloudlb.health import CheckSpec, HealthChecker
from prometheus_client import CollectorRegistry


def _runs(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _count(tmp_path, script: str, seconds: float = 3.0, **kw) -> tuple[int, HealthChecker, CollectorRegistry]:
    runs = tmp_path / "runs"
    registry = CollectorRegistry()
    hc = HealthChecker(lambda: None, metrics=backoff_metrics(registry))
    hc.configure({"prod/web": CheckSpec(kind="exec", interval=0.1, timeout=1.0, rise=2, fall=1,
                                        command=("/bin/sh", "-c", f"echo run >> {runs}; {script}"), **kw)})
    time.sleep(seconds)
    return _runs(runs), hc, registry


def test_a_check_whose_command_is_not_found_backs_off(tmp_path):
    runs, hc, registry = _count(tmp_path, "exec /nonexistent/check-web")  # sh: not found, exit status 127
    try:
        st = hc.status()["prod/web"]
        # before: every 0.1 s (30 runs in 3 s); now 0.5-1 s, 1-2 s, 2-4 s after the 1st, 2nd, 3rd error
        assert 2 <= runs <= 5, f"{runs} runs in 3 s"
        assert not st["healthy"] and "127" in st["error"], st
        assert st["backoff"]["state"] == "backoff" and st["backoff"]["failures"] == runs, st
        assert 0 <= st["backoff"]["nextTrySeconds"] <= 4.0, st  # 0: the next try is due as status is read
        tool = {"tool": "health prod/web"}
        assert registry.get_sample_value("nocloudlb_backoff_failures", tool) == runs
        assert registry.get_sample_value("nocloudlb_backoff_tool_failures_total", tool) == runs
    finally:
        hc.stop()


def test_a_check_that_fails_at_once_runs_at_most_twice_a_second(tmp_path):
    runs, hc, dummy = _count(tmp_path, "exit 1")  # it ran and said no: no back-off, but a floor on the rate
    try:
        st = hc.status()["prod/web"]
        assert runs <= 7, f"{runs} runs in 3 s (interval 0.1 s)"
        assert runs >= 5 and not st["healthy"] and st["backoff"]["state"] == "ok", (runs, st)
    finally:
        hc.stop()


def test_a_check_that_recovers_is_healthy_again_after_its_rise(tmp_path):
    ok, runs = tmp_path / "ok", tmp_path / "runs"
    changes: list[float] = []
    hc = HealthChecker(lambda: changes.append(time.monotonic()), metrics=backoff_metrics(CollectorRegistry()))
    try:
        hc.configure({"prod/web": CheckSpec(kind="exec", interval=0.2, timeout=1.0, rise=3, fall=1, command=(
            "/bin/sh", "-c", f"echo run >> {runs}; [ -e {ok} ] && exit 0; exec /nonexistent/check-web"))})
        time.sleep(2.5)
        backoff = hc.status()["prod/web"]["backoff"]
        assert backoff["state"] == "backoff" and changes, backoff
        ok.touch()
        t0 = time.monotonic()
        before = _runs(runs)
        deadline = t0 + backoff["nextTrySeconds"] + 3 * 0.2 + 2.0
        while hc.healthy() != {"prod/web"} and time.monotonic() < deadline:
            time.sleep(0.02)
        took = time.monotonic() - t0
        assert hc.healthy() == {"prod/web"}, hc.status()
        st = hc.status()["prod/web"]
        # healthy after exactly rise (3) passes, the first at the back-off's next try, then one per interval
        assert _runs(runs) - before == 3 and st["passes"] == 3 and st["backoff"]["state"] == "ok", st
        assert took <= backoff["nextTrySeconds"] + 2 * 0.2 + 0.5, f"healthy after {took:.2f}s ({backoff})"
    finally:
        hc.stop()


def test_an_unchanged_check_keeps_its_schedule_across_configure(tmp_path):
    # a config reload (the daemon) or a data-plane sync calls configure(): an unchanged check is not run again
    runs = tmp_path / "runs"
    spec = CheckSpec(kind="exec", interval=2.0, timeout=1.0, command=("/bin/sh", "-c", f"echo run >> {runs}"))
    hc = HealthChecker(lambda: None, metrics=backoff_metrics(CollectorRegistry()))
    try:
        for _i in range(20):
            hc.configure({"prod/web": spec})
            time.sleep(0.05)
        assert _runs(runs) == 1, f"{_runs(runs)} runs in 1 s for a check every 2 s"
    finally:
        hc.stop()


def test_a_tcp_check_refused_at_once_runs_at_most_twice_a_second():
    with socket.socket() as probe:  # a port nothing listens on: every connect is refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    hc = HealthChecker(lambda: None, metrics=backoff_metrics(CollectorRegistry()))
    try:
        hc.configure({"prod/web": CheckSpec(kind="tcp", port=port, interval=0.1, timeout=1.0, rise=2, fall=1)})
        time.sleep(3.0)
        st = hc.status()["prod/web"]
        assert 5 <= st["failures"] <= 7 and "refused" in st["error"] and st["backoff"]["state"] == "ok", st
    finally:
        hc.stop()
