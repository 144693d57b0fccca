"""The data plane mode: forward each VIP:port to its real servers with nftables (see nft.py).

``apply`` (decision thread) only records what to program and wakes the worker; the worker
checks the backends, plans (``nocloudlb.core.backends.dataplane_plan``), renders, and programs
through ``program.Programmer``: one ``nft -f`` transaction per try, so a failure leaves the last
good tables in place; a plan counts as programmed only once nft accepted it, and a failed try
is retried with the ``nft`` back-off (``nocloudlb.backoff``) until nft works again. Every node an
advertisement selects for a VIP's pool is programmed, not only the VIP's leader, so a takeover
needs no reprogramming.

Backends are checked by a HealthChecker of their own (keys ``ns/name address:port``), with
the Backends' healthCheck (the ``nocloud.io/health-check`` forms with rise/fall; host = the
server, port = the check's or the server's). Without a healthCheck a server counts healthy.

Refused here, with the reason in ``status()["services"][key]["refused"]`` and one log event:
servers off this node's segments for DR and NAT (``check_topology``), ``tun`` (this kernel has
no IPIP), and a service whose own rules nft refuses (found by ``Programmer``; it keeps its last
good rules). A refused service is not forwarded as configured; the others are.

IP forwarding (NAT, full-NAT) is kept on by ``forwarding.Forwarding``, read every second.

``withdraw_all`` keeps the rules: the data plane announces nothing, and keeping them keeps
the flows conntrack still tracks when traffic arrives here. ``close`` deletes both tables.

A restart keeps forwarding (issue 21, point 5). ``start`` only checks that nft works (``nft -c``):
the tables a crashed or killed run left stay in place, and the first programming replaces them in
one transaction; that first programming waits until every backend's check has its first result
(at most ``FIRST_CHECKS_WAIT`` s after the checks began), since before it every checked server counts as down and the
tables would be written without them. In BGP mode the router goes on sending the VIPs to a node
whose speaker restarts (FRR keeps announcing): before, ``start`` deleted the tables and the first
programming wrote them empty, and for 0.1-0.2 s the node's own TCP refused the DR VIP's new
connections (15-22 refused of about 1,300 in 6 s from the client, per ``kill -9`` of a speaker,
molecule scenario ``bgp``).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from nocloudlb.core.backends import PlanMemo, Rule, check_topology, dataplane_plan

from ..backoff import Backoff, backoff_metrics
from ..health import CheckSpec, HealthChecker
from ..logs import event
from . import nft
from .forwarding import Forwarding
from .program import Programmer
from .tool import NftError, NftTool

log = logging.getLogger("nocloudlb.dataplane")


def local_interfaces() -> dict[str, tuple[int, list[str]]]:
    """name -> (ifindex, prefixes) of every interface but lo that holds an address (``ip -j addr``)."""
    proc = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=5, check=True)
    out: dict[str, tuple[int, list[str]]] = {}
    for link in json.loads(proc.stdout or "[]"):
        name = link.get("ifname", "")
        if not name or name == "lo":
            continue
        prefixes = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])
                    if a.get("family") in ("inet", "inet6") and a.get("scope") != "link"]
        if prefixes:
            out[name] = (int(link["ifindex"]), prefixes)
    return out


def backend_checks(parsed: Any) -> dict[str, CheckSpec | None]:
    """``ns/name address:port`` -> the check of that server (None: no check, healthy)."""
    out: dict[str, CheckSpec | None] = {}
    services = {s.key: s for s in parsed.services}  # one pass, not a scan per Backends
    for b in getattr(parsed, "backends", {}).values():
        svc = services.get(b.key)
        if svc is None:
            continue
        for port, _proto in svc.ports:
            for s in b.servers:
                key = f"{b.key} {s.ident(port)}"
                if b.health_check is None:
                    out[key] = None
                    continue
                raw = dict(b.health_check)
                raw["host"] = s.address
                raw["port"] = raw.get("port") or s.target(port)
                if raw["type"] == "exec":
                    raw["command"] = [c.replace("{address}", s.address).replace("{port}", str(s.target(port)))
                                      for c in raw["command"]]
                out[key] = CheckSpec.from_dict(f"Backends {b.key}", raw)
    return out


def eligible_vips(me: str, nodes: list[Any], parsed: Any) -> set[str]:
    """VIPs this node may serve: an L2 or BGP advertisement of the VIP's pool selects it and the service."""
    labels: dict = next((n.labels or {} for n in nodes if n.name == me), {})
    out: set[str] = set()
    services = {s.key: s for s in parsed.services}
    for b in getattr(parsed, "backends", {}).values():
        svc = services.get(b.key)
        if svc is None:
            continue
        for ip in svc.ingress_ips:
            pool = parsed.pool_for_ip(ip)
            if pool is None:
                continue
            ads = list(parsed.l2_advertisements_for_pool(pool.name)) + list(
                parsed.bgp_advertisements_for_pool(pool.name))
            if any(a.selects_service(svc.labels) and a.selects_node(labels) for a in ads):
                out.add(ip)
    return out


