"""Connection-state sync for the data plane: conntrackd's synced state committed on a takeover.

conntrackd (conntrack-tools) runs beside the speaker on every data-plane node, in FTFW mode over a
link of its own, and keeps in its external cache the conntrack entries its peer forwards (the role
deploys it: roles/speaker, ``nocloudlb_conntrackd_*``). NAT and full-NAT flows live in conntrack, so a
node that takes a VIP over without them sends a mid-stream packet through the scheduler again (round
robin: to another real server, which resets it). ``ConnSync.commit`` runs ``conntrackd -c`` (commit
the external cache into the kernel table) when layer 2 is about to announce a VIP this node forwards
and did not announce before: l2/mode.py calls its ``before_gain`` hook before
``L2Announcer.set_announced``, which queues the first gratuitous ARP/NA, so the kernel holds the
state before the clients' traffic arrives.

Bounded: the commit waits at most ``commitTimeout`` seconds (default 0.3); past it the client process
is killed by its PID and the takeover goes on without the state (result ``timeout``). A conntrackd
that is down, hangs or answers garbage costs a takeover at most that, never more; and nothing at all
once the health thread below has seen it miss ``SKIP_AFTER`` checks in a row (about 2 s): the commit
is not tried (result ``skipped``), since it could only fail or hang. Only the commit is
on the takeover's path; conntrackd's documented primary steps after it (``-f`` flush, ``-R`` resync,
``-B`` bulk send) are left out: in an active-active cluster the external cache also holds the flows of
the VIPs the peer still leads, which a flush would lose until the peer's next bulk send.

Health: a thread asks ``conntrackd -s network`` every ``POLL`` seconds. The daemon is ``up`` while it
answers; the sync peer is ``up`` while the received packet count grows (FTFW sends an alive message
about every second when idle), ``down`` when it stopped growing for ``PEER_SILENCE`` seconds, and
``unknown`` while the daemon does not answer or was not watched that long. ``status()`` (in the
speaker's status as ``connectionSync``) and the ``nocloudlb_connsync_*`` metrics show it with the
last commit's result and duration.

The conntrackd client reads the control socket's path from a config file: the speaker writes a
minimal one (``General { UNIX { Path ... } }``) in its state directory, so it needs neither read
access to /etc/conntrackd nor the daemon's own config.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..logs import event

log = logging.getLogger("nocloudlb.dataplane")

POLL = 1.0  # s between two ``conntrackd -s network``
PEER_SILENCE = 5.0  # s without a received sync packet: the peer is down
STATS_TIMEOUT = 1.0  # s: a statistics request that takes longer counts as no answer
SKIP_AFTER = 2  # health checks missed in a row after which a takeover does not try the commit
RESULTS = ("ok", "failed", "timeout", "error", "skipped")
_RECV = re.compile(r"^\s*(\d+)\s+Pckts sent\s+(\d+)\s+Pckts recv", re.MULTILINE)


def client_conf(socket_path: str) -> str:
    """The smallest conntrackd config a client needs: where the daemon's control socket is."""
    return f"General {{\n    UNIX {{\n        Path {socket_path}\n    }}\n}}\n"


def received_packets(text: str) -> int | None:
    """The packets received on the sync link from ``conntrackd -s network`` (None: not in the text)."""
    m = _RECV.search(text)
    return int(m.group(2)) if m else None


