"""Control socket: a Unix stream socket, one JSON request per line, one JSON response per line.

Requests: ``{"cmd": "status"}``, ``{"cmd": "label", "set": {...}}`` / ``{"cmd": "label", "unset": [...]}``,
``{"cmd": "reload"}``, ``{"cmd": "keys"}``. Errors answer ``{"ok": false, "error": "..."}``.

Bounds (issue 8, defect 16): at most MAX_CONNECTIONS connections are served at once (one more is
answered ``busy`` and closed, so a flood costs no thread per socket); a connection that sends
nothing for READ_TIMEOUT seconds is closed; a request line is at most MAX_LINE bytes (a longer one
is refused and the connection closed); JSON nested too deeply is a bad request, never a crash.

Who may connect is decided by the socket's mode (0660) and group: the daemon's group, which is not
the group that may read the gossip key (the speaker role gives the key file a group of its own).
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
MAX_CONNECTIONS = 16
READ_TIMEOUT = 10.0  # seconds of silence before a connection is closed
MAX_ERROR = 300  # characters of a request's error echoed back


class ControlServer:
    def __init__(self, path: str, handler: Handler, logger: logging.Logger | None = None, mode: int = 0o660,
                 max_connections: int = MAX_CONNECTIONS, read_timeout: float = READ_TIMEOUT) -> None:
        self.path = path
        self.slots = threading.BoundedSemaphore(max_connections)
        self.read_timeout = read_timeout
        self.refused = 0  # connections turned away because every slot was taken
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
            timeout = outer.read_timeout  # socket timeout: a silent client is dropped, never waited for

            def _send(self, resp: dict) -> bool:
                try:
                    self.wfile.write(json.dumps(resp, default=str).encode() + b"\n")
                    self.wfile.flush()
                    return True
                except (OSError, ValueError):
                    return False

            def handle(self) -> None:
                while True:
                    try:
                        line = self.rfile.readline(MAX_LINE + 1)
                    except (OSError, ValueError):  # timeout, reset
                        return
                    if not line:
                        return
                    if len(line) > MAX_LINE:
                        self._send({"ok": False, "error": f"bad request: longer than {MAX_LINE} bytes"})
                        return
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        req = json.loads(line)
                        if not isinstance(req, dict):
                            raise ValueError("a request is a JSON object")
                        resp = outer.handler(req)
                    except RecursionError:
                        resp = {"ok": False, "error": "bad request: nested too deeply"}
                    except ValueError as exc:
                        resp = {"ok": False, "error": f"bad request: {str(exc)[:MAX_ERROR]}"}
                    except Exception as exc:  # report, never kill the server
                        outer.log.exception("control request failed")
                        resp = {"ok": False, "error": f"internal error: {str(exc)[:MAX_ERROR]}"}
                    if not self._send(resp):
                        return

        class _Server(socketserver.ThreadingUnixStreamServer):
            daemon_threads = True
            request_queue_size = 32

            def process_request(self, request, client_address):
                if not outer.slots.acquire(blocking=False):
                    outer.refused += 1
                    try:
                        request.settimeout(0.2)
                        request.sendall(b'{"ok": false, "error": "busy: too many control connections"}\n')
                    except OSError:
                        pass
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    outer.slots.release()
                    raise

            def process_request_thread(self, request, client_address):
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    outer.slots.release()

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
