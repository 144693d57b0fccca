# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""MetalLB's resources, read from plain documents and checked all at once.

``parse_resources(docs)`` takes the documents of a MetalLB manifest as they
come out of a YAML loader (IPAddressPool, L2Advertisement, BGPAdvertisement,
BFDProfile, Community in ``metallb.io/v1beta1``; BGPPeer in
``metallb.io/v1beta2`` (v1beta1 accepted); v1 Service, Namespace and Secret),
and returns a ``Config`` or raises ``ConfigError`` listing every problem.
Decoding is strict: an unknown field is an error that names it, like
Kubernetes' strict field validation. Every message starts with
``Kind "name": field:`` and quotes the bad value; where MetalLB has a message
for the same problem, its wording follows.

Our own addition, documented beside MetalLB's annotations: the Service
annotation ``nocloud.io/health-check`` (see ``parse_health_check``) tells a
node how to check its local backend; it stands in for endpoints under
``externalTrafficPolicy: Local``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .backends import parse_backends_spec
from .errors import ConfigError
from .healthcheck import (
    _DNS1123_SUBDOMAIN,
    parse_duration,
    parse_health_check,
)
from .pools import (
    AddressRange,
    Pool,
    ServiceAllocation,
    _first_duplicate,
    _q,
    find_overlaps,
    parse_ip,
    selector_matches,
    selector_problems,
    selector_text,
)

METALLB_V1BETA1 = "metallb.io/v1beta1"
METALLB_V1BETA2 = "metallb.io/v1beta2"

ANNOTATION_LOADBALANCER_IPS = "metallb.io/loadBalancerIPs"
ANNOTATION_ADDRESS_POOL = "metallb.io/address-pool"
ANNOTATION_ALLOW_SHARED_IP = "metallb.io/allow-shared-ip"
# MetalLB still honours its old annotation domain; so do we.
DEPRECATED_PREFIX = "metallb.universe.tf/"
ANNOTATION_HEALTH_CHECK = "nocloud.io/health-check"


BFD_DEFAULTS = {
    "receive_interval": 300,
    "transmit_interval": 300,
    "detect_multiplier": 3,
    "echo_interval": 50,
    "minimum_ttl": 254,
}

OBJECT_META_FIELDS = frozenset(
    {
        "name", "namespace", "labels", "annotations", "uid", "resourceVersion", "generation",
        "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generateName",
        "ownerReferences", "finalizers", "managedFields", "selfLink",
    }
)
SERVICE_SPEC_FIELDS = frozenset(
    {
        "ports", "selector", "clusterIP", "clusterIPs", "type", "externalIPs", "sessionAffinity",
        "loadBalancerIP", "loadBalancerSourceRanges", "externalName", "externalTrafficPolicy",
        "healthCheckNodePort", "publishNotReadyAddresses", "sessionAffinityConfig", "ipFamilies",
        "ipFamilyPolicy", "allocateLoadBalancerNodePorts", "loadBalancerClass", "internalTrafficPolicy",
        "trafficDistribution",
    }
)
SERVICE_PORT_FIELDS = frozenset({"name", "protocol", "appProtocol", "port", "targetPort", "nodePort"})
INGRESS_FIELDS = frozenset({"ip", "hostname", "ipMode", "ports"})

# kind -> (accepted apiVersions, spec fields or None when the kind has no spec checks)
KINDS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "IPAddressPool": ((METALLB_V1BETA1,), frozenset({"addresses", "autoAssign", "avoidBuggyIPs", "serviceAllocation"})),
    "L2Advertisement": (
        (METALLB_V1BETA1,),
        frozenset(
            {"ipAddressPools", "ipAddressPoolSelectors", "nodeSelectors", "interfaces", "serviceSelectors",
             "preferredNodeSelectors"}
        ),
    ),
    "BGPAdvertisement": (
        (METALLB_V1BETA1,),
        frozenset(
            {"aggregationLength", "aggregationLengthV6", "localPref", "communities", "ipAddressPools",
             "ipAddressPoolSelectors", "nodeSelectors", "peers", "serviceSelectors"}
        ),
    ),
    "BGPPeer": (
        (METALLB_V1BETA2, METALLB_V1BETA1),
        frozenset(
            {"myASN", "peerASN", "localASN", "dynamicASN", "peerAddress", "interface", "sourceAddress", "peerPort",
             "holdTime", "keepaliveTime", "connectTime", "routerID", "nodeSelectors", "password", "passwordSecret",
             "passwordFile", "bfdProfile", "enableGracefulRestart", "ebgpMultiHop", "vrf", "disableMP",
             "dualStackAddressFamily"}
        ),
    ),
    "BFDProfile": (
        (METALLB_V1BETA1,),
        frozenset(
            {"receiveInterval", "transmitInterval", "detectMultiplier", "echoInterval", "echoMode", "passiveMode",
             "minimumTtl"}
        ),
    ),
    "Community": ((METALLB_V1BETA1,), frozenset({"communities"})),
    "Service": (("v1",), SERVICE_SPEC_FIELDS),
    "Namespace": (("v1",), frozenset({"finalizers"})),
    "Secret": (("v1",), frozenset()),
    # mode: dataplane - our own kind (nocloud.io/v1alpha1), parsed in backends.py
    "Backends": (("nocloud.io/v1alpha1",), frozenset({"method", "scheduler", "healthCheck", "servers", "snatAddress"})),
}
# Documents are parsed in this order so references resolve whatever the manifest order.
KIND_ORDER = ("Namespace", "Secret", "BFDProfile", "Community", "IPAddressPool", "L2Advertisement",
              "BGPPeer", "BGPAdvertisement", "Service", "Backends")

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# --------------------------------------------------------------------------- resources


@dataclass
class Service:
    """A v1 Service of type LoadBalancer; the core reads it through the properties."""

    namespace: str
    name: str
    labels: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)
    spec: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _annotation(self, name: str) -> str | None:
        """MetalLB's valueForAnnotation: the metallb.io name wins over the metallb.universe.tf one."""
        value = self.annotations.get(name)
        if value is None or value == "":
            value = self.annotations.get(DEPRECATED_PREFIX + name.split("/", 1)[1])
        if value is None or value == "":
            return None
        return str(value)

    @property
    def load_balancer_class(self) -> str | None:
        return self.spec.get("loadBalancerClass") or None

    @property
    def traffic_policy(self) -> str:
        return self.spec.get("externalTrafficPolicy") or "Cluster"

    @property
    def ports(self) -> list[tuple[int, str]]:
        return [(int(p["port"]), str(p.get("protocol") or "TCP")) for p in self.spec.get("ports") or []]

    @property
    def requested_ips(self) -> list[str]:
        """From metallb.io/loadBalancerIPs (comma separated), else spec.loadBalancerIP, else []."""
        value = self._annotation(ANNOTATION_LOADBALANCER_IPS)
        if value is not None:
            return [part.strip() for part in value.split(",") if part.strip()]
        if self.spec.get("loadBalancerIP"):
            return [str(self.spec["loadBalancerIP"])]
        return []

    @property
    def requested_pool(self) -> str | None:
        return self._annotation(ANNOTATION_ADDRESS_POOL)

    @property
    def sharing_key(self) -> str | None:
        return self._annotation(ANNOTATION_ALLOW_SHARED_IP)

    @property
    def ip_families(self) -> list[str]:
        """spec.ipFamilies as written ("IPv4"/"IPv6"); [] when not given (the allocator decides)."""
        return [str(f) for f in self.spec.get("ipFamilies") or []]

    @property
    def ip_versions(self) -> list[int]:
        """ip_families as numbers: "IPv4" -> 4, "IPv6" -> 6."""
        return [4 if f == "IPv4" else 6 for f in self.ip_families]

    @property
    def ip_family_policy(self) -> str:
        """spec.ipFamilyPolicy; "SingleStack" when not given (Kubernetes' default)."""
        return self.spec.get("ipFamilyPolicy") or "SingleStack"

    @property
    def ingress_ips(self) -> list[str]:
        ingress = (self.status.get("loadBalancer") or {}).get("ingress") or []
        return [str(i["ip"]) for i in ingress if isinstance(i, dict) and i.get("ip")]

    @property
    def health_check(self) -> dict | None:
        """The parsed ``nocloud.io/health-check`` annotation, or None (see parse_health_check)."""
        value = self.annotations.get(ANNOTATION_HEALTH_CHECK)
        if value is None or value == "":
            return None
        return parse_health_check(value, self.ports)