FIRST_CHECKS_WAIT = 3.0  # s after start: the first programming waits at most this long for first check results
TICK = 1.0  # the forwarding switches are read this often
PERIOD = 5.0  # a sync without any wake-up this often (interfaces, refused services' retry)


class DataplaneMode:
    name = "dataplane"

    def __init__(self, logger: logging.Logger | None = None, nft_path: str | None = None,
                 interfaces: Any = local_interfaces, registry: Any = REGISTRY,
                 sysctl_root: str = "/proc/sys/net") -> None:
        self.log = logger or log
        self.nft = nft_path or shutil.which("nft") or ""
        self._interfaces = interfaces
        self._registry = registry
        self._collector: Collector | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._want: tuple[str, list[Any], Any] | None = None
        self._rules: list[Rule] = []  # what the tables hold
        self._memo = PlanMemo()  # unchanged services are not planned again
        self._refused: dict[str, str] = {}  # refused before nft (topology, tun)
        self._error = ""
        self._updates = 0
        self._last_seconds = 0.0
        self._checks: dict[str, CheckSpec | None] = {}
        self.tool = NftTool(self.nft, self.log)
        self.backoff = Backoff(tool="nft", base=0.4, factor=2.0, ceiling=1.6)
        self.program = Programmer(self.tool, self.log, self.backoff)
        self.forwarding = Forwarding(self.log, sysctl_root)
        self.health: HealthChecker | None = None
        self.available = False
        self._checks_since = 0.0  # when the health checks were first configured (0: not yet)
        self.waiting_first_checks = False  # the first programming waits for the backends' first results

    # -- Mode interface ------------------------------------------------------------------
    def start(self) -> None:
        if not self.nft:
            raise RuntimeError("dataplane: the nft command (package nftables) is missing")
        self.tool.path = self.nft
        # nft works (raises: start fails closed); what a crashed run left stays until the first programming
        # replaces it in one transaction (program.full): a restart never leaves the VIPs unforwarded meanwhile
        self.tool.check(nft.base_script())
        self._checks_since = 0.0
        self.available = True
        self.health = HealthChecker(self._wake.set, logging.getLogger("nocloudlb.dataplane.health"))
        if self._registry is not None:
            self._collector = _Collector(self)
            self._registry.register(self._collector)
            backoff_metrics(self._registry).add(self.backoff)
        self._thread = threading.Thread(target=self._loop, name="dataplane", daemon=True)
        self._thread.start()

    def apply(self, me: str, nodes: list[Any], parsed: Any) -> None:
        with self._lock:
            self._want = (me, list(nodes), parsed)
        self._wake.set()

    def withdraw_all(self) -> None:
        """Nothing to withdraw: forwarding announces nothing (see the module docstring)."""

    def status(self) -> dict[str, Any]:
        counters = self.counters()
        with self._lock:
            services: dict[str, dict[str, Any]] = {}
            for r in self._rules:
                svc = services.setdefault(r.service, {"method": r.method, "scheduler": r.scheduler, "rules": []})
                backends = []
                for i, t in enumerate(r.targets):
                    c = counters.get(nft.target_id(r, t.ident), {})
                    backends.append({"backend": t.ident, "weight": t.weight, "healthy": t.healthy,
                                     "inTable": i in r.slots, "packets": c.get("packets", 0),
                                     "bytes": c.get("bytes", 0)})
                svc["rules"].append({"vip": r.vip, "protocol": r.protocol, "port": r.port,
                                     "slots": len(r.slots), "backends": backends})
            for key, why in self.refused().items():
                services.setdefault(key, {})["refused"] = why
            return {"available": self.available, "error": self._error, "updates": self._updates,
                    "lastUpdateSeconds": round(self._last_seconds, 4), "services": services,
                    "waitingFirstChecks": self.waiting_first_checks,
                    **self.program.status(),
                    "nft": {"runs": self.tool.runs, "unexpectedOutput": self.tool.unexpected},
                    "forwarding": self.forwarding.status(),
                    "health": self.health.status() if self.health else {}}

    def forwarded_vips(self) -> set[str]:
        """The VIPs the tables forward now (connection sync commits the synced state on their takeover)."""
        with self._lock:
            return {r.vip for r in self._rules}

    def refused(self) -> dict[str, str]:
        """service -> why it is not forwarded as configured (topology, tun, or nft refusing its rules)."""
        out = dict(self._refused)
        for key, h in list(self.program.held.items()):
            out.setdefault(key, f"nft refuses its rules: {h.reason}")
        return out

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self.health is not None:
            self.health.stop()
        if self._collector is not None and self._registry is not None:
            try:
                self._registry.unregister(self._collector)
            except KeyError:
                pass
        if self.available:
            self.available = False
            try:
                self.tool.apply(f"delete table inet {nft.TABLE}\ndelete table netdev {nft.DR_TABLE}\n")
            except NftError as exc:
                event(self.log, "dataplaneFailed", f"cannot delete the tables: {exc}", logging.WARNING)

    # -- the worker ----------------------------------------------------------------------
    def _pause(self, quiet_until: float) -> float:
        now = time.monotonic()
        if now < quiet_until:
            return min(TICK, max(0.01, quiet_until - now))
        if self.backoff.backing_off:
            return min(TICK, max(0.01, self.backoff.remaining()))
        return TICK

    def _loop(self) -> None:
        due, last, quiet_until = False, -PERIOD, 0.0
        while not self._stop:
            woke = self._wake.wait(timeout=self._pause(quiet_until))
            self._wake.clear()
            if self._stop:
                return
            self.forwarding.check()
            now = time.monotonic()
            due = due or woke or self.backoff.backing_off or self.waiting_first_checks or now - last >= PERIOD
            if not due or not self.backoff.ready() or now < quiet_until:
                continue
            due, last = False, now
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - one failure never stops the worker
                self._error = str(exc)
                event(self.log, "dataplaneFailed", str(exc), logging.ERROR)
                quiet_until = time.monotonic() + PERIOD  # not ip/nft in a loop: the next try in PERIOD

    def sync(self) -> bool:
        """Program what the last ``apply`` asked for; True when nft applied a change."""
        with self._lock:
            want = self._want
        if want is None or self.health is None:
            return False
        me, nodes, parsed = want
        checks = backend_checks(parsed)
        if checks != self._checks or not self._checks_since:
            self.health.configure(checks)
            self._checks = checks
            # the first results are waited for from the moment the checks exist, not from start(): the
            # first apply can come seconds after it (membership, a slow start under load)
            self._checks_since = self._checks_since or time.monotonic()
        if self.program.rendered is None and not self._first_results(checks):
            self.waiting_first_checks = True  # the tables keep what they hold (a crashed run's rules)
            return False
        self.waiting_first_checks = False
        ifaces = self._interfaces()
        refused = refusals(parsed, ifaces)
        for key, why in refused.items():
            if self._refused.get(key) != why:
                event(self.log, "backendsRefused", why, logging.ERROR, service=key)
        vips = eligible_vips(me, nodes, parsed)
        rules = [r for r in dataplane_plan(parsed, self.health.healthy(), self._memo)
                 if r.vip in vips and r.service not in refused]
        self.forwarding.need = {r.family for r in rules if r.method in ("nat", "fullnat")}
        self.forwarding.check(sweep=True)
        t0 = time.monotonic()
        ran = self.program.program(rules, ifaces)
        with self._lock:
            self._refused = refused
            self._rules = list(self.program.rules)
            self._error = self.program.error
        if ran:
            self._last_seconds = time.monotonic() - t0
            self._updates += 1
            event(self.log, "dataplaneUpdated", rules=len(self._rules), seconds=round(self._last_seconds, 4),
                  healthy=len([t for r in self._rules for t in r.targets if t.healthy]))
        return ran

    def _first_results(self, checks: dict[str, CheckSpec | None]) -> bool:
        """True once every checked backend has its first result, or FIRST_CHECKS_WAIT s after the checks began."""
        if self.health is None or time.monotonic() - self._checks_since >= FIRST_CHECKS_WAIT:
            return True
        states = self.health.status()
        return all(key in states and (states[key]["passes"] or states[key]["failures"])
                   for key, spec in checks.items() if spec is not None)

    def counters(self) -> dict[str, dict[str, int]]:
        """Counter name -> {packets, bytes}, read now from both tables ({} when unavailable)."""
        if not self.available:
            return {}
        out: dict[str, dict[str, int]] = {}
        for fam, table in (("inet", nft.TABLE), ("netdev", nft.DR_TABLE)):
            out.update(self.tool.counters(fam, table))
        return out


