"""The log writer (nocloudlb.logs): per-VIP events leave the decision thread, and the logs keep their promise.

A reconcile that moves 10,000 VIPs logs 10,000 ``serviceAnnounced`` / ``serviceWithdrawn`` lines; formatting
and writing them on the decision thread was most of its time. With ``logs.setup`` (the daemon) the
decision thread only queues them; these tests hold that every event is still written, in order, with the
time it happened, and that nothing queued is lost when the process stops (flush, atexit, an exception
escaping the main function)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import threading
import time

import pytest
from nocloudlb import logs
from test_speaker_scale_reconcile import big, mode_for, view

pytestmark = pytest.mark.timeout(120)


class Recording(io.StringIO):
    """A stream that remembers which thread wrote, and can hold writes back until released."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def write(self, s: str) -> int:
        self.writers.append(threading.current_thread().name)
        self.gate.wait(30)
        return super().write(s)


@pytest.fixture
def stream():
    s = Recording()
    logs.setup("info", s)
    yield s
    s.gate.set()
    logs.shutdown()
    logging.getLogger().handlers.clear()


def lines(s: io.StringIO) -> list[dict]:
    return [json.loads(x) for x in s.getvalue().splitlines()]


def test_an_apply_writes_nothing_on_the_decision_thread_and_every_vip_event_in_order(stream, tmp_path):
    parsed = big(3000)
    mode, ann = mode_for("n1")
    mode.state_dir = str(tmp_path)
    mode.apply("n1", view(["n1", "n2", "n3"], parsed), parsed)
    mode.apply("n1", view(["n1", "n3"], parsed), parsed)  # n2 dies: its VIPs move to n1 or n3
    mode.apply("n1", view(["n1", "n2", "n3"], parsed), parsed)  # and come back
    assert logs.flush()
    assert stream.writers and set(stream.writers) == {"log-writer"}, "the decision thread wrote log lines"

    # the same three applies logged synchronously (the old way) give the same lines in the same order
    sync = io.StringIO()
    logs.setup("info", sync, background=False)
    mode2, _ann2 = mode_for("n1")
    mode2.state_dir = str(tmp_path)
    mode2.apply("n1", view(["n1", "n2", "n3"], parsed), parsed)
    mode2.apply("n1", view(["n1", "n3"], parsed), parsed)
    mode2.apply("n1", view(["n1", "n2", "n3"], parsed), parsed)
    got, want = lines(stream), lines(sync)
    strip = [{k: v for k, v in r.items() if k != "ts"} for r in got]
    assert strip == [{k: v for k, v in r.items() if k != "ts"} for r in want]
    gained = [r["ip"] for r in got if r["event"] == "serviceAnnounced"]
    first = len({r.ip for r in mode._rows if r.leader == "n1"})
    assert len(gained) > first > 500  # the first apply's VIPs, then those gained from n2
    ts = [r["ts"] for r in got]
    assert ts == sorted(ts), "lines are written in the order of their events"


def test_events_keep_their_event_time_and_order_while_the_writer_is_held_back(stream):
    log = logging.getLogger("nocloudlb.test")
    stream.gate.clear()  # the writer blocks in its first write: everything after it waits in the queue
    logs.event(log, "first")
    time.sleep(0.2)  # the writer is now inside the held write
    t0 = time.time()
    with logs.Batch(log) as out:
        for i in range(500):
            out.event("serviceAnnounced", ip=f"2001:db8::{i:x}", node="n1")
    logs.event(log, "after", msg_field="x")
    other = threading.Thread(target=lambda: logs.event(logging.getLogger("nocloudlb.heartbeat"), "fromThread"))
    other.start()
    other.join()
    time.sleep(1.2)
    stream.gate.set()
    assert logs.flush()
    got = lines(stream)
    assert [r["event"] for r in got] == ["first"] + ["serviceAnnounced"] * 500 + ["after", "fromThread"]
    assert [r["ip"] for r in got[1:501]] == [f"2001:db8::{i:x}" for i in range(500)]
    from datetime import datetime

    stamps = [datetime.fromisoformat(r["ts"]).timestamp() for r in got[1:]]
    assert all(t0 - 0.01 <= t < t0 + 0.5 for t in stamps), "a line carries its event's time, not its write's"