@dataclass
class L2Advertisement:
    """An L2Advertisement with its pools resolved (empty spec = all pools, as in MetalLB).

    ``interfaces`` empty = all eligible interfaces; ``node_selectors`` empty = all nodes;
    ``service_selectors`` empty = all services of the pools.
    """

    name: str
    pools: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    node_selectors: list[dict] = field(default_factory=list)
    service_selectors: list[dict] = field(default_factory=list)
    preferred_node_selectors: list[dict] = field(default_factory=list)

    def selects_node(self, labels: dict | None) -> bool:
        return not self.node_selectors or any(selector_matches(s, labels or {}) for s in self.node_selectors)

    def selects_service(self, labels: dict | None) -> bool:
        return not self.service_selectors or any(selector_matches(s, labels or {}) for s in self.service_selectors)


@dataclass
class BGPAdvertisement:
    """A BGPAdvertisement with pools resolved and communities turned into values."""

    name: str
    pools: list[str] = field(default_factory=list)
    aggregation_length: int = 32
    aggregation_length_v6: int = 128
    local_pref: int = 0
    communities: list[str] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)
    node_selectors: list[dict] = field(default_factory=list)
    service_selectors: list[dict] = field(default_factory=list)

    def selects_node(self, labels: dict | None) -> bool:
        return not self.node_selectors or any(selector_matches(s, labels or {}) for s in self.node_selectors)

    def selects_service(self, labels: dict | None) -> bool:
        return not self.service_selectors or any(selector_matches(s, labels or {}) for s in self.service_selectors)


@dataclass
class BGPPeer:
    """A BGPPeer (v1beta2 fields). Durations are seconds (float) or None when unset.

    ``hold_time``/``keepalive_time`` are completed as MetalLB does: only one
    given -> the other is derived (hold = 3 x keepalive).
    """

    name: str
    my_asn: int
    peer_asn: int = 0
    dynamic_asn: str = ""
    local_asn: int = 0
    address: str = ""
    interface: str = ""
    source_address: str = ""
    port: int = 179
    hold_time: float | None = None
    keepalive_time: float | None = None
    connect_time: float | None = None
    router_id: str = ""
    node_selectors: list[dict] = field(default_factory=list)
    password: str = ""
    password_secret: dict = field(default_factory=dict)
    password_file: str = ""  # our own field: a file on the node holding the password (read at (re)load)
    bfd_profile: str = ""
    enable_graceful_restart: bool = False
    ebgp_multihop: bool = False
    vrf: str = ""
    disable_mp: bool = False
    dual_stack_address_family: bool = False

    def selects_node(self, labels: dict | None) -> bool:
        return not self.node_selectors or any(selector_matches(s, labels or {}) for s in self.node_selectors)


@dataclass
class BFDProfile:
    """A BFDProfile; unset values carry MetalLB's documented defaults."""

    name: str
    receive_interval: int = 300
    transmit_interval: int = 300
    detect_multiplier: int = 3
    echo_interval: int = 50
    echo_mode: bool = False
    passive_mode: bool = False
    minimum_ttl: int = 254


@dataclass
class Config:
    """Everything parse_resources found, in manifest order."""

    pools: dict[str, Pool] = field(default_factory=dict)
    l2_advertisements: list[L2Advertisement] = field(default_factory=list)
    bgp_advertisements: list[BGPAdvertisement] = field(default_factory=list)
    bgp_peers: list[BGPPeer] = field(default_factory=list)
    bfd_profiles: dict[str, BFDProfile] = field(default_factory=dict)
    communities: dict[str, str] = field(default_factory=dict)
    services: list[Service] = field(default_factory=list)
    namespaces: dict[str, dict] = field(default_factory=dict)
    secrets: dict[str, dict] = field(default_factory=dict)
    backends: dict[str, Any] = field(default_factory=dict)  # mode: dataplane - "ns/name" -> backends.Backends

    def pool_for_ip(self, ip: object) -> Pool | None:
        """The pool whose ranges hold ``ip`` (str or ipaddress object), or None."""
        if isinstance(ip, str):
            try:
                ip = parse_ip(ip)
            except ValueError:
                return None
        for pool in self.pools.values():
            if pool.contains(ip):
                return pool
        return None

    def l2_advertisements_for_pool(self, name: str) -> list[L2Advertisement]:
        return [adv for adv in self.l2_advertisements if name in adv.pools]

    def bgp_advertisements_for_pool(self, name: str) -> list[BGPAdvertisement]:
        return [adv for adv in self.bgp_advertisements if name in adv.pools]

    def service(self, key: str) -> Service | None:
        for svc in self.services:
            if svc.key == key:
                return svc
        return None


# --------------------------------------------------------------------------- helpers


def parse_community(value: Any) -> str:
    """A BGP community: legacy ``AS:value`` (16 bits each) or ``large:g:l1:l2`` (32 bits each).

    Returns the normalized text; raises ValueError with MetalLB's wording.
    """
    c = str(value)
    parts = c.split(":")
    if len(parts) == 2:
        for part in parts:
            _community_section(part, c, 16)
        return f"{int(parts[0])}:{int(parts[1])}"
    if len(parts) == 4:
        if parts[0] != "large":
            raise ValueError(
                "invalid community value: invalid marker for large community, expected community to be of format "
                f"large:<uint32>:<uint32>:<uint32> but got {_q(c)} instead"
            )
        for part in parts[1:]:
            _community_section(part, c, 32)
        return "large:" + ":".join(str(int(p)) for p in parts[1:])
    raise ValueError(f"invalid community format: {c}")


def yaml11_community(value: Any) -> Any:
    """Undo YAML 1.1's base-60 integers for a legacy community.

    PyYAML (and so Ansible) reads an unquoted ``1234:1`` as the sexagesimal
    number 74041, where Kubernetes' loader keeps the string; MetalLB's own
    docs write communities unquoted. A legacy community read that way is
    ``upper * 60 + lower`` with ``lower < 60``, so it can be turned back.
    Anything else is returned unchanged.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 60:
        return f"{value // 60}:{value % 60}"
    return value


def _community_section(part: str, c: str, bits: int) -> None:
    if not part.isdigit() or not part.isascii():
        raise ValueError(
            f"invalid community value: invalid section {_q(part)} of community {_q(c)}, "
            f"err: {_q(f'strconv.ParseUint: parsing {_q(part)}: invalid syntax')}"
        )
    if int(part) >= 2**bits:
        raise ValueError(
            f"invalid community value: invalid section {_q(part)} of community {_q(c)}, "
            f"err: {_q(f'strconv.ParseUint: parsing {_q(part)}: value out of range')}"
        )


class _Errors:
    """Collects problems, each prefixed by the resource it belongs to."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, fieldname: str, message: str) -> None:
        self.items.append(f"{where}: {fieldname}: {message}")


