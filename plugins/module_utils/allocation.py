# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Address allocation: MetalLB's semantics, made deterministic and stable.

``allocate(config, previous)`` gives every LoadBalancer service of our class
its addresses. It follows MetalLB's controller and allocator:

* ``metallb.io/loadBalancerIPs`` (or the deprecated ``spec.loadBalancerIP``,
  never both) asks for exact addresses, ``metallb.io/address-pool`` for a pool,
  ``metallb.io/allow-shared-ip`` lets services with the same key share an
  address when their ports do not overlap and their backends are compatible.
* Pools with ``autoAssign: false`` serve only services that name them (by
  address or by pool). Pools with a ``serviceAllocation`` serve only the
  namespaces and services they select, and come first, by priority.
* ``avoidBuggyIPs`` pools never hand out IPv4 addresses ending in .0 or .255.
* Dual stack follows ``spec.ipFamilyPolicy`` and ``spec.ipFamilies``.
* Services of another ``spec.loadBalancerClass`` are left alone, no error.

Where MetalLB is weak this allocator differs on purpose:

* Deterministic: services are processed in a fixed order and pools are tried
  in a fixed order (pinned pools by priority, then name; then the other pools
  by name), never in map order. The same input gives the same output, whatever
  the order of the documents.
* Stable: ``previous`` (service key -> addresses of the last run, defaulting to
  the service's own ``status.loadBalancer.ingress``) is honoured first. Every
  service keeps its addresses while other services and pools come and go,
  unless its own request, its pool or its sharing rules make that impossible.

Sharing under ``externalTrafficPolicy: Local``: MetalLB lets Local services
share an address only when they select the same pods. Without pods, the
stand-in is the service's own health check (``Service.health_check``): Local
services may share only with Local services whose health check is the same
(two Local services without a health check are compatible with each other);
Cluster services share only with Cluster services.

Order of work, which is what makes the result stable:

1. every service that held addresses keeps those still valid, in key order;
2. dual-stack holders missing a family get it from the same pool;
3. every other service, in order: exact addresses first, then services that
   name a pool, then the rest; by key inside each group.

A service that cannot be served gets MetalLB's
``Failed to allocate IP for "ns/name": <reason>`` and the others still get
theirs.
"""

from __future__ import annotations

import bisect
import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .errors import ConfigError
from .pools import IPAddress, Pool

#: Our loadBalancerClass. Services without a class are ours too.
LOAD_BALANCER_CLASS = "nocloud.io/loadbalancer"

ANNOTATION_LOAD_BALANCER_IPS = "metallb.io/loadBalancerIPs"
ANNOTATION_ADDRESS_POOL = "metallb.io/address-pool"
ANNOTATION_ALLOW_SHARED_IP = "metallb.io/allow-shared-ip"
ANNOTATION_ALLOCATED_FROM_POOL = "metallb.io/ip-allocated-from-pool"
_DEPRECATED_PREFIX = "metallb.universe.tf/"

#: Label every Kubernetes namespace carries; namespaceSelectors may use it.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

_FAMILY = {"IPv4": 4, "IPv6": 6}
_FAMILY_NAME = {4: "IPv4", 6: "IPv6"}


@dataclass
class Assignment:
    """What one service got: ``ips`` (primary family first) from ``pool``, or an ``error``."""

    key: str
    ips: list[str] = field(default_factory=list)
    pool: str | None = None
    error: str | None = None


@dataclass
class AllocationResult:
    """The outcome of one ``allocate`` run.

    ``services``: key -> Assignment for every service of our class, sorted by key.
    ``skipped``: key -> reason, for services that are not ours (other class, not a LoadBalancer).
    ``changes``: ``added`` (key -> ips), ``changed`` (key -> {before, after}), ``removed`` (key -> ips),
    against ``previous``: the effective previous assignments (the ``previous`` argument, else the
    services' ``status.loadBalancer.ingress``), services without addresses left out.
    ``pool_usage``: pool -> {"ipv4"|"ipv6": {"assigned", "available"}} for the pools' families.
    """

    services: dict[str, Assignment]
    skipped: dict[str, str]
    changes: dict[str, dict[str, Any]]
    previous: dict[str, list[str]]
    pool_usage: dict[str, dict[str, dict[str, int]]]

    @cached_property
    def assignments(self) -> dict[str, list[str]]:
        """Key -> addresses, for the services that got some (computed once; treat the result as read-only)."""
        return {key: list(a.ips) for key, a in self.services.items() if a.ips}

    @property
    def failed(self) -> list[str]:
        """The error messages, in key order."""
        return [a.error for a in self.services.values() if a.error]

    @property
    def changed(self) -> bool:
        return any(self.changes[kind] for kind in ("added", "changed", "removed"))


class _Fail(Exception):
    """A reason, in MetalLB's words, why one service gets no address."""


# --------------------------------------------------------------------------- helpers


def _go_quote_list(ips: Iterable[Any]) -> str:
    """Format addresses the way MetalLB's ``%q`` of a slice does: ``["a" "b"]``."""
    return "[" + " ".join(f'"{ip}"' for ip in ips) + "]"


def _buggy(version: int, value: int) -> bool:
    """IPv4 addresses ending in .0 or .255 confuse some CPE firmwares (MetalLB's avoidBuggyIPs)."""
    return version == 4 and (value & 0xFF) in (0, 255)


def _annotation(service: Any, name: str) -> str | None:
    """MetalLB's valueForAnnotation: the metallb.io name wins over the deprecated metallb.universe.tf one."""
    annotations = service.annotations or {}
    value = annotations.get(name)
    if value is None or value == "":
        value = annotations.get(_DEPRECATED_PREFIX + name.split("/", 1)[1])
    return None if value is None or value == "" else str(value)


def _health_key(service: Any) -> str:
    """The backend key of a service, MetalLB's stand-in for its pod selector."""
    if service.traffic_policy != "Local":
        return ""
    check = getattr(service, "health_check", None)
    return "Local:" + json.dumps(check, sort_keys=True, default=str)


@dataclass
class _Request:
    ips: list[IPAddress]
    pool: str | None
    sharing: str
    backend: str
    ports: list[tuple[int, str]]
    policy: str  # SingleStack | PreferDualStack | RequireDualStack
    families: list[int]  # preference order; for SingleStack without ipFamilies: [4, 6] and any will do
    fixed_family: bool  # SingleStack with ipFamilies: only families[0]


def _parse_ips(text: str, field_name: str, value_for_error: str) -> list[IPAddress]:
    out: list[IPAddress] = []
    for part in text.split(","):
        try:
            out.append(ipaddress.ip_address(part.strip()))
        except ValueError:
            raise _Fail(f"invalid {field_name}: {json.dumps(value_for_error)}") from None
    return out


def _request(service: Any) -> _Request:
    annotation = _annotation(service, ANNOTATION_LOAD_BALANCER_IPS)
    spec_ip = (service.spec or {}).get("loadBalancerIP")
    if annotation and spec_ip:
        raise _Fail(f"service can not have both {ANNOTATION_LOAD_BALANCER_IPS} and svc.Spec.LoadBalancerIP")
    ips: list[IPAddress] = []
    if annotation:
        ips = _parse_ips(str(annotation), ANNOTATION_LOAD_BALANCER_IPS, str(annotation))
    elif spec_ip:
        try:
            ips = [ipaddress.ip_address(str(spec_ip).strip())]
        except ValueError:
            raise _Fail(f"invalid spec.loadBalancerIP {json.dumps(str(spec_ip))}") from None
    if len(ips) > 2:
        raise _Fail(f"more than two addresses {_go_quote_list(ips)}")
    if len(ips) == 2 and ips[0].version == ips[1].version:
        raise _Fail(f'"{ips[0]}" "{ips[1]}" has the same family')

    policy = service.ip_family_policy or "SingleStack"
    if policy not in ("SingleStack", "PreferDualStack", "RequireDualStack"):
        raise _Fail(f"invalid spec.ipFamilyPolicy {json.dumps(policy)}")
    declared: list[int] = []
    for name in service.ip_families or []:
        if name not in _FAMILY:
            raise _Fail(f"invalid spec.ipFamilies entry {json.dumps(name)}")
        if _FAMILY[name] not in declared:
            declared.append(_FAMILY[name])
    families = declared + [v for v in (4, 6) if v not in declared]
    if policy == "PreferDualStack" and len(declared) == 1:
        # MetalLB reads the service's family from spec.ipFamilies: one family declared is that family only
        policy = "SingleStack"
    fixed = policy == "SingleStack" and bool(declared)

    if ips:
        mismatch = (
            (policy == "SingleStack" and len(ips) == 2)
            or (policy == "RequireDualStack" and len(ips) != 2)
            or (fixed and ips[0].version != families[0])
        )
        if mismatch:
            raise _Fail(
                f"requested loadBalancer IP(s) {_go_quote_list(ips)} does not match the ipFamily of the service"
            )
        ips.sort(key=lambda ip: families.index(ip.version))

    pool = getattr(service, "requested_pool", None)
    if pool is None:
        pool = _annotation(service, ANNOTATION_ADDRESS_POOL)
    sharing = getattr(service, "sharing_key", None)
    if sharing is None:
        sharing = _annotation(service, ANNOTATION_ALLOW_SHARED_IP)
    ports = sorted({(int(port), str(proto)) for port, proto in service.ports})
    return _Request(
        ips=ips,
        pool=pool or None,
        sharing=sharing or "",
        backend=_health_key(service),
        ports=ports,
        policy=policy,
        families=families,
        fixed_family=fixed,
    )


def unmanaged_reason(service: Any) -> str | None:
    """None when the service is ours to serve, else why it is left alone (not a LoadBalancer, another class)."""
    spec = service.spec or {}
    kind = spec.get("type", "ClusterIP")
    if kind != "LoadBalancer":
        return f"spec.type is {kind!r}, not 'LoadBalancer'"
    cls = service.load_balancer_class
    if cls not in (None, "", LOAD_BALANCER_CLASS):
        return f"spec.loadBalancerClass is {cls!r}, not {LOAD_BALANCER_CLASS!r}"
    return None


def is_managed(service: Any) -> bool:
    """True when the service is a LoadBalancer of our class (or of no class): the speakers announce only these."""
    return unmanaged_reason(service) is None


def normalize_previous(previous: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """Check and canonicalise ``previous`` (key -> list of addresses, or one address as a string)."""
    errors: list[str] = []
    out: dict[str, list[str]] = {}
    for key, value in (previous or {}).items():
        items = [value] if isinstance(value, str) else value
        if items is None:
            items = []
        if not isinstance(items, list | tuple):
            errors.append(f"previous[{key!r}]: expected a list of addresses, got {value!r}")
            continue
        ips: list[str] = []
        for item in items:
            try:
                ips.append(str(ipaddress.ip_address(str(item).strip())))
            except ValueError:
                errors.append(f"previous[{key!r}]: {item!r} is not an IP address")
        out[str(key)] = ips
    if errors:
        raise ConfigError(errors)
    return out


# --------------------------------------------------------------------------- state


@dataclass
class _Use:
    """Who uses one address: MetalLB's sharingKeyForIP, portsInUse and servicesOnIP in one."""

    pool: str
    sharing: str
    backend: str
    ports: dict[tuple[int, str], str] = field(default_factory=dict)
    services: list[str] = field(default_factory=list)


class _SharedGroup:
    """Addresses in use under one (pool, family, sharing key, backend key), ascending, and who uses which port.

    Every address here accepts another service of the same keys whose ports it does not use yet.
    """

    def __init__(self) -> None:
        self.values: list[int] = []
        self.by_port: dict[tuple[int, str], set[int]] = {}

    def first_open(self, ports: list[tuple[int, str]], below: int | None) -> int | None:
        """The lowest address (under ``below``) none of whose services use one of ``ports``."""
        taken = [self.by_port[p] for p in ports if p in self.by_port]
        if any(len(t) == len(self.values) for t in taken):
            return None  # every address already serves one of these ports (the common case when full)
        for value in self.values:
            if below is not None and value >= below:
                return None
            if not any(value in t for t in taken):
                return value
        return None


class _Cursor:
    """Lowest address of one family of one pool that may be free; only moves back on release."""

    def __init__(self, pool: Pool, version: int) -> None:
        spans = sorted((int(r.start), int(r.end)) for r in pool.ranges if r.version == version)
        self.starts = [span[0] for span in spans]
        self.spans = spans
        self.index = 0
        self.value = spans[0][0] if spans else 0

    def rewind(self, value: int) -> None:
        index = bisect.bisect_right(self.starts, value) - 1
        if index < 0:
            return
        if (index, value) < (self.index, self.value):
            self.index, self.value = index, value


class _State:
    def __init__(self, pools: Mapping[str, Pool]) -> None:
        self.pools = pools
        self.used: dict[tuple[int, int], _Use] = {}
        # (pool, version, sharing, backend) -> addresses with that key, for joining shared addresses
        self.shared: dict[tuple[str, int, str, str], _SharedGroup] = {}
        self.cursors: dict[tuple[str, int], _Cursor] = {}
        # ranges of all pools, for pool_of: version -> sorted [(start, end, pool)]
        self.index: dict[int, list[tuple[int, int, str]]] = {4: [], 6: []}
        for name, pool in pools.items():
            for r in pool.ranges:
                self.index[r.version].append((int(r.start), int(r.end), name))
        for spans in self.index.values():
            spans.sort()
        self.starts = {v: [span[0] for span in spans] for v, spans in self.index.items()}

    # -- lookups

    def pool_of(self, ip: IPAddress) -> Pool | None:
        """The pool that may hand out ``ip`` (MetalLB's poolFor: avoidBuggyIPs pools refuse .0/.255)."""
        value = int(ip)
        spans = self.index[ip.version]
        i = bisect.bisect_right(self.starts[ip.version], value) - 1
        # pool validation refuses overlapping ranges, so the range starting last at or before value is the one;
        # scan the earlier ones too, so that a configuration with nested ranges still answers correctly
        candidates = ([spans[i]] + spans[:i]) if i >= 0 else []
        for start, end, name in candidates:
            if start <= value <= end:
                pool = self.pools[name]
                if pool.avoid_buggy_ips and _buggy(ip.version, value):
                    return None
                return pool
        return None

    def check(self, key: str, ip: IPAddress, req: _Request) -> str | None:
        """MetalLB's checkSharing: None when ``key`` may use ``ip``, else the reason."""
        use = self.used.get((ip.version, int(ip)))
        if use is None:
            return None
        if not (use.sharing and req.sharing and use.sharing == req.sharing and use.backend == req.backend):
            others = sorted(s for s in use.services if s != key)
            if others:
                return f'can\'t change sharing key for "{key}", address also in use by {",".join(others)}'
        for port in req.ports:
            owner = use.ports.get(port)
            if owner is not None and owner != key:
                return f'port {port[1]}/{port[0]} is already in use on "{ip}"'
        return None

    def free(self, pool: Pool, version: int, key: str, req: _Request) -> IPAddress | None:
        """The lowest address of ``version`` in ``pool`` that ``key`` may use, or None."""
        best: int | None = None
        cursor = self.cursors.get((pool.name, version))
        if cursor is None:
            cursor = self.cursors[(pool.name, version)] = _Cursor(pool, version)
        while cursor.index < len(cursor.spans):
            start, end = cursor.spans[cursor.index]
            if cursor.value < start:
                cursor.value = start
            if cursor.value > end:
                cursor.index += 1
                continue
            if (pool.avoid_buggy_ips and _buggy(version, cursor.value)) or (version, cursor.value) in self.used:
                cursor.value += 1
                continue
            best = cursor.value
            break
        group = self.shared.get((pool.name, version, req.sharing, req.backend)) if req.sharing else None
        if group is not None:
            joined = group.first_open(req.ports, best)
            if joined is not None:
                best = joined
        return None if best is None else _address(version, best)

    # -- changes

    def assign(self, key: str, ips: list[IPAddress], pool: Pool, req: _Request) -> None:
        for ip in ips:
            slot = (ip.version, int(ip))
            use = self.used.get(slot)
            if use is None:
                use = self.used[slot] = _Use(pool=pool.name, sharing=req.sharing, backend=req.backend)
                if req.sharing:
                    fresh = self.shared.setdefault((pool.name, ip.version, req.sharing, req.backend), _SharedGroup())
                    bisect.insort(fresh.values, int(ip))
            group = self.shared.get((use.pool, ip.version, use.sharing, use.backend)) if use.sharing else None
            for port in req.ports:
                use.ports[port] = key
                if group is not None:
                    group.by_port.setdefault(port, set()).add(int(ip))
            use.services.append(key)

    def release(self, key: str, ips: list[IPAddress]) -> None:
        for ip in ips:
            slot = (ip.version, int(ip))
            use = self.used[slot]
            use.services.remove(key)
            group = self.shared.get((use.pool, ip.version, use.sharing, use.backend)) if use.sharing else None
            for port in [p for p, s in use.ports.items() if s == key]:
                del use.ports[port]
                if group is not None:
                    group.by_port[port].discard(int(ip))
            if not use.services:
                del self.used[slot]
                if group is not None:
                    group.values.remove(int(ip))
                cursor = self.cursors.get((use.pool, ip.version))
                if cursor is not None:
                    cursor.rewind(int(ip))

    def usage(self) -> dict[str, dict[str, dict[str, int]]]:
        counts: dict[tuple[str, int], int] = {}
        for (version, _value), use in self.used.items():
            counts[(use.pool, version)] = counts.get((use.pool, version), 0) + 1
        out: dict[str, dict[str, dict[str, int]]] = {}
        for name in sorted(self.pools):
            pool = self.pools[name]
            out[name] = {}
            for version in sorted(pool.families()):
                assigned = counts.get((name, version), 0)
                out[name][f"ipv{version}"] = {"assigned": assigned, "available": pool.size(version) - assigned}
        return out


def held_address_problems(services: Iterable[Any]) -> list[str]:
    """Why the addresses services already hold (``status.loadBalancer.ingress``) cannot be served together.

    ``allocate`` never hands out such a set, but a speaker is given statuses as written: two
    services holding one address are announced as one VIP, so they must be allowed to share it
    exactly as MetalLB's checkSharing allows (the same non-empty sharing key, the same backend key
    - under ``externalTrafficPolicy: Local``, the same health check, which decides who may
    announce - and no port used twice). Otherwise each service would elect its own leader for the
    one address: two owners. Returns one message per refused service, in MetalLB's words, the
    service that comes later in key order being the refused one.
    """
    uses: dict[IPAddress, _Use] = {}
    problems: list[str] = []
    for service in sorted((s for s in services if is_managed(s)), key=lambda s: s.key):
        try:
            req = _request(service)
            held = [ipaddress.ip_address(ip) for ip in service.ingress_ips]
        except (_Fail, ValueError):
            continue  # a bad request or address is reported by the schema and by allocate
        for ip in held:
            use = uses.get(ip)
            if use is None:
                use = uses[ip] = _Use(pool="", sharing=req.sharing, backend=req.backend)
            elif not (use.sharing and req.sharing and use.sharing == req.sharing and use.backend == req.backend):
                problems.append(f'Service {service.key}: status.loadBalancer.ingress {ip}: can\'t change sharing key '
                                f'for "{service.key}", address also in use by {",".join(use.services)}')
                continue
            clash = next((p for p in req.ports if p in use.ports), None)
            if clash is not None:
                problems.append(f'Service {service.key}: status.loadBalancer.ingress {ip}: port {clash[1]}/{clash[0]} '
                                f'is already in use on "{ip}"')
                continue
            use.services.append(service.key)
            use.ports.update((p, service.key) for p in req.ports)
    return problems


def _address(version: int, value: int) -> IPAddress:
    return ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value)


# --------------------------------------------------------------------------- the allocator


class _Allocator:
    def __init__(self, config: Any) -> None:
        self.config = config
        self.pools: dict[str, Pool] = dict(config.pools)
        self.state = _State(self.pools)
        self.namespaces: dict[str, dict] = dict(getattr(config, "namespaces", None) or {})

    def namespace_labels(self, namespace: str) -> dict:
        labels = dict(self.namespaces.get(namespace) or {})
        labels.setdefault(NAMESPACE_NAME_LABEL, namespace)
        return labels

    def serves(self, pool: Pool, service: Any) -> bool:
        """MetalLB's isPoolCompatibleWithService (namespaces and namespaceSelectors, serviceSelectors)."""
        allocation = pool.allocation
        if allocation is None:
            return True
        return allocation.matches(service.namespace, self.namespace_labels(service.namespace), service.labels or {})

    def auto_pools(self, service: Any) -> list[Pool]:
        """Pools to try for a service that names none: pinned ones by priority then name, then the rest by name."""

        def order(pool: Pool) -> tuple[int, float, str]:
            if pool.allocation is None:
                return (1, 0, pool.name)
            priority = pool.allocation.priority
            return (0, priority if priority and priority > 0 else float("inf"), pool.name)

        return sorted((p for p in self.pools.values() if p.auto_assign and self.serves(p, service)), key=order)

    # -- the three ways to get addresses

    def exact(self, key: str, service: Any, req: _Request) -> tuple[list[IPAddress], Pool]:
        pools: list[Pool] = []
        for ip in req.ips:
            pool = self.state.pool_of(ip)
            if pool is None:
                # MetalLB's Assign: fmt.Errorf("%q is not allowed in config", ips), the whole requested list
                raise _Fail(f"{_go_quote_list(req.ips)} is not allowed in config")
            pools.append(pool)
        if len({p.name for p in pools}) > 1:
            names = ", ".join(sorted({p.name for p in pools}))
            raise _Fail(
                f"{_go_quote_list(req.ips)} is not allowed in config: the addresses are in different pools ({names})"
            )
        pool = pools[0]
        if not self.serves(pool, service):
            raise _Fail(f"pool {pool.name} not compatible for ip assignment")
        if req.pool and req.pool != pool.name:
            raise _Fail(
                f"requested loadBalancer IP(s) {_go_quote_list(req.ips)} is not compatible with requested address pool "
                f"{req.pool}"
            )
        for ip in req.ips:
            reason = self.state.check(key, ip, req)
            if reason:
                raise _Fail(reason)
        return list(req.ips), pool

    def keep(
        self, key: str, service: Any, req: _Request, previous: list[IPAddress]
    ) -> tuple[list[IPAddress], Pool] | None:
        """The part of ``previous`` the service may keep, or None when it must start afresh."""
        if req.ips:
            if sorted(previous, key=_sort_key) != sorted(req.ips, key=_sort_key):
                return None
            try:
                return self.exact(key, service, req)
            except _Fail:
                return None
        valid: list[tuple[IPAddress, Pool]] = []
        for ip in previous:
            owner = self.state.pool_of(ip)
            if owner is not None:
                valid.append((ip, owner))
        if not valid:
            return None
        pool = valid[0][1]
        by_family: dict[int, IPAddress] = {}
        for ip, p in valid:
            if p is pool and ip.version not in by_family:
                by_family[ip.version] = ip
        if req.policy == "SingleStack":
            if req.fixed_family:
                chosen = [by_family[req.families[0]]] if req.families[0] in by_family else []
            else:
                chosen = [by_family[v] for v in req.families if v in by_family][:1]
        else:
            chosen = [by_family[v] for v in req.families if v in by_family]
        if not chosen:
            return None
        if not self.serves(pool, service) or (req.pool and req.pool != pool.name):
            return None
        for ip in chosen:
            if self.state.check(key, ip, req):
                return None
        return chosen, pool

    def pick(self, key: str, pools: list[Pool], req: _Request) -> tuple[list[IPAddress], Pool] | None:
        """MetalLB's findBestPoolForService + selectIPsForFamilyAndPolicy, over ``pools`` in order."""
        state = self.state
        if req.policy == "SingleStack":
            wanted = req.families[:1] if req.fixed_family else req.families
            for pool in pools:
                for version in wanted:
                    ip = state.free(pool, version, key, req)
                    if ip is not None:
                        return [ip], pool
            return None
        first: tuple[list[IPAddress], Pool] | None = None
        second: tuple[list[IPAddress], Pool] | None = None
        primary, secondary = req.families
        for pool in pools:
            a = state.free(pool, primary, key, req)
            b = state.free(pool, secondary, key, req)
            if a is not None and b is not None:
                return [a, b], pool
            if req.policy == "PreferDualStack":
                if a is not None and first is None:
                    first = ([a], pool)
                if b is not None and second is None:
                    second = ([b], pool)
        return first or second

    def fresh(self, key: str, service: Any, req: _Request) -> tuple[list[IPAddress], Pool]:
        if req.pool:
            pool = self.pools.get(req.pool)
            if pool is None:
                raise _Fail(f'unknown pool "{req.pool}"')
            if not self.serves(pool, service):
                raise _Fail(f"pool {pool.name} not compatible for ip assignment")
            got = self.pick(key, [pool], req)
            if got is None:
                raise _Fail(f'no available IPs in pool "{pool.name}"{_family_hint(req)}')
            return got
        got = self.pick(key, self.auto_pools(service), req)
        if got is None:
            raise _Fail("no available IPs")
        return got


def _family_hint(req: _Request) -> str:
    if req.policy == "RequireDualStack":
        return " for DualStack IPFamily"
    if req.fixed_family:
        return f" for {_FAMILY_NAME[req.families[0]]} IPFamily"
    return ""


def _sort_key(ip: IPAddress) -> tuple[int, int]:
    return (ip.version, int(ip))


def _message(key: str, reason: str) -> str:
    return f'Failed to allocate IP for "{key}": {reason}'


def allocate(config: Any, previous: Mapping[str, Any] | None = None) -> AllocationResult:
    """Assign addresses to every LoadBalancer service of our class in ``config``.

    ``previous`` maps service keys ("namespace/name") to the addresses they had;
    a service missing from it falls back on its ``status.loadBalancer.ingress``.
    Raises ConfigError only for a malformed ``previous``; a service that cannot be
    served gets an ``error`` in its Assignment.
    """
    given = normalize_previous(previous)
    allocator = _Allocator(config)
    state = allocator.state

    services: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for service in sorted(config.services, key=lambda s: s.key):
        reason = unmanaged_reason(service)
        if reason is None:
            services.setdefault(service.key, service)
        else:
            skipped[service.key] = reason

    effective: dict[str, list[str]] = {}
    for key, service in services.items():
        if key in given:
            effective[key] = given[key]
        else:
            texts: list[str] = []
            for text in service.ingress_ips or []:
                try:
                    texts.append(str(ipaddress.ip_address(str(text).strip())))
                except ValueError:
                    continue
            effective[key] = texts
    for key, texts in given.items():
        if key not in services:
            effective[key] = texts

    results: dict[str, Assignment] = {key: Assignment(key=key) for key in services}
    requests: dict[str, _Request] = {}
    for key, service in services.items():
        try:
            requests[key] = _request(service)
        except _Fail as fail:
            results[key].error = _message(key, str(fail))

    held: dict[str, tuple[list[IPAddress], Pool]] = {}

    # 1. holders keep what they may keep, in key order
    for key in services:
        wanted = requests.get(key)
        before = [ipaddress.ip_address(ip) for ip in effective.get(key, [])]
        if wanted is None or not before:
            continue
        kept = allocator.keep(key, services[key], wanted, before)
        if kept is not None:
            state.assign(key, kept[0], kept[1], wanted)
            held[key] = kept

    # 2. dual-stack holders missing a family complete it from the same pool
    for key, (addrs, pool) in list(held.items()):
        req = requests[key]
        if req.policy == "SingleStack" or len(addrs) == 2 or req.ips:
            continue  # explicit addresses are exactly what was asked for
        missing = next(v for v in req.families if v != addrs[0].version)
        extra = state.free(pool, missing, key, req)
        if extra is not None:
            state.assign(key, [extra], pool, req)
            order = req.families
            held[key] = (sorted([*addrs, extra], key=lambda ip: order.index(ip.version)), pool)
        elif req.policy == "RequireDualStack":
            state.release(key, addrs)
            del held[key]

    # 3. everybody else: exact addresses, then named pools, then the rest
    def group(key: str) -> tuple[int, str]:
        req = requests[key]
        return (0 if req.ips else 1 if req.pool else 2, key)

    for key in sorted((k for k in requests if k not in held), key=group):
        req = requests[key]
        try:
            got = allocator.exact(key, services[key], req) if req.ips else allocator.fresh(key, services[key], req)
        except _Fail as fail:
            results[key].error = _message(key, str(fail))
            continue
        state.assign(key, got[0], got[1], req)
        held[key] = got

    # A refused exact request names who holds the address; say it against the final state, so that the
    # message is the same on every run (holders may have been placed before or after this service).
    for key, req in requests.items():
        if key not in held and req.ips:
            try:
                allocator.exact(key, services[key], req)
            except _Fail as fail:
                results[key].error = _message(key, str(fail))

    for key, (addrs, pool) in held.items():
        results[key].ips = [str(ip) for ip in addrs]
        results[key].pool = pool.name

    after = {key: a.ips for key, a in results.items() if a.ips}
    before_map = {key: ips for key, ips in effective.items() if ips}
    changes: dict[str, dict[str, Any]] = {"added": {}, "changed": {}, "removed": {}}
    for key in sorted(set(after) | set(before_map)):
        if key not in before_map:
            changes["added"][key] = after[key]
        elif key not in after:
            changes["removed"][key] = before_map[key]
        elif after[key] != before_map[key]:
            changes["changed"][key] = {"before": before_map[key], "after": after[key]}

    return AllocationResult(
        services=dict(sorted(results.items())),
        skipped=skipped,
        changes=changes,
        previous=dict(sorted(before_map.items())),
        pool_usage=state.usage(),
    )
