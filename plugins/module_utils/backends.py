# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The data plane's core: the ``Backends`` kind, its checks, Maglev, and the forwarding plan.

Our own kind beside MetalLB's (MetalLB has no field for real servers)::

    apiVersion: nocloud.io/v1alpha1
    kind: Backends
    metadata: {name: web, namespace: prod}     # = the Service it serves
    spec:
      method: nat            # nat | fullnat | dr | tun
      scheduler: maglev      # rr | wrr | sh | maglev
      healthCheck: "tcp://:8080"   # the nocloud.io/health-check forms; host = each server
      servers:
        - {address: 198.51.100.31, port: 8080, weight: 1}
      snatAddress: 198.51.100.9    # fullnat only (default: the director's own address)

Three levels of checks, each where its facts are:

- ``parse_backends_spec`` (inside ``parse_resources``): fields, ranges, the Service exists,
  DR keeps the Service port, one explicit server port cannot serve several Service ports
  (a TCP/UDP pair such as DNS), SCTP is refused.
- ``check_topology(backends, prefixes)`` on a director (the speaker, the role with facts):
  DR and NAT servers must sit on one of the director's segments (DR rewrites only the MAC;
  NAT needs the director as the server's gateway).
- ``check_gateway`` on a real server (the realserver role): under NAT its default route
  must point at a director.

``dataplane_plan(config, healthy)`` turns the config and the healthy servers into rules
(VIP, protocol, port -> targets and a slot table the scheduler indexes); the speaker
renders them as nftables. ``maglev_table`` is Maglev's lookup table (Eisenbud et al.,
NSDI 2016) computed from the server list alone, so every director builds the same one.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .healthcheck import parse_health_check

API_VERSION = "nocloud.io/v1alpha1"
METHODS = ("nat", "fullnat", "dr", "tun")
SCHEDULERS = ("rr", "wrr", "sh", "maglev")
SPEC_FIELDS = frozenset({"method", "scheduler", "healthCheck", "servers", "snatAddress"})
SERVER_FIELDS = frozenset({"address", "port", "weight"})
WEIGHT_MIN, WEIGHT_MAX = 1, 256
# Maglev table sizes: primes just below powers of two. A service takes the smallest one holding
# MAGLEV_SLOTS_PER_WEIGHT slots per unit of its weights (see ``maglev_size``).
MAGLEV_SIZES = (31, 61, 127, 251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521)
MAGLEV_SLOTS_PER_WEIGHT = 20
HASH_SEED = 0x4E4C4450  # "NLDP": every director hashes a flow to the same slot


def _q(text: object) -> str:
    s = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


@dataclass(frozen=True)
class Server:
    address: str
    port: int | None = None  # None: the Service port
    weight: int = 1

    @property
    def version(self) -> int:
        return 6 if ":" in self.address else 4  # a parsed address: only IPv6 has a colon

    def target(self, service_port: int) -> int:
        return self.port or service_port

    def ident(self, service_port: int | None = None) -> str:
        """``address:port`` (``[v6]:port``); the port is the Service port when the server names none."""
        port = self.port or service_port
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{port}" if port else host


@dataclass
class Backends:
    namespace: str
    name: str
    method: str = "nat"
    scheduler: str = "rr"
    servers: list[Server] = field(default_factory=list)
    health_check: dict | None = None  # parse_health_check's dict; host/port None = each server's
    snat_address: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# --------------------------------------------------------------------------- parsing


def _health_check(value: Any) -> dict:
    """The healthCheck of a Backends: a ``nocloud.io/health-check`` form whose host is each server.

    ``tcp://:8080`` or ``{"type": "http", "path": "/healthz"}``: host (and port, when not
    given) come from each server. Naming a host is refused: it would check one machine for all.
    """
    given_host = given_port = None
    if isinstance(value, dict):
        given_host, given_port = value.get("host"), value.get("port")
    elif isinstance(value, str) and "://" in value:
        import urllib.parse  # noqa: PLC0415

        url = urllib.parse.urlsplit(value.strip())
        given_host = url.hostname
        try:
            given_port = url.port
        except ValueError:
            given_port = None
    if given_host:
        raise ValueError(f"host: {_q(given_host)}: the check runs against each server; leave the host out "
                         "(e.g. tcp://:8080 or {\"type\": \"tcp\"})")
    parsed = parse_health_check(value, [(65535, "TCP")])  # placeholder port, replaced per server below
    parsed["host"] = None
    if parsed["type"] != "exec" and given_port is None:
        parsed["port"] = None
    return parsed