class _Res:
    """One document being read: typed getters that report into the shared error list."""

    def __init__(self, errors: _Errors, kind: str, doc: dict, where: str) -> None:
        self.errors = errors
        self.kind = kind
        self.doc = doc
        self.where = where
        meta = doc.get("metadata")
        self.meta: dict = meta if isinstance(meta, dict) else {}
        spec = doc.get("spec")
        self.spec: dict = spec if isinstance(spec, dict) else {}
        self.name: str = str(self.meta.get("name") or "")

    def err(self, fieldname: str, message: str) -> None:
        self.errors.add(self.where, fieldname, message)

    def check_fields(self, obj: Any, allowed: frozenset[str] | set[str], path: str) -> None:
        if not isinstance(obj, dict):
            return
        for key in obj:
            if key not in allowed:
                self.err(f"{path}.{key}" if path else str(key), f"unknown field {_q(key)}")

    def string(self, obj: dict, key: str, path: str, default: str = "") -> str:
        value = obj.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.err(f"{path}.{key}", f"must be a string, got {value!r}")
            return default
        return value

    def boolean(self, obj: dict, key: str, path: str, default: bool = False) -> bool:
        value = obj.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.err(f"{path}.{key}", f"must be true or false, got {value!r}")
            return default
        return value

    def integer(self, obj: dict, key: str, path: str, low: int | None = None, high: int | None = None) -> int | None:
        value = obj.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(f"{path}.{key}", f"must be an integer, got {value!r}")
            return None
        if (low is not None and value < low) or (high is not None and value > high):
            self.err(f"{path}.{key}", f"invalid value {value}, must be in {low}-{high} range")
            return None
        return value

    def strings(self, obj: dict, key: str, path: str, what: str | None = None, dup_message: str = "") -> list[str]:
        value = obj.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.err(f"{path}.{key}", f"must be a list of strings, got {value!r}")
            return []
        dup = _first_duplicate(value)
        if dup is not None:
            self.err(f"{path}.{key}", f"{dup_message or f'duplicate definition of {what or key}'} {_q(dup)}")
        return list(value)

    def selectors(self, obj: dict, key: str, path: str) -> list[dict]:
        value = obj.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.err(f"{path}.{key}", f"must be a list of label selectors, got {value!r}")
            return []
        good = []
        seen: dict[str, int] = {}
        for i, sel in enumerate(value):
            problems = selector_problems(sel)
            for problem in problems:
                self.err(f"{path}.{key}[{i}]", problem)
            if problems:
                continue
            text = selector_text(sel)
            if text in seen:
                self.err(f"{path}.{key}[{i}]", f"duplicate definition of {key} {_q(text)}")
                continue
            seen[text] = i
            good.append(sel or {})
        return good


def _labels(res: _Res, path: str = "metadata.labels") -> dict:
    value = res.meta.get("labels")
    if value is None:
        return {}
    if not isinstance(value, dict):
        res.err(path, f"must be a mapping of strings, got {value!r}")
        return {}
    out = {}
    for k, v in value.items():
        if isinstance(v, (dict, list)) or v is None:
            res.err(f"{path}.{k}", f"must be a string, got {v!r}")
            continue
        out[str(k)] = v if isinstance(v, str) else json.dumps(v)
    return out


# --------------------------------------------------------------------------- per kind


def _parse_pool(res: _Res) -> Pool | None:
    spec, name = res.spec, res.name
    if "spec" not in res.doc:
        res.err("spec", "missing spec: an IPAddressPool needs spec.addresses")
        return None
    addresses = spec.get("addresses")
    ranges: list[AddressRange] = []
    if not addresses:
        res.err("spec.addresses", "pool has no prefixes defined")
    elif not isinstance(addresses, list):
        res.err("spec.addresses", f"must be a list of CIDRs or ranges, got {addresses!r}")
    else:
        for i, text in enumerate(addresses):
            try:
                rng = AddressRange.parse(text)
            except ValueError as exc:
                detail = str(exc)
                message = f"invalid CIDR {_q(text)} in pool {_q(name)}"
                if not detail.startswith("invalid CIDR"):
                    message += f": {detail}"
                res.err(f"spec.addresses[{i}]", message)
                continue
            ranges.append(rng)
    auto_assign = res.boolean(spec, "autoAssign", "spec", True)
    avoid = res.boolean(spec, "avoidBuggyIPs", "spec", False)
    allocation = None
    alloc = spec.get("serviceAllocation")
    if alloc is not None:
        if not isinstance(alloc, dict):
            res.err("spec.serviceAllocation", f"must be a mapping, got {alloc!r}")
        else:
            res.check_fields(alloc, {"priority", "namespaces", "namespaceSelectors", "serviceSelectors"},
                             "spec.serviceAllocation")
            priority = res.integer(alloc, "priority", "spec.serviceAllocation", 0, 2**31 - 1)
            namespaces = res.strings(alloc, "namespaces", "spec.serviceAllocation",
                                     dup_message="duplicate definition in namespaces field:")
            for i, ns in enumerate(namespaces):
                if not _DNS1123_LABEL.match(ns):
                    res.err(f"spec.serviceAllocation.namespaces[{i}]", f"{_q(ns)} is not a valid namespace name")
            allocation = ServiceAllocation(
                priority=priority or None,
                namespaces=namespaces,
                namespace_selectors=res.selectors(alloc, "namespaceSelectors", "spec.serviceAllocation"),
                service_selectors=res.selectors(alloc, "serviceSelectors", "spec.serviceAllocation"),
            )
    return Pool(name=name, ranges=ranges, auto_assign=auto_assign, avoid_buggy_ips=avoid,
                allocation=allocation, labels=_labels(res))


def _resolve_pools(res: _Res, pools: dict[str, Pool]) -> list[str]:
    spec = res.spec
    names = res.strings(spec, "ipAddressPools", "spec")
    pool_selectors = res.selectors(spec, "ipAddressPoolSelectors", "spec")
    for i, pool_name in enumerate(names):
        if pool_name not in pools:
            known = ", ".join(_q(p) for p in pools) or "none"
            res.err(f"spec.ipAddressPools[{i}]", f"unknown pool {_q(pool_name)} (defined pools: {known})")
    if not names and not spec.get("ipAddressPoolSelectors"):
        return list(pools)
    chosen = set(names)
    for pool in pools.values():
        if any(selector_matches(sel, pool.labels) for sel in pool_selectors):
            chosen.add(pool.name)
    return [p for p in pools if p in chosen]


def _parse_l2(res: _Res, pools: dict[str, Pool]) -> L2Advertisement:
    spec = res.spec
    adv = L2Advertisement(name=res.name, pools=_resolve_pools(res, pools))
    adv.node_selectors = res.selectors(spec, "nodeSelectors", "spec")
    adv.service_selectors = res.selectors(spec, "serviceSelectors", "spec")
    adv.interfaces = res.strings(spec, "interfaces", "spec")
    for i, ifname in enumerate(adv.interfaces):
        if not ifname or len(ifname) > 15 or "/" in ifname or any(c.isspace() for c in ifname):
            res.err(f"spec.interfaces[{i}]", f"invalid interface name {_q(ifname)}")
    preferred = spec.get("preferredNodeSelectors")
    if preferred is not None:
        if not isinstance(preferred, list):
            res.err("spec.preferredNodeSelectors", f"must be a list, got {preferred!r}")
        else:
            for i, item in enumerate(preferred):
                path = f"spec.preferredNodeSelectors[{i}]"
                if not isinstance(item, dict):
                    res.err(path, f"must be a mapping with weight and preference, got {item!r}")
                    continue
                res.check_fields(item, {"weight", "preference"}, path)
                weight = res.integer(item, "weight", path, 1, 100)
                if "weight" not in item:
                    res.err(f"{path}.weight", "missing weight")
                for problem in selector_problems(item.get("preference") or {}):
                    res.err(f"{path}.preference", problem)
                if weight is not None:
                    adv.preferred_node_selectors.append({"weight": weight, "preference": item.get("preference") or {}})
    return adv