def test_a_debug_event_below_the_level_is_not_queued(stream):
    with logs.Batch(logging.getLogger("nocloudlb.test")) as out:
        out.event("serviceNotAnnounced", level=logging.DEBUG, ip="198.51.100.1")
        out.event("serviceAnnounced", ip="198.51.100.2")
    assert logs.flush()
    assert [r["event"] for r in lines(stream)] == ["serviceAnnounced"]


def test_without_the_writer_a_batch_logs_at_once_to_every_handler(caplog):
    """Library use and caplog: no background writer, the records reach handlers as they happen."""
    logging.getLogger().handlers[:] = [h for h in logging.getLogger().handlers
                                       if not isinstance(h, logs.BackgroundHandler)]
    caplog.set_level(logging.INFO)
    with logs.Batch(logging.getLogger("nocloudlb.test")) as out:
        out.event("serviceAnnounced", ip="198.51.100.2")
        assert [r.fields["ip"] for r in caplog.records if getattr(r, "event", "") == "serviceAnnounced"] == [
            "198.51.100.2"]


def test_other_handlers_still_see_batch_records(stream):
    """With the writer and another handler (a test's capture, a second sink), the batch is replayed as
    records for every handler, each with its event time."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    extra = Keep()
    logging.getLogger().addHandler(extra)
    try:
        t0 = time.time()
        with logs.Batch(logging.getLogger("nocloudlb.test")) as out:
            out.event("serviceWithdrawn", ip="198.51.100.3", reason="notOwner")
        assert logs.flush()
    finally:
        logging.getLogger().removeHandler(extra)
    assert [(r.event, r.fields["ip"]) for r in seen] == [("serviceWithdrawn", "198.51.100.3")]  # type: ignore[attr-defined]
    assert abs(seen[0].created - t0) < 0.5
    assert [r["event"] for r in lines(stream)] == ["serviceWithdrawn"]


CHILD = r"""
import logging, sys, threading, time
from nocloudlb import logs

class Slow:
    # stderr that takes its time: lines are still queued when the process ends
    def write(self, s):
        time.sleep(0.05)
        sys.__stdout__.write(s)
    def flush(self):
        sys.__stdout__.flush()

logs.setup("info", Slow())
log = logging.getLogger("nocloudlb.child")
for chunk in range(20):
    with logs.Batch(log) as out:
        for i in range(500):
            out.event("serviceAnnounced", n=chunk * 500 + i)
logs.event(log, "speakerStopped")
if sys.argv[1] == "raise":
    raise RuntimeError("the loop's error path: an exception escapes main")
if sys.argv[1] == "exit":
    sys.exit(3)
"""


@pytest.mark.parametrize("how", ["return", "exit", "raise"])
def test_nothing_queued_is_lost_when_the_process_ends(how):
    res = subprocess.run([sys.executable, "-c", CHILD, how], capture_output=True, text=True, timeout=60,
                         check=False)
    got = [json.loads(x) for x in res.stdout.splitlines()]
    assert [r.get("n") for r in got[:-1]] == list(range(10_000))
    assert got[-1]["event"] == "speakerStopped"
    assert res.returncode == {"return": 0, "exit": 3, "raise": 1}[how]


def test_after_shutdown_records_are_written_at_once():
    s = io.StringIO()
    logs.setup("info", s)
    logs.shutdown()
    try:
        logs.event(logging.getLogger("nocloudlb.test"), "late")
        with logs.Batch(logging.getLogger("nocloudlb.test")) as out:
            out.event("serviceWithdrawn", ip="198.51.100.4", reason="shutdown")
        assert [r["event"] for r in lines(s)] == ["late", "serviceWithdrawn"]
    finally:
        logging.getLogger().handlers.clear()
