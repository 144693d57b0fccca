"""sd_notify datagrams on a real Unix socket; JSON log lines."""

from __future__ import annotations

import io
import json
import logging
import os
import socket

from nocloudlb import logs, sdnotify


def test_notify_sends_datagram(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as srv:
        srv.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert sdnotify.notify("READY=1")
        assert srv.recv(100) == b"READY=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not sdnotify.notify("READY=1")


def test_abstract_socket(monkeypatch):
    name = f"nocloudlb-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as srv:
        srv.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify("WATCHDOG=1")
        assert srv.recv(100) == b"WATCHDOG=1"


def test_watchdog_interval(monkeypatch):
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    assert sdnotify.watchdog_interval() == 2.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert sdnotify.watchdog_interval() is None  # meant for another process


def test_json_lines():
    buf = io.StringIO()
    logs.setup("debug", buf)
    log = logging.getLogger("nocloudlb.test")
    logs.event(log, "serviceWithdrawn", ip="198.51.100.1", reason="notOwner")
    log.warning("plain %s", "text")
    assert logs.flush()  # written by the log writer thread
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert lines[0]["event"] == "serviceWithdrawn" and lines[0]["reason"] == "notOwner"
    assert lines[0]["level"] == "info" and lines[0]["ts"].endswith("+00:00")
    assert lines[1] == {**lines[1], "event": "log", "msg": "plain text", "level": "warning"}
    logs.shutdown()
    logging.getLogger().handlers.clear()
