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

Hardening (issue 8, defect 10):

- an ``exec`` check runs in its own session (process group) without CAP_NET_ADMIN and
  CAP_NET_RAW (dropped from the ambient and bounding sets in the child, with no_new_privs),
  its output discarded; at its deadline the whole group is killed (SIGKILL), so a check
  that forks a straggler neither hangs nor lingers;
- a result older than ``stale_after`` (2 intervals + timeout + 2 s) counts as unhealthy:
  a check that stopped running (a stuck worker) never freezes health at its last value;
- intervals must be finite and at least MIN_INTERVAL, timeouts at least MIN_TIMEOUT.

Back-off (issue 21, deliver 4: never more than a few runs a second of an external tool, whatever fails):

- a check that *cannot run* (its command does not start: ENOENT, EACCES, ENOEXEC; exit status 126 or 127,
  a shell's "cannot execute" and "not found"; an unexpected error in the checker) counts as a failure
  and backs off on a ``Backoff`` of its own (``health SERVICE``: 0.5-1 s, 1-2 s, ... at most 30 s, with
  jitter), shown as ``backoff`` in its status and exported as ``nocloudlb_backoff_*{tool="health SERVICE"}``;
  its first successful run resets it;
- a check that runs and fails (connection refused, an HTTP 503, exit status 1) is an answer, not an
  error: it keeps its interval, so it turns healthy again ``rise`` intervals after the backend does,
  but runs at most every FAILING_GAP seconds (an interval of 0.1 s answered at once is 2 runs a second);
- ``configure`` keeps the schedule of a check whose spec did not change (a reload does not run it again).
"""

from __future__ import annotations

import ctypes
import heapq
import logging
import math
import os
import signal
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

from .backoff import Backoff, BackoffCollector, backoff_metrics
from .logs import event

DEFAULTS = {"interval": 2.0, "timeout": 1.0, "rise": 2, "fall": 3}
MIN_INTERVAL = 0.1  # seconds; a smaller one is a typo that would burn a core
MAX_INTERVAL = 86400.0
MIN_TIMEOUT = 0.01
FAILING_GAP = 0.5  # seconds: a check that fails runs at most this often, whatever its interval
NOT_RUN_BASE, NOT_RUN_CEILING = 1.0, 30.0  # back-off of a check that cannot run (see the module docstring)
NOT_RUN_STATUS = (126, 127)  # a shell's "cannot execute" and "command not found"
CAP_NET_ADMIN, CAP_NET_RAW = 12, 13
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4

_prctl: Any
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _prctl = None


def drop_privileges() -> None:
    """In an exec check's child, before exec: no ambient capabilities (what a non-root daemon's child
    would inherit), CAP_NET_ADMIN and CAP_NET_RAW out of the bounding set (what a root child would get
    back at exec; needs CAP_SETPCAP, which a non-root daemon lacks and does not need), no_new_privs."""
    if _prctl is None:
        return
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in (CAP_NET_ADMIN, CAP_NET_RAW):
        _prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: the ambient clear covers it
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


class CheckNotRun(Exception):
    """The check could not be carried out (its command does not start), unlike a check that ran and failed."""


def run_exec(command: list[str] | tuple[str, ...], timeout: float) -> tuple[bool, str]:
    """Run ``command`` without network capabilities, in its own process group, killed at ``timeout``.
    Raises CheckNotRun when it cannot start or exits with 126 or 127."""
    try:
        proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                                preexec_fn=drop_privileges)  # noqa: PLW1509 - prctl only, prepared in the parent
    except (OSError, subprocess.SubprocessError) as exc:
        raise CheckNotRun(f"cannot start {command[0]!r}: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        return False, f"timed out after {timeout:g}s (process group killed)"
    finally:
        if proc.returncode is not None:
            try:  # stragglers left in the group by a check that exited
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    if code in NOT_RUN_STATUS:
        raise CheckNotRun(f"exit status {code}: {command[0]!r} or a command it runs cannot be found or run")
    return code == 0, "" if code == 0 else f"exit status {code}"


def _seconds(where: str, name: str, value: Any, default: float, low: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{where}: health check {name} {value!r:.60} must be a number of seconds")
    try:
        v = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{where}: health check {name} {value!r:.60} must be a number of seconds") from None
    if not math.isfinite(v) or not low <= v <= MAX_INTERVAL:
        raise ValueError(f"{where}: health check {name} {v!r} must be a finite number of seconds "
                         f"from {low:g} to {MAX_INTERVAL:g}")
    return v


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
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: a health check is a mapping, got {type(raw).__name__}")
        kind = str(raw.get("type") or "")
        if kind not in ("tcp", "http", "https", "exec"):
            raise ValueError(f"{where}: health check type {kind!r:.40} is not one of tcp, http, https, exec")
        interval = _seconds(where, "interval", raw.get("interval"), DEFAULTS["interval"], MIN_INTERVAL)
        timeout = _seconds(where, "timeout", raw.get("timeout"), DEFAULTS["timeout"], MIN_TIMEOUT)
        counts = {}
        for name in ("rise", "fall"):
            v = raw.get(name)
            v = DEFAULTS[name] if v is None else v
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1000:
                raise ValueError(f"{where}: health check {name} {v!r:.40} must be an integer from 1 to 1000")
            counts[name] = v
        port = raw.get("port")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise ValueError(f"{where}: health check port {port!r:.40} must be in 1-65535")
        command = raw.get("command") or ()
        if not isinstance(command, list | tuple) or not all(isinstance(c, str) for c in command):
            raise ValueError(f"{where}: health check command must be a list of strings")
        spec = cls(kind=kind, interval=interval, timeout=timeout, rise=counts["rise"], fall=counts["fall"],
                   host=str(raw.get("host") or "127.0.0.1"), port=port, path=str(raw.get("path") or "/"),
                   command=tuple(command))
        if kind != "exec" and spec.port is None:
            raise ValueError(f"{where}: a {kind} health check needs a port")
        if kind == "exec" and not spec.command:
            raise ValueError(f"{where}: an exec health check needs a command")
        return spec

    def run_once(self) -> tuple[bool, str]:
        """One check: (passed, why not). Raises CheckNotRun when an exec check cannot run."""
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
            return run_exec(self.command, self.timeout)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {self.timeout:g}s"
        except (OSError, urllib.error.URLError, ValueError, subprocess.SubprocessError) as exc:
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
    started: float = 0.0
    next_due: float = 0.0  # when it is scheduled to run next (kept across configure when the spec is unchanged)
    backoff: Backoff | None = None  # while it cannot run (CheckNotRun)


class HealthChecker:
    """Runs every Local-policy service's check on its interval; calls ``on_change`` on a flip."""

    def __init__(self, on_change: Callable[[], None], logger: logging.Logger | None = None,
                 workers: int = 8, metrics: BackoffCollector | None = None) -> None:
        self.on_change = on_change
        self.metrics = backoff_metrics() if metrics is None else metrics
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
                st = CheckState(key, spec, next_due=now)
                if prev is not None and prev.spec == spec:
                    st.healthy, st.passes, st.failures, st.last_error, st.last_run = (
                        prev.healthy, prev.passes, prev.failures, prev.last_error, prev.last_run)
                    st.backoff, st.next_due = prev.backoff, max(now, prev.next_due)
                if st.backoff is None:
                    st.backoff = self.metrics.add(Backoff(f"health {key}", base=NOT_RUN_BASE,
                                                          ceiling=NOT_RUN_CEILING))
                self._checks[key] = st
                heapq.heappush(self._heap, (st.next_due, key, self._gen))
            for key in set(old) - set(self._checks):
                self.metrics.discard(f"health {key}")
            self._wake.notify()

    @staticmethod
    def stale_after(spec: CheckSpec) -> float:
        """Seconds after which a result no longer counts: two missed runs, the timeout and a margin."""
        return 2 * spec.interval + spec.timeout + 2.0

    def _stale(self, st: CheckState, now: float) -> bool:
        """A result that stopped coming; not for an unhealthy check that backs off (it waits on purpose, and
        its last result, a failure, stands)."""
        waits = not st.healthy and st.backoff is not None and st.backoff.backing_off
        return st.healthy is not None and not waits and now - st.last_run > self.stale_after(st.spec)

    def healthy(self) -> set[str]:
        """Services whose check passes now; a stale result (the check stopped reporting) does not count."""
        now = time.monotonic()
        with self._lock:
            return set(self._always) | {k for k, s in self._checks.items() if s.healthy and not self._stale(s, now)}

    def status(self) -> dict[str, dict]:
        now = time.monotonic()
        with self._lock:
            out: dict[str, dict[str, Any]] = {k: {"healthy": True, "check": None} for k in self._always}
            for k, s in self._checks.items():
                stale = self._stale(s, now)
                out[k] = {"healthy": bool(s.healthy) and not stale, "check": s.spec.kind,
                          "error": "result is stale: the check has not reported for "
                                   f"{now - s.last_run:.1f}s" if stale else s.last_error,
                          "stale": stale, "passes": s.passes, "failures": s.failures,
                          "backoff": s.backoff.state() if s.backoff is not None else {"state": "ok"}}
            return out

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for key in list(self._checks):
            self.metrics.discard(f"health {key}")

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
                if gen != self._gen or st is None or st.running:
                    continue
                st.running, st.started = True, time.monotonic()
                st.next_due = due + st.spec.interval  # rescheduled when it reports (_reschedule)
            try:
                self._pool.submit(self._run, st, gen, due)
            except RuntimeError:
                return

    def _attempt(self, st: CheckState) -> tuple[bool, str, bool]:
        """(passed, why not, could not run)."""
        try:
            ok, err = st.spec.run_once()
            return ok, err, False
        except CheckNotRun as exc:
            return False, str(exc), True
        except Exception as exc:  # noqa: BLE001 - the worker must report, or the check would never run again
            return False, f"the check failed to run: {type(exc).__name__}: {exc}", True

    def _reschedule(self, st: CheckState, gen: int, due: float, ok: bool, not_run: bool) -> None:
        """The next run (under the lock): the interval, no sooner than FAILING_GAP after a failed run's start,
        and no sooner than the back-off's next try while it cannot run."""
        nxt = max(due + st.spec.interval, time.monotonic())
        if not ok:
            nxt = max(nxt, st.started + FAILING_GAP)
        if not_run and st.backoff is not None:
            nxt = max(nxt, st.backoff.next_try)
        st.next_due = nxt
        heapq.heappush(self._heap, (nxt, st.service, gen))
        self._wake.notify()

    def _run(self, st: CheckState, gen: int, due: float) -> None:
        ok, err, not_run = self._attempt(st)
        flipped = new_error = False
        with self._lock:
            st.running = False
            st.last_run = time.monotonic()
            if gen != self._gen:
                return
            if st.backoff is not None:
                if not_run:
                    new_error = err != st.backoff.error or not st.backoff.backing_off
                    st.backoff.failed(err)
                else:
                    st.backoff.succeeded()
            self._reschedule(st, gen, due, ok, not_run)
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
        if new_error and st.backoff is not None:
            event(self.log, "healthCheckBackoff", f"health check of {st.service} cannot run: {err}",
                  level=logging.WARNING, service=st.service, check=st.spec.kind, error=err,
                  failures=st.backoff.failures, nextTrySeconds=round(st.backoff.remaining(), 3))
        if flipped:
            event(self.log, "healthChanged", level=logging.INFO if ok else logging.WARNING,
                  service=st.service, healthy=ok, check=st.spec.kind, error=err)
            self.on_change()
