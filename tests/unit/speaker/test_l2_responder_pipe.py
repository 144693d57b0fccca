"""The announcer's pipe to the responder child: lines queued by one thread and flushed by two (the
announcer's loop, and the wake-up of the caller of set_announced) reach the child once each, in order.
Seen at 10,000 VIPs before the fix: ``BufferError: Existing exports of data`` in flush, and a second
flush writing the same bytes again while both then deleted them (lines lost: a VIP answered by nobody,
or still answered after its withdrawal)."""

from __future__ import annotations

import logging
import threading

import pytest
from nocloudlb.l2.responder import ResponderClient

pytestmark = pytest.mark.timeout(60)


def test_lines_reach_the_child_once_each_in_order_with_two_threads_flushing(tmp_path):
    sink = tmp_path / "child-stdin"
    client = ResponderClient(logging.getLogger("test"), ["sh", "-c", f"cat > {sink}"])
    client.spawn()
    n = 60000
    errors: list[BaseException] = []
    done = threading.Event()

    def producer() -> None:  # the announcer's thread: send (under its own lock) and flush
        try:
            for i in range(n):
                client.send(f"A eth0 {i:032x}")
                if i % 7 == 0:
                    client.flush()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            done.set()

    def waker() -> None:  # the decision thread's _wake(): flush, outside the announcer's lock
        try:
            while not done.is_set():
                client.flush()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=producer), threading.Thread(target=waker), threading.Thread(target=waker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    while client.out:
        client.flush()
    proc = client.proc
    assert proc is not None and proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)
    assert not errors, errors
    lines = sink.read_text().splitlines()
    assert lines == [f"A eth0 {i:032x}" for i in range(n)], f"{len(lines)} lines, {len(set(lines))} distinct"
