"""Control socket: a Unix stream socket, one JSON request per line, one JSON response per line.

Requests: ``{"cmd": "status"}``, ``{"cmd": "label", "set": {...}}`` / ``{"cmd": "label", "unset": [...]}``,
``{"cmd": "reload"}``, ``{"cmd": "keys"}``. Errors answer ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import stat
import threading
from collections.abc import Callable
from pathlib import Path

Handler = Callable[[dict], dict]
MAX_LINE = 1 << 20


class ControlServer:
    def __init__(self, path: str, handler: Handler, logger: logging.Logger | None = None, mode: int = 0o660) -> None:
        self.path = path
        self.handler = handler
        self.log = logger or logging.getLogger("nocloudlb.control")
        self.mode = mode
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        p = Path(self.path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() or p.is_symlink():
            if not stat.S_ISSOCK(p.lstat().st_mode):
                raise RuntimeError(f"socket: {self.path} exists and is not a socket")
            if _in_use(self.path):
                raise RuntimeError(f"socket: {self.path} is in use: is another speaker running?")
            p.unlink()
        outer = self

        class _Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while True:
                    line = self.rfile.readline(MAX_LINE)
                    if not line:
                        return
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        req = json.loads(line)
                        if not isinstance(req, dict):
                            raise ValueError("a request is a JSON object")
                        resp = outer.handler(req)
                    except ValueError as exc:
                        resp = {"ok": False, "error": f"bad request: {exc}"}
                    except Exception as exc:  # report, never kill the server
                        outer.log.exception("control request failed")
                        resp = {"ok": False, "error": f"internal error: {exc}"}
                    try:
                        self.wfile.write(json.dumps(resp, default=str).encode() + b"\n")
                        self.wfile.flush()
                    except OSError:
                        return

        class _Server(socketserver.ThreadingUnixStreamServer):
            daemon_threads = True

        old = os.umask(0o117)
        try:
            self._server = _Server(self.path, _Handler)
        finally:
            os.umask(old)
        os.chmod(self.path, self.mode)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _in_use(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(path)
        except OSError:
            return False
    return True