def refusals(parsed: Any, ifaces: dict[str, tuple[int, list[str]]]) -> dict[str, str]:
    """Services refused before nft: ``tun``, and DR/NAT servers off this node's segments."""
    refused: dict[str, str] = {}
    for b in getattr(parsed, "backends", {}).values():
        if b.method == "tun":
            refused[b.key] = ("method tun needs IP-in-IP (the ipip kernel module), which this data plane does "
                              "not program: use dr, nat or fullnat")
    prefixes = [p for _i, ps in ifaces.values() for p in ps]
    for problem in check_topology(getattr(parsed, "backends", {}).values(), prefixes):
        key = problem.split('"', 2)[1]
        refused.setdefault(key, problem)
    return refused


class _Collector(Collector):
    """``nocloudlb_dataplane_backend_{packets,bytes}_total`` and ``..._backend_healthy`` per backend;
    ``nocloudlb_dataplane_programmed_bool`` (the tables hold the plan), ``..._services_refused``,
    ``..._nft_unexpected_output_total``, ``..._forwarding_reasserted_total{ip_version}``. The back-off
    of nft is ``nocloudlb_backoff_*{tool="nft"}`` (nocloudlb.backoff)."""

    def __init__(self, mode: DataplaneMode) -> None:
        self.mode = mode

    def collect(self) -> Iterator[Any]:
        labels = ["service", "vip", "protocol", "port", "backend"]
        packets = CounterMetricFamily("nocloudlb_dataplane_backend_packets",
                                      "Packets sent to a backend (NAT: a flow's first packet, i.e. connections; "
                                      "DR: every packet)", labels=labels)
        octets = CounterMetricFamily("nocloudlb_dataplane_backend_bytes", "Bytes counted with the packets",
                                     labels=labels)
        healthy = GaugeMetricFamily("nocloudlb_dataplane_backend_healthy", "1 when the backend passes its check",
                                    labels=labels)
        counters = self.mode.counters()
        with self.mode._lock:
            rules = list(self.mode._rules)
        for r in rules:
            for t in r.targets:
                lv = [r.service, r.vip, r.protocol, str(r.port), t.ident]
                c = counters.get(nft.target_id(r, t.ident), {})
                packets.add_metric(lv, c.get("packets", 0))
                octets.add_metric(lv, c.get("bytes", 0))
                healthy.add_metric(lv, 1 if t.healthy else 0)
        yield packets
        yield octets
        yield healthy
        yield from self._state()

    def _state(self) -> Iterator[Any]:
        mode = self.mode
        programmed = 1 if mode.program.status()["programmed"] else 0
        yield GaugeMetricFamily("nocloudlb_dataplane_programmed_bool", "1 when the tables hold the plan (0: nft "
                                "failing, the last good tables in place)", value=programmed)
        yield GaugeMetricFamily("nocloudlb_dataplane_services_refused", "Services with Backends not forwarded as "
                                "configured (topology, tun, nft refusing their rules)", value=len(mode.refused()))
        yield CounterMetricFamily("nocloudlb_dataplane_nft_unexpected_output", "nft runs that printed what nft does "
                                  "not print (ignored: the exit status decides)", value=mode.tool.unexpected)
        again = CounterMetricFamily("nocloudlb_dataplane_forwarding_reasserted", "IP forwarding found off (turned "
                                    "off by someone else) and turned on again", labels=["ip_version"])
        for v in (4, 6):
            again.add_metric([str(v)], mode.forwarding.reasserted[v])
        yield again
