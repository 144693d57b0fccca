"""Health checks against real local servers and commands; the control socket over a real socket."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest
from nocloudlb.control import ControlServer
from nocloudlb.core.control_client import request
from nocloudlb.core.schema import parse_health_check
from nocloudlb.health import CheckSpec, HealthChecker

pytestmark = pytest.mark.timeout(30)


def spec(text: str, **over) -> CheckSpec:
    raw = parse_health_check(text, [(80, "TCP")])
    raw.update(over)
    return CheckSpec.from_dict("Service t/t", raw)


@pytest.fixture
def http_server():
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            code = {"/ok": 200, "/moved": 302, "/bad": 503}.get(self.path, 404)
            self.send_response(code)
            if code == 302:
                self.send_header("Location", "/nowhere")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tcp_http_exec_checks(http_server):
    port = http_server
    assert spec(f"tcp://127.0.0.1:{port}").run_once() == (True, "")
    ok, err = spec(f"tcp://127.0.0.1:{closed_port()}").run_once()
    assert not ok and "refused" in err.lower()
    assert spec(f"http://127.0.0.1:{port}/ok").run_once()[0]
    assert spec(f"http://127.0.0.1:{port}/moved").run_once()[0]  # 3xx passes, not followed
    ok, err = spec(f"http://127.0.0.1:{port}/bad").run_once()
    assert not ok and "503" in err
    assert spec("exec:true").run_once() == (True, "")
    ok, err = spec("exec:sh -c 'exit 3'").run_once()
    assert not ok and "exit status 3" in err
    ok, err = spec("exec:sleep 5", timeout=0.2, interval=1).run_once()
    assert not ok and "timed out" in err


def test_checker_rise_fall_and_callback(tmp_path):
    flag = tmp_path / "up"
    flag.write_text("")
    changes: list[float] = []
    hc = HealthChecker(lambda: changes.append(time.monotonic()))
    try:
        hc.configure({
            "a/checked": spec(f"exec:test -e {flag}", interval=0.1, timeout=0.1, rise=2, fall=3),
            "a/nocheck": None,
        })
        deadline = time.monotonic() + 5
        while "a/checked" not in hc.healthy() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert hc.healthy() == {"a/checked", "a/nocheck"}  # first result decides at once
        flag.unlink()
        time.sleep(0.15)
        assert "a/checked" in hc.healthy()  # one failure is not enough (fall=3)
        deadline = time.monotonic() + 5
        while "a/checked" in hc.healthy() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert hc.healthy() == {"a/nocheck"}
        st = hc.status()["a/checked"]
        assert st["healthy"] is False and st["failures"] >= 3 and "exit status" in st["error"]
        assert len(changes) == 2
    finally:
        hc.stop()


def test_control_socket_roundtrip(tmp_path):
    path = str(tmp_path / "s" / "speaker.sock")
    seen = []

    def handler(req):
        seen.append(req)
        if req.get("cmd") == "boom":
            raise RuntimeError("kaput")
        return {"ok": True, "echo": req}

    srv = ControlServer(path, handler)
    srv.start()
    try:
        assert request(path, {"cmd": "status"}) == {"ok": True, "echo": {"cmd": "status"}}
        assert request(path, {"cmd": "boom"}) == {"ok": False, "error": "internal error: kaput"}
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(b"not json\n[1]\n")
            data = b""
            while data.count(b"\n") < 2:
                data += s.recv(4096)
        lines = data.decode().splitlines()
        assert all('"ok": false' in line and "bad request" in line for line in lines)
        with pytest.raises(RuntimeError, match="in use"):
            ControlServer(path, handler).start()
    finally:
        srv.stop()
    # a stale socket file from a crashed speaker is replaced
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()
    srv2 = ControlServer(path, handler)
    srv2.start()
    try:
        assert request(path, {"cmd": "x"})["ok"]
    finally:
        srv2.stop()