def parse_backends_spec(namespace: str, name: str, spec: dict, service: Any,
                        err: Callable[[str, str], None]) -> Backends:
    """Read one Backends spec; report every problem through ``err(field, message)``.

    ``service`` is the schema's Service of the same namespace/name, or None (refused).
    """
    b = Backends(namespace=namespace, name=name)
    if service is None:
        err("metadata.name", f"unknown service {_q(f'{namespace}/{name}')}: a Backends object is named after the "
            "Service it serves (same name and namespace)")
    method = spec.get("method", "nat")
    if method not in METHODS:
        err("spec.method", f"Unsupported value: {_q(method)}: supported values: "
            + ", ".join(_q(m) for m in METHODS))
    else:
        b.method = method
    scheduler = spec.get("scheduler", "rr")
    if scheduler not in SCHEDULERS:
        err("spec.scheduler", f"Unsupported value: {_q(scheduler)}: supported values: "
            + ", ".join(_q(s) for s in SCHEDULERS) + " (rr round robin, wrr weighted, sh source hash, "
            "maglev consistent hash)")
    else:
        b.scheduler = scheduler
    if b.method == "dr" and b.scheduler in ("rr", "wrr"):
        err("spec.scheduler", f"{_q(b.scheduler)} cannot be used with method \"dr\": DR forwards every packet "
            "before conntrack (netdev ingress), so only a per-flow hash keeps a connection on one server; "
            "use \"sh\" or \"maglev\"")
    ports = list(service.ports) if service is not None else []
    for port, proto in ports:
        if proto == "SCTP":
            err(f"spec (Service port {port}/{proto})", "SCTP is not supported by the data plane (TCP and UDP only)")
    servers = spec.get("servers")
    if not isinstance(servers, list) or not servers:
        err("spec.servers", f"must be a non-empty list of {{address, port, weight}}, got {servers!r}")
        servers = []
    seen: dict[tuple[str, int | None], int] = {}
    for i, raw in enumerate(servers):
        path = f"spec.servers[{i}]"
        if not isinstance(raw, dict):
            err(path, f"must be a mapping with address, port, weight, got {raw!r}")
            continue
        bad = sorted(str(k) for k in raw if k not in SERVER_FIELDS)
        for k in bad:
            err(f"{path}.{k}", f"unknown field {_q(k)}")
        ok = True
        try:
            addr = str(ipaddress.ip_address(str(raw.get("address"))))
        except ValueError:
            err(f"{path}.address", f"invalid IP address {_q(raw.get('address'))}")
            ok = False
            addr = ""
        port = raw.get("port")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
            err(f"{path}.port", f"invalid port {port!r}, must be in 1-65535 range")
            ok = False
        weight = raw.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int) or not WEIGHT_MIN <= weight <= WEIGHT_MAX:
            err(f"{path}.weight", f"invalid weight {weight!r}, must be an integer in {WEIGHT_MIN}-{WEIGHT_MAX} "
                "range")
            ok = False
        if port is not None and len(ports) > 1:
            listed = ", ".join(f"{p}/{pr}" for p, pr in ports)
            err(f"{path}.port", f"a server port maps one Service port, but the Service has {len(ports)} ({listed}): "
                "leave the port out so each Service port (TCP and UDP alike) goes to the same port on the server")
            ok = False
        if b.method == "dr" and port is not None and ports and port != ports[0][0]:
            err(f"{path}.port", f"{port} differs from the Service port {ports[0][0]}: DR rewrites only the MAC "
                "address, never the port; leave the port out or use method nat/fullnat")
            ok = False
        if not ok:
            continue
        key = (addr, port)
        if key in seen:
            err(path, f"duplicate server {_q(Server(addr, port).ident())} (also at spec.servers[{seen[key]}])")
            continue
        seen[key] = i
        b.servers.append(Server(addr, port, weight))
    if service is not None and b.servers:
        versions = {s.version for s in b.servers}
        for ip in service.ingress_ips:
            v = ipaddress.ip_address(ip).version
            if v not in versions:
                err("spec.servers", f"no IPv{v} server for the Service's address {ip}: the data plane does not "
                    "translate between IPv4 and IPv6")
    snat = spec.get("snatAddress")
    if snat is not None:
        if b.method != "fullnat":
            err("spec.snatAddress", f"only used with method \"fullnat\", not {_q(b.method)}")
        try:
            b.snat_address = str(ipaddress.ip_address(str(snat)))
        except ValueError:
            err("spec.snatAddress", f"invalid IP address {_q(snat)}")
    hc = spec.get("healthCheck")
    if hc not in (None, ""):
        try:
            b.health_check = _health_check(hc)
        except ValueError as exc:
            err("spec.healthCheck", f"invalid health check {_q(hc)}: {exc}")
    return b


