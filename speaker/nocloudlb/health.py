"""Local-policy health checks: the node's own stand-in for "has a ready endpoint".

A Service with ``externalTrafficPolicy: Local`` may carry a health check (parsed by the core,
``Service.health_check``). The annotation
``nocloud.io/health-check`` takes ``tcp://HOST:PORT``, ``http(s)://HOST:PORT/PATH`` (a 2xx or
3xx answer passes; redirects are not followed), ``exec:COMMAND ARGS`` (exit status 0 passes)
or a JSON object with those fields; see ``nocloudlb.core.schema.parse_health_check``.

Every check has ``interval`` (s, default 2), ``timeout`` (s, default 1), ``rise`` (consecutive
passes to become healthy, default 2) and ``fall`` (consecutive failures to become unhealthy,
default 3). The first result decides at once, so a node does not wait rise*interval at
start. A Local-policy service without a check counts as healthy on every node.
"""

from __future__ import annotations

import heapq
import logging
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .logs import event

DEFAULTS = {"interval": 2.0, "timeout": 1.0, "rise": 2, "fall": 3}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:  # a 3xx is an answer, not a hop
        return None


@dataclass
class CheckSpec:
    """One parsed check, from the dict ``nocloudlb.core.schema.parse_health_check`` returns."""

    kind: str  # tcp | http | https | exec
    interval: float = 2.0
    timeout: float = 1.0
    rise: int = 2
    fall: int = 3
    host: str = "127.0.0.1"
    port: int | None = None
    path: str = "/"
    command: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, where: str, raw: dict[str, Any]) -> CheckSpec:
        kind = str(raw.get("type") or "")
        if kind not in ("tcp", "http", "https", "exec"):
            raise ValueError(f"{where}: health check type {kind!r} is not one of tcp, http, https, exec")
        spec = cls(kind=kind, interval=float(raw.get("interval") or DEFAULTS["interval"]),
                   timeout=float(raw.get("timeout") or DEFAULTS["timeout"]),
                   rise=int(raw.get("rise") or DEFAULTS["rise"]), fall=int(raw.get("fall") or DEFAULTS["fall"]),
                   host=str(raw.get("host") or "127.0.0.1"), port=raw.get("port"), path=str(raw.get("path") or "/"),
                   command=tuple(raw.get("command") or ()))
        if kind != "exec" and spec.port is None:
            raise ValueError(f"{where}: a {kind} health check needs a port")
        if kind == "exec" and not spec.command:
            raise ValueError(f"{where}: an exec health check needs a command")
        return spec

    def run_once(self) -> tuple[bool, str]:
        """One check: (passed, why not)."""
        try:
            if self.kind == "tcp":
                with socket.create_connection((self.host, self.port), timeout=self.timeout):
                    return True, ""
            if self.kind in ("http", "https"):
                url = f"{self.kind}://{_hostport(self.host, self.port)}{self.path}"
                handlers: list[Any] = [_NoRedirect()]
                if self.kind == "https":  # a local backend's certificate is rarely one for 127.0.0.1
                    handlers.append(urllib.request.HTTPSHandler(context=ssl._create_unverified_context()))
                opener = urllib.request.build_opener(*handlers)
                try:
                    with opener.open(urllib.request.Request(url, method="GET"), timeout=self.timeout) as resp:
                        code = resp.status
                except urllib.error.HTTPError as exc:
                    code = exc.code
                ok = 200 <= code < 400
                return ok, "" if ok else f"HTTP status {code} from {url}"
            proc = subprocess.run(list(self.command), capture_output=True, timeout=self.timeout, check=False)
            return proc.returncode == 0, "" if proc.returncode == 0 else f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            return False, f"timed out after {self.timeout:g}s"
        except (OSError, urllib.error.URLError, ValueError) as exc:
            return False, str(getattr(exc, "reason", None) or exc)


def _hostport(host: str, port: int | None) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"{h}:{port}" if port else h


@dataclass
class CheckState:
    service: str
    spec: CheckSpec
    healthy: bool | None = None  # None until the first result
    passes: int = 0
    failures: int = 0
    last_error: str = ""
    last_run: float = 0.0
    running: bool = False


class HealthChecker:
    """Runs every Local-policy service's check on its interval; calls ``on_change`` on a flip."""

    def __init__(self, on_change: Callable[[], None], logger: logging.Logger | None = None,
                 workers: int = 8) -> None:
        self.on_change = on_change
        self.log = logger or logging.getLogger("nocloudlb.health")
        self._checks: dict[str, CheckState] = {}
        self._always: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[tuple[float, str, int]] = []
        self._gen = 0
        self._stop = False
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="health")
        self._thread = threading.Thread(target=self._loop, name="health", daemon=True)
        self._thread.start()

    def configure(self, checks: dict[str, CheckSpec | None]) -> None:
        """Set the Local-policy services: key -> spec, or None for a service without a check."""
        with self._lock:
            self._gen += 1
            old = self._checks
            self._checks = {}
            self._always = {k for k, s in checks.items() if s is None}
            self._heap = []
            now = time.monotonic()
            for key, spec in checks.items():
                if spec is None:
                    continue
                prev = old.get(key)
                st = CheckState(key, spec)
                if prev is not None and prev.spec == spec:
                    st.healthy, st.passes, st.failures, st.last_error = (prev.healthy, prev.passes, prev.failures,
                                                                         prev.last_error)
                self._checks[key] = st
                heapq.heappush(self._heap, (now, key, self._gen))
            self._wake.notify()

    def healthy(self) -> set[str]:
        with self._lock:
            return set(self._always) | {k for k, s in self._checks.items() if s.healthy}

    def status(self) -> dict[str, dict]:
        with self._lock:
            out: dict[str, dict[str, Any]] = {k: {"healthy": True, "check": None} for k in self._always}
            for k, s in self._checks.items():
                out[k] = {"healthy": bool(s.healthy), "check": s.spec.kind, "error": s.last_error,
                          "passes": s.passes, "failures": s.failures}
            return out

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stop and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._wake.wait(wait)
                if self._stop:
                    return
                due, key, gen = heapq.heappop(self._heap)
                st = self._checks.get(key)
                if gen != self._gen or st is None:
                    continue
                heapq.heappush(self._heap, (max(due + st.spec.interval, time.monotonic()), key, gen))
                if st.running:
                    continue
                st.running = True
            try:
                self._pool.submit(self._run, st, gen)
            except RuntimeError:
                return

    def _run(self, st: CheckState, gen: int) -> None:
        ok, err = st.spec.run_once()
        flipped = False
        with self._lock:
            st.running = False
            st.last_run = time.monotonic()
            if gen != self._gen:
                return
            if ok:
                st.passes, st.failures = st.passes + 1, 0
                if st.healthy is None or (not st.healthy and st.passes >= st.spec.rise):
                    flipped = st.healthy is not True
                    st.healthy = True
            else:
                st.failures, st.passes = st.failures + 1, 0
                st.last_error = err
                if st.healthy is None or (st.healthy and st.failures >= st.spec.fall):
                    flipped = st.healthy is not False
                    st.healthy = False
        if flipped:
            event(self.log, "healthChanged", level=logging.INFO if ok else logging.WARNING,
                  service=st.service, healthy=ok, check=st.spec.kind, error=err)
            self.on_change()