def _parse_bgp_adv(res: _Res, pools: dict[str, Pool], communities: dict[str, str]) -> BGPAdvertisement:
    spec, name = res.spec, res.name
    adv = BGPAdvertisement(name=name, pools=_resolve_pools(res, pools))
    if not adv.pools and not (spec.get("ipAddressPools") and any(p not in pools for p in spec["ipAddressPools"]
                                                                 if isinstance(p, str))):
        # MetalLB would keep an advertisement that selects nothing; it can only be a mistake here
        field_name = "spec.ipAddressPoolSelectors" if spec.get("ipAddressPoolSelectors") else "spec"
        known = ", ".join(_q(p) for p in pools) or "none"
        res.err(field_name, f"BGPAdvertisement {_q(name)} selects no IPAddressPool (defined pools: {known})")
    adv.node_selectors = res.selectors(spec, "nodeSelectors", "spec")
    adv.service_selectors = res.selectors(spec, "serviceSelectors", "spec")
    adv.peers = res.strings(spec, "peers", "spec")
    length = res.integer(spec, "aggregationLength", "spec")
    if length is not None:
        if not 1 <= length <= 32:
            res.err("spec.aggregationLength", f"invalid aggregation length {length} for IPv4")
        else:
            adv.aggregation_length = length
    length6 = res.integer(spec, "aggregationLengthV6", "spec")
    if length6 is not None:
        if not 0 <= length6 <= 128:
            res.err("spec.aggregationLengthV6", f"invalid aggregation length {length6} for IPv6")
        else:
            adv.aggregation_length_v6 = length6
    if adv.service_selectors:
        if length is not None and length != 32:
            res.err("spec.aggregationLength",
                    f"serviceSelectors and aggregationLength are mutually exclusive, both cannot be set in {name}")
        if length6 is not None and length6 != 128:
            res.err("spec.aggregationLengthV6",
                    f"serviceSelectors and aggregationLengthV6 are mutually exclusive, both cannot be set in {name}")
    adv.local_pref = res.integer(spec, "localPref", "spec", 0, 2**32 - 1) or 0
    raw_communities = spec.get("communities")
    if isinstance(raw_communities, list):
        spec = dict(spec, communities=[yaml11_community(c) for c in raw_communities])
    for i, c in enumerate(res.strings(spec, "communities", "spec", "community")):
        if c in communities:
            adv.communities.append(communities[c])
            continue
        try:
            adv.communities.append(parse_community(c))
        except ValueError as exc:
            hint = ""
            if str(exc).startswith("invalid community format"):
                hint = " (neither a community value nor the name of one defined in a Community resource)"
            res.err(f"spec.communities[{i}]", f"invalid community {_q(c)} in BGP advertisement: {exc}{hint}")
    # Aggregation length against each pool's prefixes (MetalLB's validateBGPAdvPerPool).
    for pool_name in adv.pools:
        pool = pools[pool_name]
        for rng in pool.ranges:
            nets = rng.networks()
            lowest = min(n.prefixlen for n in nets)
            max_length = adv.aggregation_length if rng.version == 4 else adv.aggregation_length_v6
            if max_length < lowest:
                field_name = "spec.aggregationLength" + ("" if rng.version == 4 else "V6")
                res.err(field_name, f"invalid aggregation length {max_length}: prefix {lowest} in this pool is more "
                        f"specific than the aggregation length for addresses {rng.text} (pool {_q(pool_name)})")
    return adv


def _check_local_prefs(errors: _Errors, advs: list[BGPAdvertisement], pools: dict[str, Pool]) -> None:
    """MetalLB refuses two advertisements that would send the same update with different localPref."""
    for j, adv in enumerate(advs):
        if adv.service_selectors:
            continue
        for other in advs[:j]:
            if other.service_selectors or other.local_pref == adv.local_pref:
                continue
            shared = [p for p in adv.pools if p in other.pools]
            for pool_name in shared:
                fams = pools[pool_name].families()
                if 4 in fams and 6 not in fams and adv.aggregation_length != other.aggregation_length:
                    continue
                if 6 in fams and 4 not in fams and adv.aggregation_length_v6 != other.aggregation_length_v6:
                    continue
                if (adv.aggregation_length != other.aggregation_length
                        and adv.aggregation_length_v6 != other.aggregation_length_v6):
                    continue
                if adv.peers and other.peers and not set(adv.peers) & set(other.peers):
                    continue
                # Nodes are not known ahead of time: equal node selectors select the same nodes.
                if sorted(map(selector_text, adv.node_selectors)) != sorted(map(selector_text, other.node_selectors)):
                    continue
                errors.add(f"BGPAdvertisement {_q(adv.name)}", "spec.localPref",
                           f"invalid local preference {adv.local_pref}: local preferernce {other.local_pref} was "
                           "already set for the same type of BGP update. Check existing BGP advertisements with "
                           f"common pools and aggregation lengths (BGPAdvertisement {_q(other.name)}, pool "
                           f"{_q(pool_name)})")
                break