# --------------------------------------------------------------------------- facts of a machine


def check_topology(backends: Iterable[Backends], prefixes: Iterable[str]) -> list[str]:
    """Problems a director finds with its own interface prefixes (``198.51.100.11/24`` ...).

    DR needs each server on a segment of the director (only the MAC is rewritten); NAT needs
    the director to be the server's gateway, so the server must sit on one of its segments.
    """
    nets = []
    for p in prefixes:
        try:
            nets.append(ipaddress.ip_interface(p).network)
        except ValueError:
            continue
    shown = ", ".join(str(n) for n in nets) or "none"
    out = []
    for b in backends:
        if b.method not in ("dr", "nat"):
            continue
        for s in b.servers:
            ip = ipaddress.ip_address(s.address)
            if any(ip in n for n in nets if n.version == ip.version):
                continue
            if b.method == "dr":
                why = ("DR rewrites only the destination MAC, so the real server must be on the director's "
                       "segment")
            else:
                why = ("NAT needs the director as the real server's gateway, so the real server must be on the "
                       "director's segment (or use method fullnat for routed servers)")
            out.append(f"Backends {_q(b.key)}: server {s.address} is not on any of this node's segments "
                       f"({shown}): {why}")
    return out


def check_gateway(address: str, method: str, gateway: str | None, directors: Iterable[str]) -> str:
    """The realserver role's check: under NAT the server's default gateway must be a director."""
    if method != "nat":
        return ""
    allowed = sorted(set(directors))
    if gateway not in allowed:
        return (f"real server {address}: default gateway {_q(gateway or 'none')} is not a director "
                f"({', '.join(allowed) or 'none given'}): under NAT the replies must return through the "
                "director, or the client sees them from the real server's address and drops them")
    return ""


# --------------------------------------------------------------------------- Maglev


def _h(text: str, salt: str) -> int:
    return int.from_bytes(hashlib.sha256((salt + "#" + text).encode("utf-8")).digest()[:8], "big")


def maglev_size(weights: list[int]) -> int:
    """The Maglev table size of a service with these server weights (all configured servers,
    healthy or not, so a health flip never changes it).

    The weights are reduced by their greatest common divisor (1, 1 and 5, 5 are the same
    split); ``W`` is their sum then. The size is the smallest of ``MAGLEV_SIZES`` at least
    ``MAGLEV_SLOTS_PER_WEIGHT * W`` (the largest when none is). Why this bound:

    - balance: Maglev fills the table in rounds, server i taking ``w_i`` slots per round, so
      a server holds between ``r * w_i`` and ``(r + 1) * w_i`` slots with ``r = size // W >= 20``:
      its share of the flows is within 1/20 (5 %) of its weight's share (10 equal servers,
      251 slots: 25 or 26 slots each, 9.96 % or 10.36 % of the flows);
    - a server going down (health) moves that server's flows and no other, at any size
      (``maglev_with_health``);
    - a server added to or removed from the config keeps the size unless ``W`` crosses a
      step (the steps double), and then moves Maglev's near-minimal share of the flows
      (measured in the tests: under 5 % beyond the removed server's own at 20 slots per weight);
      when ``W`` crosses a step, the size changes and every flow of the service is hashed
      anew (NAT keeps its established connections through conntrack; DR does not).

    A pure function of the configured weights: every director picks the same size.
    """
    if not weights:
        return MAGLEV_SIZES[0]
    want = MAGLEV_SLOTS_PER_WEIGHT * sum(reduced_weights(weights))
    return next((m for m in MAGLEV_SIZES if m >= want), MAGLEV_SIZES[-1])


