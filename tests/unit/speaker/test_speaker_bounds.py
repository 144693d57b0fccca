"""Defects 12 and 16 (issue 8): the control socket and the metrics listener are bounded.

Before: a thread per connection without bound, no read timeout (a silent client held a thread
forever), and the metrics listener on 0.0.0.0."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

import pytest
from nocloudlb.config import parse
from nocloudlb.control import ControlServer
from nocloudlb.core.control_client import request
from nocloudlb.metrics import serve
from prometheus_client import CollectorRegistry


@pytest.fixture
def control(tmp_path):
    path = str(tmp_path / "s.sock")
    srv = ControlServer(path, lambda req: {"ok": True, "echo": req}, max_connections=4, read_timeout=0.5)
    srv.start()
    yield srv, path
    srv.stop()


def _connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    return s


def test_control_connections_are_bounded_and_silent_ones_dropped(control):
    srv, path = control
    base = threading.active_count()
    idle = [_connect(path) for _dummy in range(24)]  # a flood of clients that send nothing
    time.sleep(0.3)
    assert threading.active_count() <= base + 4 + 1, threading.active_count()
    assert srv.refused >= 15
    # the busy answer reaches a refused client
    answers = [s.recv(200) for s in idle[4:8]]
    assert all(b"busy" in a for a in answers), answers
    # after the read timeout the silent ones are dropped and the socket serves again
    time.sleep(1.0)
    assert request(path, {"cmd": "status"}) == {"ok": True, "echo": {"cmd": "status"}}
    for s in idle:
        s.close()


@pytest.mark.parametrize("payload,error", [
    (b"[" * 100000 + b"]" * 100000 + b"\n", "bad request"),
    (b'{"cmd": "status", "x": "' + b"a" * (2 << 20) + b'"}\n', "longer than"),
    (b"\xff\xfe\n", "bad request"),
    (b"42\n", "a request is a JSON object"),
])
def test_control_refuses_hostile_requests(control, payload, error):
    dummy, path = control
    s = _connect(path)
    try:
        s.sendall(payload)
    except OSError:
        pass  # the server may close before reading the whole line
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    resp = json.loads(data)
    assert resp["ok"] is False and error in resp["error"] and len(resp["error"]) < 400
    assert request(path, {"cmd": "x"})["ok"] is True  # still serving


def test_metrics_default_is_the_management_address():
    doc = {"node": {"name": "n1"}, "memberlist": {"bind": "198.51.100.11:7946"}}
    assert parse(doc).metrics_bind == "198.51.100.11:7472"
    doc["memberlist"]["bind"] = "[2001:db8::11]:7946"
    assert parse(doc).metrics_bind == "[2001:db8::11]:7472"
    doc["metrics"] = {"bind": "auto:9100"}
    assert parse(doc).metrics_bind == "[2001:db8::11]:9100"
    doc["metrics"] = {"bind": "0.0.0.0:7472"}  # an explicit choice stays the operator's
    assert parse(doc).metrics_bind == "0.0.0.0:7472"


def test_metrics_listener_caps_connections():
    reg = CollectorRegistry()
    srv = serve("127.0.0.1:0", lambda: {}, registry=reg, max_connections=3)
    port = srv.server_address[1]
    try:
        base = threading.active_count()
        idle = []
        for _dummy in range(30):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(s)
        time.sleep(0.3)
        assert threading.active_count() <= base + 3, threading.active_count()
        assert srv.refused >= 20
        for s in idle:
            s.close()
        time.sleep(0.3)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "nocloudlb_config_loaded_bool" in body
    finally:
        srv.shutdown()
        srv.server_close()