def _parse_peer(res: _Res, bfd: dict[str, BFDProfile], secrets: dict[str, dict]) -> BGPPeer | None:
    spec = res.spec
    my_asn = res.integer(spec, "myASN", "spec", 0, 2**32 - 1)
    peer = BGPPeer(name=res.name, my_asn=my_asn or 0)
    peer.peer_asn = res.integer(spec, "peerASN", "spec", 0, 2**32 - 1) or 0
    peer.local_asn = res.integer(spec, "localASN", "spec", 1, 2**32 - 1) or 0
    peer.dynamic_asn = res.string(spec, "dynamicASN", "spec")
    peer.address = res.string(spec, "peerAddress", "spec")
    peer.interface = res.string(spec, "interface", "spec")
    peer.source_address = res.string(spec, "sourceAddress", "spec")
    peer.port = res.integer(spec, "peerPort", "spec", 1, 16384) or 179
    peer.router_id = res.string(spec, "routerID", "spec")
    peer.node_selectors = res.selectors(spec, "nodeSelectors", "spec")
    peer.password = res.string(spec, "password", "spec")
    peer.bfd_profile = res.string(spec, "bfdProfile", "spec")
    peer.enable_graceful_restart = res.boolean(spec, "enableGracefulRestart", "spec")
    peer.ebgp_multihop = res.boolean(spec, "ebgpMultiHop", "spec")
    peer.vrf = res.string(spec, "vrf", "spec")
    peer.disable_mp = res.boolean(spec, "disableMP", "spec")
    peer.dual_stack_address_family = res.boolean(spec, "dualStackAddressFamily", "spec")

    if not my_asn:
        res.err("spec.myASN", "missing local ASN")
    if not peer.peer_asn and not peer.dynamic_asn:
        res.err("spec.peerASN", "missing peer ASN and dynamicASN")
    if peer.peer_asn and peer.dynamic_asn:
        res.err("spec.dynamicASN", f"both peer ASN and dynamicASN specified (peerASN {peer.peer_asn}, "
                f"dynamicASN {_q(peer.dynamic_asn)})")
    if peer.dynamic_asn and peer.dynamic_asn not in ("internal", "external"):
        res.err("spec.dynamicASN", f"invalid dynamicASN {peer.dynamic_asn} (must be internal or external)")
    if peer.peer_asn and peer.peer_asn == peer.my_asn and peer.ebgp_multihop:
        res.err("spec.ebgpMultiHop", "invalid ebgp-multihop parameter set for an ibgp peer")
    if not peer.address and not peer.interface:
        res.err("spec.peerAddress", "peer has no Address or Interface specified")
    if peer.address and peer.interface:
        res.err("spec.interface", f"peer has both Address and Interface specified ({_q(peer.address)} and "
                f"{_q(peer.interface)})")
    for key, address, what in (("peerAddress", peer.address, "invalid BGPPeer address"),
                               ("routerID", peer.router_id, "invalid router ID"),
                               ("sourceAddress", peer.source_address, "invalid source IP")):
        if address:
            try:
                ip = parse_ip(address)
            except ValueError:
                res.err(f"spec.{key}", f"{what} {_q(address)}")
                continue
            if key == "routerID" and ip.version != 4:
                res.err(f"spec.{key}", f"{what} {_q(address)}: a router ID is an IPv4 address")

    # Timers, as MetalLB's parseTimers.
    hold_text, ka_text = spec.get("holdTime"), spec.get("keepaliveTime")
    hold = ka = None
    timers_ok = True
    for key, timer_text in (("holdTime", hold_text), ("keepaliveTime", ka_text)):
        if timer_text is None:
            continue
        try:
            value = parse_duration(timer_text)
        except ValueError as exc:
            res.err(f"spec.{key}", f"invalid BGPPeer timers: {exc}")
            timers_ok = False
            continue
        if value < 0:
            res.err(f"spec.{key}", f"invalid BGPPeer timers: negative duration {_q(timer_text)}")
            timers_ok = False
            continue
        if key == "holdTime":
            hold = value
        else:
            ka = value
    if timers_ok and (hold is not None or ka is not None):
        if ka is None:
            ka = (hold or 0.0) / 3
        if hold is None:
            hold = ka * 3
        rounded = int(hold)
        shown = hold_text if hold_text is not None else f"{hold:g}s"
        if rounded != 0 and rounded < 3:
            res.err("spec.holdTime", f"invalid BGPPeer timers: invalid hold time {_q(shown)}: must be 0 or >=3s")
        elif ka > hold:
            res.err("spec.keepaliveTime", f"invalid BGPPeer timers: invalid keepaliveTime {_q(ka_text)}, must be "
                    f"lower than holdTime {_q(shown)}")
        elif hold >= MAX_BGP_TIMER + 1:
            # BGP carries the hold time in 16 bits: FRR's "timers" takes 0-65535 and refuses more
            res.err("spec.holdTime", f"invalid BGPPeer timers: invalid hold time {_q(shown)}: must be at most "
                    f"{MAX_BGP_TIMER}s (BGP's 16-bit field; FRR refuses more)")
        peer.hold_time, peer.keepalive_time = hold, ka

    connect = spec.get("connectTime")
    if connect is not None:
        try:
            seconds = parse_duration(connect)
        except ValueError as exc:
            res.err("spec.connectTime", str(exc))
        else:
            if not 1 <= seconds <= 65535:
                res.err("spec.connectTime", f"connect time should be between 1 seconds to 65535, got {_q(connect)}")
            elif abs(seconds - round(seconds)) > 1e-9:
                res.err("spec.connectTime", f"connect time should contain a whole number of seconds, got {_q(connect)}")
            else:
                peer.connect_time = seconds

    secret_ref = spec.get("passwordSecret")
    if secret_ref is not None:
        if not isinstance(secret_ref, dict):
            res.err("spec.passwordSecret", f"must be a mapping with name (and namespace), got {secret_ref!r}")
        else:
            res.check_fields(secret_ref, {"name", "namespace"}, "spec.passwordSecret")
            peer.password_secret = dict(secret_ref)
            secret_name = secret_ref.get("name")
            if peer.password and secret_name:
                res.err("spec.passwordSecret", "can not have both password and secret ref set in peer config "
                        f"{_q(res.meta.get('namespace') or '')}/{_q(res.name)}")
            elif secret_name:
                secret = secrets.get(str(secret_name))
                if secret is None:
                    res.err("spec.passwordSecret.name", f"secret ref not found for peer config {_q(res.name)}: "
                            f"no Secret named {_q(secret_name)}")
                elif secret.get("type") != "kubernetes.io/basic-auth":
                    res.err("spec.passwordSecret.name", f"secret type mismatch on {_q(secret_name)}, type "
                            f"\"kubernetes.io/basic-auth\" is expected (got {_q(secret.get('type'))})")
                elif "password" not in secret["data"]:
                    res.err("spec.passwordSecret.name", f"password not specified in the secret {_q(secret_name)}")
                else:
                    peer.password = secret["data"]["password"]
    password_file = spec.get("passwordFile")
    if password_file is not None:
        if not isinstance(password_file, str) or not password_file.startswith("/") or "\0" in password_file:
            res.err("spec.passwordFile", f"must be an absolute path, got {password_file!r}")
        elif peer.password_secret or spec.get("password") is not None:
            res.err("spec.passwordFile", "can not have both passwordFile and password or passwordSecret set in peer "
                    f"config {_q(res.name)}")
        else:
            peer.password_file = password_file
    if peer.password:
        problem = password_problem(peer.password)
        if problem:
            res.err("spec.passwordSecret.name" if peer.password_secret else "spec.password", problem)
    if peer.bfd_profile and peer.bfd_profile not in bfd:
        res.err("spec.bfdProfile", f"peer {res.name} referencing non existing bfd profile {peer.bfd_profile}")
    return peer


MAX_BGP_TIMER = 65535
MAX_PASSWORD_LENGTH = 80  # TCP MD5 signature keys (RFC 2385) are at most 80 bytes on Linux


def password_problem(password: str) -> str:
    """Why FRR cannot take ``password`` as a neighbour password ("" when it can); never quotes it."""
    if not password:
        return "invalid BGP password: empty"
    if len(password.encode("utf-8")) > MAX_PASSWORD_LENGTH:
        return f"invalid BGP password: longer than {MAX_PASSWORD_LENGTH} bytes (the TCP MD5 key limit)"
    if any(c.isspace() or not c.isprintable() or not c.isascii() or c in "!#" for c in password):
        return ("invalid BGP password: only printable ASCII without spaces, '!' or '#' fits on FRR's "
                "\"neighbor ... password\" line")
    return ""


def peer_identifier(peer: BGPPeer) -> str:
    """MetalLB's PeerIdentifier: the address (or interface), with "-vrf" when in a VRF."""
    ident = peer.address or peer.interface
    return f"{ident}-{peer.vrf}" if peer.vrf else ident


def _peers_share_node(a: BGPPeer, b: BGPPeer) -> bool:
    """Whether two peers may land on the same node (and so the same FRR instance).

    Nodes are not known when the configuration is checked. A peer without
    nodeSelectors reaches every node; two peers with the same selectors reach
    the same nodes; otherwise the selectors are taken as meant to be disjoint.
    """
    if not a.node_selectors or not b.node_selectors:
        return True
    return sorted(map(selector_text, a.node_selectors)) == sorted(map(selector_text, b.node_selectors))


