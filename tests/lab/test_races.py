"""Races between cleanup and a lab that is still changing (the crash-mid-up flake), on real cgroups."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import labctl
import pytest
from conftest import LABCTL

pytestmark = pytest.mark.timeout(60)


def _rmtree_cgroup(d: Path) -> None:
    for top, _dirs, _files in os.walk(d, topdown=False):
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(top)


@pytest.fixture
def scratch_cgroup() -> Iterator[Path]:
    """An empty cgroup below ours in the hierarchy that holds a host's processes, removed afterwards."""
    cgs = {k: mnt / own.lstrip("/") / f"{labctl.PREFIX}-pyw-scratch" for k, (mnt, own) in
           labctl.cgroup_hierarchies().items()}
    d = labctl.main_cgroup(cgs)
    _rmtree_cgroup(d)
    d.mkdir()
    try:
        yield d
    finally:
        for p in labctl.cgroup_pids(d):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while d.exists() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                _rmtree_cgroup(d)
            time.sleep(0.05)
        assert not d.exists()


def test_cgroup_walk_survives_cgroups_that_come_and_go(scratch_cgroup: Path) -> None:
    """A booting host's systemd adds and removes unit cgroups while cleanup lists the host's PIDs.

    The old Path.rglob walk raised FileNotFoundError for a directory removed mid-walk (about one
    read in ten here), which made `labctl cleanup` exit 1 after a crash mid-up.
    """
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for i in range(20):
                (scratch_cgroup / f"u{i}" / "s").mkdir(parents=True, exist_ok=True)
            for i in range(20):
                (scratch_cgroup / f"u{i}" / "s").rmdir()
                (scratch_cgroup / f"u{i}").rmdir()

    worker = threading.Thread(target=churn)
    worker.start()
    errors = []
    try:
        for _dummy in range(300):
            try:
                assert labctl.cgroup_pids(scratch_cgroup) == []
            except OSError as exc:
                errors.append(repr(exc))
    finally:
        stop.set()
        worker.join()
    assert errors == []
    labctl.remove_cgroup_tree(scratch_cgroup)
    assert not scratch_cgroup.exists()


def test_remove_cgroup_tree_waits_then_names_what_is_left(scratch_cgroup: Path) -> None:
    sub = scratch_cgroup / "busy"
    sub.mkdir()

    def join() -> None:
        (sub / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.Popen(["sleep", "60"], preexec_fn=join)
    try:
        t0 = time.monotonic()
        with pytest.raises(labctl.LabError) as exc:
            labctl.remove_cgroup_tree(scratch_cgroup, timeout=0.5)
        assert time.monotonic() - t0 >= 0.5
        assert f"cannot remove cgroup {scratch_cgroup}: still busy" in str(exc.value)
        assert str(sub) in str(exc.value) and str(proc.pid) in str(exc.value)
        proc.kill()
        proc.wait()
        labctl.remove_cgroup_tree(scratch_cgroup)  # the same tree, now empty: removed
        assert not scratch_cgroup.exists()
        labctl.remove_cgroup_tree(scratch_cgroup)  # and again: nothing to do, no error
    finally:
        proc.kill()
        proc.wait()


def test_helpers_die_with_a_killed_labctl() -> None:
    """A helper (ip, mount, ...) of a labctl killed mid-up must not finish its job after the kill."""
    code = f"import sys; sys.path.insert(0, {str(LABCTL.parent)!r}); import labctl; labctl.run(['sleep', '60'])"
    parent = subprocess.Popen([sys.executable, "-c", code])
    helper: int | None = None
    start: int | None = None
    try:
        deadline = time.monotonic() + 20
        while helper is None and time.monotonic() < deadline:
            children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
            helper = int(children[0]) if children else None
            time.sleep(0.02)
        assert helper is not None, "labctl.run did not start its helper"
        start = labctl.proc_start_time(helper)
        assert labctl.pid_alive(helper, start)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while labctl.pid_alive(helper, start) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not labctl.pid_alive(helper, start)
    finally:
        parent.kill()
        parent.wait()
        if helper is not None and labctl.pid_alive(helper, start):
            os.kill(helper, signal.SIGKILL)