def reduced_weights(weights: Iterable[int]) -> list[int]:
    """``weights`` divided by their greatest common divisor: 5, 5 -> 1, 1; 2, 4 -> 1, 2 (both the size
    and the turns of a Maglev table follow the split, not its scale)."""
    ws = list(weights)
    g = functools.reduce(math.gcd, ws, 0) or 1
    return [w // g for w in ws]


def maglev_table(names: list[str], weights: list[int] | None = None, size: int | None = None) -> list[int]:
    """Maglev's lookup table (see ``_maglev``) of ``size`` slots (default: ``maglev_size(weights)``);
    memoised, since a director recomputes it for every service on every change and most
    services did not change."""
    ws = tuple(weights or [1] * len(names))
    return list(_maglev(tuple(names), ws, size or maglev_size(list(ws))))


@functools.lru_cache(maxsize=4096)
def _maglev(names: tuple[str, ...], weights: tuple[int, ...], size: int) -> tuple[int, ...]:
    """Maglev's lookup table: ``size`` slots, each the index of one of ``names``.

    Each name gets a permutation of the slots (offset and skip from two hashes of the name,
    so the table depends only on the names, never on their order or on who computes it);
    names take turns claiming their next free preferred slot, ``weight`` turns per round
    (the weights reduced by their greatest common divisor first).
    ``size`` must be prime and larger than the number of names. [] when no names.
    """
    if not names:
        return ()
    turns = reduced_weights(weights)
    order = sorted(range(len(names)), key=lambda i: names[i])  # independent of list order
    offset = {i: _h(names[i], "offset") % size for i in order}
    skip = {i: _h(names[i], "skip") % (size - 1) + 1 for i in order}
    nxt = dict.fromkeys(order, 0)
    table = [-1] * size
    filled = 0
    while True:
        for i in order:
            for _turn in range(turns[i]):
                while True:
                    c = (offset[i] + nxt[i] * skip[i]) % size
                    nxt[i] += 1
                    if table[c] < 0:
                        break
                table[c] = i
                filled += 1
                if filled == size:
                    return tuple(table)
    return tuple(table)  # not reached: the loop fills every slot


def maglev_with_health(names: list[str], weights: list[int], healthy: list[bool],
                       size: int | None = None) -> list[int]:
    """A table where a failed server's slots, and only those, move to the healthy ones.

    The table of every configured server decides each slot; a slot whose server is down
    takes its entry from the table of the healthy servers (of the same size: the size
    follows the configured weights, ``maglev_size``, never health). So one failure moves
    only that server's flows (and its recovery moves them back), and every director with
    the same view of health computes the same table. [] when nothing is healthy.
    """
    alive = [i for i, ok in enumerate(healthy) if ok]
    if not alive:
        return []
    size = size or maglev_size(weights)
    full = maglev_table(names, weights, size)
    if len(alive) == len(names):
        return full
    sub = maglev_table([names[i] for i in alive], [weights[i] for i in alive], size)
    return [c if healthy[c] else alive[sub[s]] for s, c in enumerate(full)]


# --------------------------------------------------------------------------- the plan


def smooth_wrr(weights: list[int]) -> list[int]:
    """Interleaved weighted round robin (nginx's smooth WRR): one cycle of sum(weights) picks."""
    current = [0] * len(weights)
    total = sum(weights)
    out = []
    for _step in range(total):
        for i, w in enumerate(weights):
            current[i] += w
        best = max(range(len(weights)), key=lambda i: (current[i], -i))
        current[best] -= total
        out.append(best)
    return out


@dataclass(frozen=True)
class Target:
    address: str
    port: int
    weight: int
    healthy: bool
    ident: str  # address:port as health and counters name it


@dataclass
class Rule:
    """One VIP:port of one Service: what the speaker programs."""

    service: str
    vip: str
    protocol: str  # tcp | udp
    port: int
    method: str
    scheduler: str
    selector: str  # numgen | jhash-src | jhash-flow
    targets: list[Target]
    slots: list[int]  # slot -> index into targets (healthy ones only); [] = no healthy server
    snat_address: str | None = None

    @property
    def family(self) -> int:
        return 6 if ":" in self.vip else 4  # a parsed address: only IPv6 has a colon


def server_idents(b: Backends, service: Any) -> list[str]:
    """Every ``address:port`` of ``b`` for every Service port: what health checks key on."""
    out: list[str] = []
    for port, _proto in service.ports if service is not None else []:
        for s in b.servers:
            ident = s.ident(port)
            if ident not in out:
                out.append(ident)
    return out


def slots_for(scheduler: str, weights: list[int], healthy: list[bool], names: list[str]) -> list[int]:
    """The slot table of one rule: indexes of healthy servers, as the scheduler lays them out."""
    alive = [i for i, ok in enumerate(healthy) if ok]
    if not alive:
        return []
    if scheduler == "maglev":
        return maglev_with_health(names, weights, healthy)
    if scheduler == "rr":
        return alive
    if scheduler == "wrr":
        return [alive[j] for j in smooth_wrr([weights[i] for i in alive])]
    # sh: source hash over sum(weights) slots, contiguous per server as LVS's sh does
    return [i for i in alive for _copy in range(weights[i])]


class PlanMemo:
    """What ``dataplane_plan`` keeps between calls on the same config object (a speed-up only:
    the rules are the same with or without it).

    Per Backends: the health keys it depends on, the health it last saw, and the rules it
    planned then. A service whose servers' health did not change costs a few set lookups and
    yields the very same ``Rule`` objects, which ``nft.render`` recognises without comparing
    them (1,000 services: a health flip of one server replans one service, not 1,000).
    Rules are not to be modified once planned.
    """

    def __init__(self) -> None:
        self.config: Any = None
        self.entries: dict[str, tuple[list[str], tuple[bool, ...] | None, list[Rule]]] = {}


def dataplane_plan(config: Any, healthy: set[str] | None = None, memo: PlanMemo | None = None) -> list[Rule]:
    """Rules for every Service with Backends and an address: one per VIP x port.

    ``healthy`` holds ``service key + " " + address:port`` of servers that pass their check;
    None means every server is healthy (no checks). Servers of another IP family than the VIP
    are left out. Pure: the same config and health give the same rules on every director.
    ``memo``: kept by the caller between calls, so unchanged services are not planned again.
    """
    if memo is not None and memo.config is not config:
        memo.config, memo.entries = config, {}
    rules: list[Rule] = []
    services: dict[str, Any] = {}
    for s in config.services:
        services.setdefault(s.key, s)  # config.service(key)'s answer (the first), without a scan per Backends
    for b in getattr(config, "backends", {}).values():
        svc = services.get(b.key)
        if svc is None or b.method == "tun":
            continue
        if memo is None:
            rules += _plan_service(b, svc, healthy)
            continue
        entry = memo.entries.get(b.key)
        keys = entry[0] if entry is not None else [f"{b.key} {i}" for i in server_idents(b, svc)]
        seen = None if healthy is None else tuple(k in healthy for k in keys)
        if entry is None or entry[1] != seen:
            entry = memo.entries[b.key] = (keys, seen, _plan_service(b, svc, healthy))
        rules += entry[2]
    return rules


def _plan_service(b: Backends, svc: Any, healthy: set[str] | None) -> list[Rule]:
    rules = []
    selector = {"rr": "numgen", "wrr": "numgen", "sh": "jhash-src", "maglev": "jhash-flow"}[b.scheduler]
    for vip in svc.ingress_ips:
        version = 6 if ":" in vip else 4
        servers = [s for s in b.servers if s.version == version]
        for port, proto in svc.ports:
            if proto not in ("TCP", "UDP"):
                continue
            targets = []
            for s in servers:
                ident = s.ident(port)
                ok = healthy is None or f"{b.key} {ident}" in healthy
                targets.append(Target(s.address, s.target(port), s.weight, ok, ident))
            slots = slots_for(b.scheduler, [t.weight for t in targets], [t.healthy for t in targets],
                              [t.ident for t in targets])
            rules.append(Rule(b.key, vip, proto.lower(), port, b.method, b.scheduler, selector, targets, slots,
                              b.snat_address))
    return rules


def slot_ranges(slots: list[int]) -> list[tuple[int, int, int]]:
    """``slots`` as runs ``(first, last, target)``: the intervals an nftables vmap takes."""
    out: list[tuple[int, int, int]] = []
    for s, t in enumerate(slots):
        if out and out[-1][2] == t and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s, t)
        else:
            out.append((s, s, t))
    return out