def _check_frr_peer(res: _Res, peer: BGPPeer, earlier: list[BGPPeer]) -> None:
    """MetalLB's FRR-mode rules for peers that share a node (checkFRRPeersCompatible)."""
    for other in earlier:
        if not _peers_share_node(peer, other):
            continue
        if peer.router_id != other.router_id:
            res.err("spec.routerID", f"peer {peer.router_id} has RouterID different from {other.router_id}, in FRR "
                    f"mode peers selecting the same node must all have the same RouterID (BGPPeer {_q(other.name)})")
        elif peer_identifier(peer) == peer_identifier(other):
            res.err("spec.peerAddress" if peer.address else "spec.interface",
                    f"peer {peer_identifier(peer)} already exists, FRR mode doesn't support duplicate BGPPeers "
                    f"selecting the same node (BGPPeer {_q(other.name)})")
        elif peer.my_asn != other.my_asn and peer.vrf == other.vrf:
            res.err("spec.myASN", f"peer {peer_identifier(peer)} has myAsn different from {peer_identifier(other)}, in "
                    "FRR mode peers selecting the same node must have the same myAsn within the same VRF "
                    f"(BGPPeer {_q(other.name)})")
        else:
            continue
        return


def _check_bfd_echo(errors: _Errors, config: Config) -> None:
    """MetalLB refuses BFD echo mode towards peers that get IPv6 advertisements (validateConfig)."""
    peers = {p.name: p for p in config.bgp_peers}
    for pool in config.pools.values():
        if 6 not in pool.families():
            continue
        for adv in config.bgp_advertisements_for_pool(pool.name):
            targets = [peers[n] for n in adv.peers if n in peers] if adv.peers else list(peers.values())
            for peer in targets:
                profile = config.bfd_profiles.get(peer.bfd_profile)
                if profile is not None and profile.echo_mode:
                    errors.add(f"BGPAdvertisement {_q(adv.name)}", "spec.peers" if adv.peers else "spec",
                               f"pool {pool.name} has bgpadvertisement {adv.name} which references peer {peer.name} "
                               "which has bfd echo enabled, which is not possible (the pool has IPv6 addresses; "
                               f"BFDProfile {_q(profile.name)} sets echoMode)")
                    break


_BFD_FIELDS = (
    ("detectMultiplier", "detect_multiplier", 2, 255, "invalid detect multiplier value"),
    ("receiveInterval", "receive_interval", 10, 60000, "invalid receive interval value"),
    ("transmitInterval", "transmit_interval", 10, 60000, "invalid transmit interval value"),
    ("minimumTtl", "minimum_ttl", 1, 254, "invalid minimum ttl value"),
    ("echoInterval", "echo_interval", 10, 60000, "invalid echo interval value"),
)


def _parse_bfd(res: _Res) -> BFDProfile:
    profile = BFDProfile(name=res.name)
    for key, attr, low, high, what in _BFD_FIELDS:
        value = res.spec.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            res.err(f"spec.{key}", f"{what}: must be an integer, got {value!r}")
        elif not low <= value <= high:
            res.err(f"spec.{key}", f"{what}: invalid value {value}, must be in {low}-{high} range")
        else:
            setattr(profile, attr, value)
    profile.echo_mode = res.boolean(res.spec, "echoMode", "spec")
    profile.passive_mode = res.boolean(res.spec, "passiveMode", "spec")
    return profile


def _parse_community_res(res: _Res, communities: dict[str, str]) -> None:
    items = res.spec.get("communities")
    if items is None:
        return
    if not isinstance(items, list):
        res.err("spec.communities", f"must be a list of name/value pairs, got {items!r}")
        return
    for i, item in enumerate(items):
        path = f"spec.communities[{i}]"
        if not isinstance(item, dict):
            res.err(path, f"must be a mapping with name and value, got {item!r}")
            continue
        res.check_fields(item, {"name", "value"}, path)
        alias = item.get("name")
        if not isinstance(alias, str) or not alias:
            res.err(f"{path}.name", f"missing community name, got {alias!r}")
            continue
        try:
            value = parse_community(yaml11_community(item.get("value")))
        except ValueError as exc:
            res.err(f"{path}.value", f"parsing community {_q(alias)}: {exc}")
            continue
        if alias in communities:
            res.err(f"{path}.name", f"duplicate definition of community {_q(alias)}")
            continue
        communities[alias] = value


def _parse_service(res: _Res) -> Service | None:
    meta, spec = res.meta, res.spec
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        res.err("metadata.annotations", f"must be a mapping of strings, got {annotations!r}")
        annotations = {}
    svc = Service(namespace=str(meta.get("namespace") or "default"), name=res.name, labels=_labels(res),
                  annotations=dict(annotations), spec=spec, status=res.doc.get("status") or {})
    if "type" not in spec:
        res.err("spec.type", "missing: set type: LoadBalancer (Kubernetes would default to ClusterIP, which gets no "
                "address)")
    elif spec.get("type") != "LoadBalancer":
        res.err("spec.type", f"{_q(spec.get('type'))} is not supported: only services of type LoadBalancer get "
                "an address")
    for key in ("loadBalancerClass", "externalTrafficPolicy", "ipFamilyPolicy", "loadBalancerIP"):
        res.string(spec, key, "spec")
    if svc.traffic_policy not in ("Cluster", "Local"):
        res.err("spec.externalTrafficPolicy", f"Unsupported value: {_q(svc.traffic_policy)}: supported values: "
                "\"Cluster\", \"Local\"")
    # Ports.
    ports = spec.get("ports")
    if ports is not None and not isinstance(ports, list):
        res.err("spec.ports", f"must be a list, got {ports!r}")
        spec = dict(spec, ports=[])
        svc.spec = spec
    seen_ports: set[tuple[Any, Any]] = set()
    good_ports = []
    for i, port in enumerate(spec.get("ports") or []):
        path = f"spec.ports[{i}]"
        if not isinstance(port, dict):
            res.err(path, f"must be a mapping, got {port!r}")
            continue
        res.check_fields(port, SERVICE_PORT_FIELDS, path)
        number = port.get("port")
        proto = port.get("protocol") or "TCP"
        ok = True
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
            res.err(f"{path}.port", f"Invalid value: {number!r}: must be between 1 and 65535, inclusive")
            ok = False
        if proto not in ("TCP", "UDP", "SCTP"):
            res.err(f"{path}.protocol", f"Unsupported value: {_q(proto)}: supported values: \"SCTP\", \"TCP\", \"UDP\"")
            ok = False
        if ok:
            if (number, proto) in seen_ports:
                res.err(path, f"Duplicate value: port {number}/{proto}")
            seen_ports.add((number, proto))
            good_ports.append(port)
    if len(good_ports) != len(spec.get("ports") or []):
        svc.spec = dict(spec, ports=good_ports)
    # Requested addresses (MetalLB's getDesiredLbIPs) are the service's own business: a value that is not an
    # address, both fields at once or two addresses of one family fail that service alone, at allocation
    # (allocation.py), with MetalLB's "Failed to allocate IP for ..." message; the rest of the manifest stands.
    for name in (ANNOTATION_LOADBALANCER_IPS, DEPRECATED_PREFIX + "loadBalancerIPs"):
        value = annotations.get(name)
        if value is not None and not isinstance(value, str):
            res.err(f"metadata.annotations[{name}]", f"must be a string, got {value!r}")
    for key in (ANNOTATION_ADDRESS_POOL, ANNOTATION_ALLOW_SHARED_IP):
        for name in (key, DEPRECATED_PREFIX + key.split("/", 1)[1]):
            value = annotations.get(name)
            if value is not None and not isinstance(value, str):
                res.err(f"metadata.annotations[{name}]", f"must be a string, got {value!r}")
    # IP families.
    families = spec.get("ipFamilies")
    if isinstance(families, list) and all(isinstance(f, str) for f in families):
        # Kubernetes spells them IPv4/IPv6; MetalLB's docs show ipv4/ipv6, so accept any case.
        canonical = {"ipv4": "IPv4", "ipv6": "IPv6"}
        families = [canonical.get(f.lower(), f) for f in families]
        svc.spec = dict(svc.spec, ipFamilies=families)
    families_ok = True
    if families is not None:
        if (not isinstance(families, list) or not 1 <= len(families) <= 2
                or any(f not in ("IPv4", "IPv6") for f in families) or len(set(families)) != len(families)):
            families_ok = False
            res.err("spec.ipFamilies", f"Invalid value: {families!r}: must be one or two distinct values of "
                    "\"IPv4\", \"IPv6\"")
    policy = svc.ip_family_policy
    if policy not in ("SingleStack", "PreferDualStack", "RequireDualStack"):
        res.err("spec.ipFamilyPolicy", f"Unsupported value: {_q(policy)}: supported values: \"PreferDualStack\", "
                "\"RequireDualStack\", \"SingleStack\"")
    elif policy == "SingleStack" and families_ok and isinstance(families, list) and len(families) == 2:
        res.err("spec.ipFamilies", f"Invalid value: {families!r}: when spec.ipFamilyPolicy is SingleStack, "
                "only one IP family may be given")
    # Status written by address_allocate.
    status = res.doc.get("status")
    if status is not None:
        if not isinstance(status, dict):
            res.err("status", f"must be a mapping, got {status!r}")
            svc.status = {}
        else:
            res.check_fields(status, {"loadBalancer", "conditions"}, "status")
            lb = status.get("loadBalancer") or {}
            if not isinstance(lb, dict):
                res.err("status.loadBalancer", f"must be a mapping with ingress, got {lb!r}")
            res.check_fields(lb, {"ingress"}, "status.loadBalancer")
            ingress = lb.get("ingress") if isinstance(lb, dict) else None
            if ingress is not None and not isinstance(ingress, list):
                res.err("status.loadBalancer.ingress", f"must be a list, got {ingress!r}")
            for i, item in enumerate(ingress or [] if isinstance(ingress, list) else []):
                path = f"status.loadBalancer.ingress[{i}]"
                if not isinstance(item, dict):
                    res.err(path, f"must be a mapping with ip, got {item!r}")
                    continue
                res.check_fields(item, INGRESS_FIELDS, path)
                if item.get("ip") is not None:
                    try:
                        parse_ip(str(item["ip"]))
                    except ValueError:
                        res.err(f"{path}.ip", f"invalid IP address {_q(item['ip'])}")
    health = annotations.get(ANNOTATION_HEALTH_CHECK)
    if health not in (None, ""):
        try:
            parse_health_check(health, svc.ports)
        except ValueError as exc:
            res.err(f"metadata.annotations[{ANNOTATION_HEALTH_CHECK}]", f"invalid health check {_q(health)}: {exc}")
    return svc