class ConnSync:
    """See the module docstring. ``settings`` is a ``nocloudlb.core.schema.ConnectionSync``."""

    def __init__(self, settings: Any, state_dir: str, logger: logging.Logger | None = None,
                 registry: Any = REGISTRY) -> None:
        self.settings = settings
        self.log = logger or log
        self.conf = os.path.join(state_dir, "conntrackd-client.conf")
        self._registry = registry
        self._collector: Collector | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last: dict[str, Any] = {}  # the last commit: at, vips, seconds, result, detail
        self.commits = dict.fromkeys(RESULTS, 0)
        self.daemon_up: bool | None = None  # None: not asked yet
        self.daemon_error = ""
        self._recv: int | None = None  # received packets at the last answer
        self._recv_changed = 0.0  # monotonic time the count last grew (0: never seen)
        self._watched_since = 0.0  # monotonic time the daemon answered first, in its current run of answers
        self._misses = 0  # health checks in a row without an answer

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.conf), exist_ok=True)
        tmp = f"{self.conf}.tmp"
        with open(tmp, "w") as f:
            f.write(client_conf(self.settings.socket))
        os.replace(tmp, self.conf)
        if self._registry is not None:
            self._collector = _Collector(self)
            self._registry.register(self._collector)
        self._thread = threading.Thread(target=self._loop, name="connsync", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._collector is not None and self._registry is not None:
            try:
                self._registry.unregister(self._collector)
            except KeyError:
                pass
            self._collector = None

    # -- the takeover's commit -------------------------------------------------------------
    def commit(self, vips: list[str]) -> dict[str, Any]:
        """``conntrackd -c``, waiting at most ``commit_timeout`` s (then the client is killed by its PID).
        Not tried when the daemon missed its last ``SKIP_AFTER`` health checks (result ``skipped``).
        Never raises; returns (and keeps as ``last``) {at, vips, seconds, result, detail}."""
        t0 = time.monotonic()
        result, detail = "ok", ""
        with self._lock:
            misses, error = self._misses, self.daemon_error
        if misses >= SKIP_AFTER:
            return self._record(vips, t0, "skipped", f"conntrackd missed its last {misses} health checks "
                                                     f"({error}): the takeover does not wait for it")
        try:
            proc = subprocess.Popen([self.settings.binary, "-C", self.conf, "-c"], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            result, detail = "error", f"{type(exc).__name__}: {exc}"
        else:
            try:
                out = proc.communicate(timeout=self.settings.commit_timeout)[0]
                if proc.returncode != 0:
                    result = "failed"
                    detail = f"exit {proc.returncode}: {out.decode(errors='replace').strip()[-200:]}"
            except subprocess.TimeoutExpired:
                proc.kill()  # by its PID: this very client, nothing else
                proc.communicate()
                result, detail = "timeout", f"no answer in {self.settings.commit_timeout:g} s: killed"
        return self._record(vips, t0, result, detail)

    def _record(self, vips: list[str], t0: float, result: str, detail: str) -> dict[str, Any]:
        seconds = time.monotonic() - t0
        last = {"at": time.time(), "vips": sorted(vips)[:20], "seconds": round(seconds, 4), "result": result,
                "detail": detail}
        with self._lock:
            self.last = last
            self.commits[result] += 1
        level = logging.INFO if result == "ok" else logging.WARNING
        event(self.log, "connSyncCommitted", detail or "external cache committed", level, result=result,
              seconds=last["seconds"], vips=last["vips"])
        return last

    # -- health ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(POLL)

    def poll(self, now: float | None = None) -> None:
        """Ask the daemon for its network statistics once (the health thread's step)."""
        try:
            proc = subprocess.run([self.settings.binary, "-C", self.conf, "-s", "network"], capture_output=True,
                                  text=True, timeout=STATS_TIMEOUT, stdin=subprocess.DEVNULL, check=False)
            recv = received_packets(proc.stdout) if proc.returncode == 0 else None
            error = "" if recv is not None else (
                f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-200:]}" if proc.returncode
                else "no sync link statistics in its answer")
        except subprocess.TimeoutExpired:
            recv, error = None, f"no answer in {STATS_TIMEOUT:g} s"
        except OSError as exc:
            recv, error = None, f"{type(exc).__name__}: {exc}"
        self.observe(recv, error, time.monotonic() if now is None else now)

    def observe(self, recv: int | None, error: str, now: float) -> None:
        with self._lock:
            if recv is None:
                self._misses += 1
                self.daemon_up, self.daemon_error = False, error
                self._recv, self._recv_changed, self._watched_since = None, 0.0, 0.0
                return
            if not self.daemon_up:
                self._watched_since = now
            self._misses = 0
            self.daemon_up, self.daemon_error = True, ""
            if self._recv is not None and recv > self._recv:
                self._recv_changed = now
            self._recv = recv

    def peer(self, now: float | None = None) -> str:
        """``up``, ``down`` or ``unknown`` (see the module docstring)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self.daemon_up:
                return "unknown"
            if self._recv_changed and now - self._recv_changed < PEER_SILENCE:
                return "up"
            return "down" if now - self._watched_since >= PEER_SILENCE else "unknown"

    def status(self) -> dict[str, Any]:
        peer = self.peer()
        with self._lock:
            return {"enabled": True, "socket": self.settings.socket, "commitTimeout": self.settings.commit_timeout,
                    "daemon": "unknown" if self.daemon_up is None else ("up" if self.daemon_up else "down"),
                    "daemonError": self.daemon_error, "missedChecks": self._misses, "peer": peer,
                    "received": self._recv,
                    "lastCommit": dict(self.last), "commits": dict(self.commits)}


class _Collector(Collector):
    """``nocloudlb_connsync_*``: daemon and peer state, commits by result, the last commit's duration."""

    def __init__(self, sync: ConnSync) -> None:
        self.sync = sync

    def collect(self) -> Iterator[Any]:
        st = self.sync.status()
        yield GaugeMetricFamily("nocloudlb_connsync_daemon_up", "1 while conntrackd answers its control socket",
                                value=1 if st["daemon"] == "up" else 0)
        peer = GaugeMetricFamily("nocloudlb_connsync_peer_state",
                                 "The conntrackd sync peer's state (1 on the current one): up, down or unknown",
                                 labels=["state"])
        for state in ("up", "down", "unknown"):
            peer.add_metric([state], 1 if st["peer"] == state else 0)
        yield peer
        commits = CounterMetricFamily("nocloudlb_connsync_commits", "Commits of conntrackd's external cache "
                                      "before a takeover's first gratuitous ARP/NA, by result", labels=["result"])
        for result in RESULTS:
            commits.add_metric([result], st["commits"][result])
        yield commits
        yield GaugeMetricFamily("nocloudlb_connsync_last_commit_seconds",
                                "How long the last commit took (the takeover waited that long)",
                                value=st["lastCommit"].get("seconds", 0.0))
        yield GaugeMetricFamily("nocloudlb_connsync_last_commit_ok", "1 if the last commit succeeded",
                                value=1 if st["lastCommit"].get("result") == "ok" else 0)
