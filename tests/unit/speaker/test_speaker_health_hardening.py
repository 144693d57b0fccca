"""Defect 10 (issue 8): exec checks run without network capabilities, die at their deadline with their
whole process group, and a result that stopped coming counts as unhealthy; bad intervals are refused."""

from __future__ import annotations

import math
import os
import time

import pytest
from nocloudlb.health import CheckSpec, CheckState, HealthChecker, run_exec

CAP_NET_ADMIN, CAP_NET_RAW = 12, 13


def _caps(status: str) -> dict[str, int]:
    out = {}
    for line in status.splitlines():
        key, dummy, value = line.partition(":")
        if key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            out[key] = int(value.strip(), 16)
    return out


def test_exec_check_child_has_no_network_capabilities(tmp_path):
    out = tmp_path / "status"
    ok, err = run_exec(["/bin/sh", "-c", f"cat /proc/self/status > {out}"], 5.0)
    assert ok, err
    caps = _caps(out.read_text())
    for name, value in caps.items():
        for bit in (CAP_NET_ADMIN, CAP_NET_RAW):
            assert not value & (1 << bit), (name, hex(value))
    assert "NoNewPrivs:\t1" in out.read_text()
    mine = _caps(open("/proc/self/status").read())
    if os.geteuid() == 0:  # the test itself (root) still holds them: only the child lost them
        assert mine["CapEff"] & (1 << CAP_NET_RAW)


def test_exec_deadline_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    # the check forks a straggler that holds no pipe of ours and would outlive a plain kill of the child
    ok, err = run_exec(["/bin/sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], 0.5)
    took = time.monotonic() - t0
    assert not ok and "timed out" in err
    assert took < 5.0, took
    pid = int(pidfile.read_text())
    for _dummy in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the check's child {pid} survived its deadline")


@pytest.mark.parametrize("field,value", [("interval", math.nan), ("interval", math.inf), ("interval", 0.001),
                                         ("timeout", math.nan), ("timeout", 0.0001), ("interval", [1]),
                                         ("rise", 0), ("fall", 10**9), ("port", "80"), ("command", "true")])
def test_bad_numbers_are_refused(field, value):
    raw = {"type": "exec", "command": ["true"], "interval": 2, "timeout": 1}
    raw[field] = value
    with pytest.raises(ValueError, match="Service prod/web: health check"):
        CheckSpec.from_dict("Service prod/web", raw)


def test_stale_result_counts_as_unhealthy():
    hc = HealthChecker(lambda: None)
    try:
        spec = CheckSpec(kind="exec", interval=0.2, timeout=0.1, command=("true",))
        st = CheckState("prod/web", spec, healthy=True, last_run=time.monotonic())
        hc._checks["prod/web"] = st  # a result, and then the check stops reporting (a stuck worker)
        assert hc.healthy() == {"prod/web"}
        st.last_run = time.monotonic() - HealthChecker.stale_after(spec) - 0.1
        assert hc.healthy() == set()
        status = hc.status()["prod/web"]
        assert status["stale"] and not status["healthy"] and "stale" in status["error"]
    finally:
        hc.stop()


def test_a_hung_exec_check_turns_unhealthy(tmp_path):
    """End to end: a check that hangs forever (it ignores SIGTERM) flips the service to unhealthy."""
    flag = tmp_path / "hang"
    cmd = ["/bin/sh", "-c", f"trap '' TERM; if [ -e {flag} ]; then sleep 300; fi; exit 0"]
    changes = []
    hc = HealthChecker(lambda: changes.append(time.monotonic()))
    try:
        hc.configure({"prod/web": CheckSpec(kind="exec", interval=0.2, timeout=0.2, rise=1, fall=1,
                                            command=tuple(cmd))})
        deadline = time.monotonic() + 10
        while hc.healthy() != {"prod/web"} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hc.healthy() == {"prod/web"}
        flag.touch()
        deadline = time.monotonic() + 15
        while hc.healthy() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hc.healthy() == set()
        assert "timed out" in hc.status()["prod/web"]["error"]
    finally:
        hc.stop()