def _parse_secret(res: _Res) -> dict:
    """A v1 Secret: only what a BGPPeer's passwordSecret needs (type and data, base64 decoded)."""
    import base64
    import binascii

    data: dict[str, str] = {}
    raw = res.doc.get("data") or {}
    if not isinstance(raw, dict):
        res.err("data", f"must be a mapping, got {raw!r}")
        raw = {}
    for key, value in raw.items():
        try:
            data[str(key)] = base64.b64decode(str(value), validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            res.err(f"data.{key}", "invalid base64 value")
    string_data = res.doc.get("stringData") or {}
    if not isinstance(string_data, dict):
        res.err("stringData", f"must be a mapping, got {string_data!r}")
        string_data = {}
    for key, value in string_data.items():
        data[str(key)] = str(value)
    return {"type": res.doc.get("type") or "Opaque", "data": data}


# --------------------------------------------------------------------------- entry point


def _flatten(docs: Any, errors: _Errors) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = []
    if not isinstance(docs, list):
        errors.items.append(f"resources: must be a list of documents, got {type(docs).__name__}")
        return out
    for index, doc in enumerate(docs):
        where = f"resources[{index}]"
        if doc is None:
            continue  # an empty YAML document (a stray ---)
        if not isinstance(doc, dict):
            errors.items.append(f"{where}: must be a mapping (a Kubernetes-style document), got {doc!r}")
            continue
        if doc.get("kind") == "List" and doc.get("apiVersion") == "v1":
            items = doc.get("items") or []
            if not isinstance(items, list):
                errors.items.append(f"{where}.items: must be a list of documents, got {items!r}")
                continue
            for sub, item in enumerate(items):
                if isinstance(item, dict):
                    out.append((f"{where}.items[{sub}]", item))
                else:
                    errors.items.append(f"{where}.items[{sub}]: must be a mapping, got {item!r}")
            continue
        out.append((where, doc))
    return out


def parse_resources(docs: list[dict]) -> Config:
    """Read MetalLB-shaped documents into a Config; raise ConfigError listing every problem."""
    errors = _Errors()
    by_kind: dict[str, list[_Res]] = {kind: [] for kind in KIND_ORDER}
    names_seen: dict[tuple[str, str], str] = {}
    for where, doc in _flatten(docs, errors):
        kind = doc.get("kind")
        api = doc.get("apiVersion")
        if not isinstance(kind, str) or kind not in KINDS:
            errors.items.append(f"{where}: unknown kind {_q(kind)} (apiVersion {_q(api)}); supported kinds: "
                                f"{', '.join(sorted(KINDS))}")
            continue
        versions, spec_fields = KINDS[kind]
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        namespace = (meta.get("namespace") if isinstance(meta, dict) else None) or "default"
        bad_namespace = not isinstance(namespace, str)
        if bad_namespace:
            namespace = str(namespace)
        label = f"{namespace}/{name}" if kind in ("Service", "Backends") else str(name)
        res_where = f"{kind} {_q(label)}" if name and isinstance(name, str) else f"{where} ({kind})"
        res = _Res(errors, kind, doc, res_where)
        if api not in versions:
            res.err("apiVersion", f"{_q(api)} is not supported for {kind}, use {' or '.join(versions)}")
        top = {"apiVersion", "kind", "metadata", "spec", "status"}
        if kind == "Secret":
            top = {"apiVersion", "kind", "metadata", "type", "data", "stringData", "immutable"}
        res.check_fields(doc, top, "")
        if not isinstance(meta, dict):
            res.err("metadata", f"missing metadata (name) in {kind}, got {meta!r}")
            continue
        res.check_fields(meta, OBJECT_META_FIELDS, "metadata")
        if name is not None and not isinstance(name, str):
            res.err("metadata.name", f"must be a string, got {name!r}")
            continue
        if not name:
            missing = {"IPAddressPool": "missing pool name", "BFDProfile": "missing bfd profile name"}
            res.err("metadata.name", missing.get(kind, f"missing {kind} name"))
            continue
        pattern, rule = _DNS1123_SUBDOMAIN, "a lowercase RFC 1123 subdomain"
        if kind == "Namespace":
            pattern, rule = _DNS1123_LABEL, "a lowercase RFC 1123 label"
        elif kind in ("Service", "Backends"):
            pattern, rule = _DNS1035_LABEL, "a DNS-1035 label (lowercase letters, digits, '-', starting with a letter)"
        if not pattern.match(name) or len(name) > (63 if kind in ("Namespace", "Service") else 253):
            res.err("metadata.name", f"{_q(name)} is not a valid name: must be {rule}")
        if bad_namespace:
            res.err("metadata.namespace", f"must be a string, got {meta.get('namespace')!r}")
        elif kind in ("Service", "Backends") and not _DNS1123_LABEL.match(namespace):
            res.err("metadata.namespace", f"{_q(namespace)} is not a valid namespace name")
        spec = doc.get("spec")
        if spec is not None and not isinstance(spec, dict):
            res.err("spec", f"must be a mapping, got {spec!r}")
        elif kind != "Secret":
            res.check_fields(spec, spec_fields, "spec")
        key = (kind, label)
        if key in names_seen:
            dup_msg = {
                "IPAddressPool": f"duplicate definition of pool {_q(name)}",
                "BFDProfile": f"found duplicate bfd profile name {name}",
            }.get(kind, f"duplicate definition of {kind} {_q(label)}")
            res.err("metadata.name", f"{dup_msg} (also at {names_seen[key]})")
            continue
        names_seen[key] = where
        by_kind[kind].append(res)

    config = Config()
    for res in by_kind["Namespace"]:
        config.namespaces[res.name] = _labels(res)
    for res in by_kind["Secret"]:
        config.secrets[res.name] = _parse_secret(res)
    for res in by_kind["BFDProfile"]:
        config.bfd_profiles[res.name] = _parse_bfd(res)
    for res in by_kind["Community"]:
        _parse_community_res(res, config.communities)
    for res in by_kind["IPAddressPool"]:
        pool = _parse_pool(res)
        if pool is not None:
            config.pools[pool.name] = pool
    errors.items.extend(find_overlaps(config.pools.values()))
    for res in by_kind["L2Advertisement"]:
        config.l2_advertisements.append(_parse_l2(res, config.pools))
    for res in by_kind["BGPPeer"]:
        peer = _parse_peer(res, config.bfd_profiles, config.secrets)
        if peer is not None:
            _check_frr_peer(res, peer, config.bgp_peers)
            config.bgp_peers.append(peer)
    peer_names = {p.name for p in config.bgp_peers}
    for res in by_kind["BGPAdvertisement"]:
        adv = _parse_bgp_adv(res, config.pools, config.communities)
        for i, peer_name in enumerate(adv.peers):
            if peer_name not in peer_names:
                res.err(f"spec.peers[{i}]", f"unknown peer {_q(peer_name)} (defined BGPPeers: "
                        f"{', '.join(_q(p) for p in sorted(peer_names)) or 'none'})")
        config.bgp_advertisements.append(adv)
    _check_local_prefs(errors, config.bgp_advertisements, config.pools)
    _check_bfd_echo(errors, config)
    for res in by_kind["Service"]:
        svc = _parse_service(res)
        if svc is not None:
            config.services.append(svc)
    if by_kind["Backends"]:  # mode: dataplane
        for res in by_kind["Backends"]:
            ns = str(res.meta.get("namespace") or "default")
            config.backends[f"{ns}/{res.name}"] = parse_backends_spec(
                ns, res.name, res.spec, config.service(f"{ns}/{res.name}"), res.err)
    if errors.items:
        raise ConfigError(errors.items)
    return config


# -- speaker config file: ``bgp.flowHandover`` (issue 9 point 8, the node-side flow handover) --------
#: Copied segments per second and family (speaker/nocloudlb/bgp/flows.py), and the burst: one second's worth.
FLOW_HANDOVER_RATE = 20000
FLOW_HANDOVER_RATE_RANGE = (100, 10_000_000)
FLOW_HANDOVER_BURST_RANGE = (1, 10_000_000)


def parse_flow_handover(value: Any) -> tuple[int, int, list[str]]:
    """``bgp.flowHandover`` of the speaker's config file -> (rate, burst, errors).

    ``{rate: segments/s, burst: segments}``, both whole numbers; absent: 20,000/s with a burst of
    one second's worth (``burst`` defaults to ``rate``). Over the limit a segment is dropped, never
    reset (its sender sends it again). Errors name the field and the value."""
    rate, burst = FLOW_HANDOVER_RATE, None
    errors: list[str] = []
    if value is None:
        value = {}
    if not isinstance(value, dict):
        return rate, rate, [f"bgp.flowHandover: must be a mapping like {{rate: 20000, burst: 20000}}, "
                            f"got {_q(value)}"]
    for key in sorted(set(value) - {"rate", "burst"}, key=str):
        errors.append(f"bgp.flowHandover: unknown key {_q(key)} (known: burst, rate)")
    for key, (low, high) in (("rate", FLOW_HANDOVER_RATE_RANGE), ("burst", FLOW_HANDOVER_BURST_RANGE)):
        if key not in value:
            continue
        got = value[key]
        if isinstance(got, bool) or not isinstance(got, int) or not low <= got <= high:
            unit = "segments per second" if key == "rate" else "segments"
            errors.append(f"bgp.flowHandover.{key}: {_q(got)} must be a whole number of {unit} "
                          f"from {low} to {high}")
        elif key == "rate":
            rate = got
        else:
            burst = got
    return rate, rate if burst is None else burst, errors


CONNECTION_SYNC_KEYS = ("binary", "commitTimeout", "enabled", "socket")
CONNECTION_SYNC_TIMEOUT = 0.3  # s: a takeover waits at most this long for the commit of the synced state
CONNECTION_SYNC_TIMEOUT_RANGE = (0.01, 5.0)


@dataclass(frozen=True)
class ConnectionSync:
    """``connectionSync`` of the speaker's config file: conntrackd's state sync for the data plane.

    ``socket``: conntrackd's UNIX control socket (its ``General { UNIX { Path } }``); ``binary``: the
    conntrackd program, run as the client (``-c`` commit, ``-s`` statistics); ``commit_timeout``: the
    longest a takeover waits for the commit before its first gratuitous ARP/NA."""

    enabled: bool = False
    socket: str = "/var/run/conntrackd.ctl"
    binary: str = "/usr/sbin/conntrackd"
    commit_timeout: float = CONNECTION_SYNC_TIMEOUT


def parse_connection_sync(value: Any) -> tuple[ConnectionSync, list[str]]:
    """``connectionSync`` of the speaker's config file -> (settings, errors).

    ``{enabled: bool, socket: absolute path, binary: absolute path, commitTimeout: seconds}``; absent:
    off. Errors name the field and the value."""
    if value is None:
        return ConnectionSync(), []
    if not isinstance(value, dict):
        return ConnectionSync(), [f"connectionSync: must be a mapping like {{enabled: true, socket: "
                                  f"/var/run/conntrackd.ctl}}, got {_q(value)}"]
    errors = [f"connectionSync: unknown key {_q(key)} (known: {', '.join(CONNECTION_SYNC_KEYS)})"
              for key in sorted(set(value) - set(CONNECTION_SYNC_KEYS), key=str)]
    out: dict[str, Any] = {}
    enabled = value.get("enabled", False)
    if not isinstance(enabled, bool):
        errors.append(f"connectionSync.enabled: {_q(enabled)} must be true or false")
    else:
        out["enabled"] = enabled
    for key in ("socket", "binary"):
        if key not in value:
            continue
        got = value[key]
        if not isinstance(got, str) or not got.startswith("/") or len(got) > 107 or any(
                c in got for c in "\n\r\t\0 "):
            errors.append(f"connectionSync.{key}: {_q(got)} must be an absolute path (at most 107 characters, "
                          "no spaces)")
        else:
            out[key] = got
    if "commitTimeout" in value:
        got = value["commitTimeout"]
        low, high = CONNECTION_SYNC_TIMEOUT_RANGE
        if isinstance(got, bool) or not isinstance(got, int | float) or not low <= got <= high:
            errors.append(f"connectionSync.commitTimeout: {_q(got)} must be a number of seconds from {low} to {high}")
        else:
            out["commit_timeout"] = float(got)
    return ConnectionSync(**out), errors
