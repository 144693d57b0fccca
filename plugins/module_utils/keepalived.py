# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The same VIPs as keepalived/VRRP: a pure plan and a renderer of keepalived.conf.

``plan(resources, nodes, options)`` reads the documents the speaker reads
(pools, L2Advertisements, Services with their allocated addresses, and our
``Backends`` kind) and the nodes (name, labels, interfaces, addresses), and
decides, for the whole cluster at once:

* the VRRP instances: one per VIP and interface (``group_by: vip``) or one per
  pool, family and interface (``group_by: pool``);
* their virtual router IDs, per interface and family (the VRRP ID space: IPv4
  and IPv6 use different virtual MACs), deterministic and stable: a previous
  assignment is kept, a new instance starts at a hash of its name and takes the
  next free ID; IDs listed as taken by other VRRP users are never used, pinned
  IDs that collide are refused, more instances than free IDs are refused naming
  the limit (255);
* the priorities: the candidates of a VIP (nodes the advertisements select) in
  our election order (``sha256(node#ip)``, preferredNodeSelectors first) get
  ``base``, ``base - step``, ...; keepalived preempts by default, so the first in
  our order takes the VIP back, as the speaker does. The step defaults to the
  candidates spread over the whole range (see ``spread_step``), not 1: backups
  wait ``(256 - priority) / 256 x advert_int`` after a master gives up, so
  neighbouring priorities fire 0.4 ms apart at 0.1 s adverts, too close for the
  first's advert to stop the second, and both become master;
* Local-policy services: a ``vrrp_script`` per service from its
  ``nocloud.io/health-check``, tracked with weight 0 (a failing check puts the
  instance in FAULT: the node gives the VIP up, as an unhealthy node stops
  being a candidate here);
* the drain label: a ``track_file`` with weight 0 on every instance (a non-zero
  value in the file puts the node in FAULT: its VIPs move, as when the speaker's
  node carries the label);
* ``virtual_server`` blocks for services that have Backends (NAT, DR, TUN;
  fullnat has no keepalived spelling and is refused).

``render(plan, node)`` turns one node's part into keepalived.conf text.
Everything is refused with a ConfigError naming the service, the node and the
limit before anything is written.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from .election import DRAIN_LABEL, NodeView, election_order, layer2_candidates, preferred_scores
from .errors import ConfigError
from .schema import Config, L2Advertisement, Service, parse_health_check, parse_resources

#: VRRP's virtual router ID range (RFC 5798): 8 bits, 0 is not a valid ID.
VRID_MIN = 1
VRID_MAX = 255
#: Priority 255 belongs to the address owner; backups use 1..254.
PRIORITY_MAX = 254
PRIORITY_MIN = 1

#: advert_int per timing profile, mirroring the speaker's membership profiles:
#: ``lan`` detects a dead master in ~3 s (3 x 1 s + skew), ``fast`` in ~0.3 s.
PROFILES: dict[str, float] = {"lan": 1.0, "fast": 0.1}

BACKENDS_KIND = "Backends"
BACKENDS_API = "nocloud.io/v1alpha1"
LB_KIND = {"nat": "NAT", "dr": "DR", "tun": "TUN"}
LB_ALGO = {"rr": "rr", "wrr": "wrr", "sh": "sh", "maglev": "mh"}

DEFAULTS: dict[str, Any] = {
    "version": 3,             # VRRP version: 3 (IPv4 + IPv6, centisecond adverts) or 2 (IPv4 only, seconds)
    "profile": "lan",         # lan | fast -> advert_int
    "advert_int": None,       # seconds; overrides the profile
    "group_by": "vip",        # vip | pool
    "interface": "eth0",      # the instances' interface when no L2Advertisement lists one
    "priority_base": PRIORITY_MAX,
    "priority_step": None,    # None: spread the candidates over 1..base (spread_step)
    "unicast": False,         # unicast_peer lists instead of multicast adverts
    "auth_pass": "",          # VRRPv2 only: simple password (8 characters at most)
    "vrids": {},              # pins: instance name or VIP -> VRID (refused when they collide)
    "previous": {},           # the last run's instance name -> VRID (kept when still free)
    "taken_vrids": [],        # [{interface, family: IPv4|IPv6, vrids: [...]}]: other VRRP users on the segment
    "drain_file": "/etc/keepalived/nocloudlb-drain",
    "script_user": "nobody",
    "services": None,         # service keys keepalived owns (None: every service); the speaker serves the rest
    "tcp_check_command": ["/bin/bash", "-c", "</dev/tcp/{host}/{port}"],
    "http_check_command": ["/usr/bin/curl", "-fsS", "-o", "/dev/null", "-k", "--max-time", "{timeout}", "{url}"],
}

_NAME_RE = re.compile(r"[^A-Za-z0-9_]")


def _q(value: object) -> str:
    return f'"{value}"'


@dataclass
class KNode:
    """A node as the keepalived plan sees it."""

    name: str
    labels: dict = field(default_factory=dict)
    interfaces: list[str] | None = None      # None: unknown, not checked
    addresses: list[str] = field(default_factory=list)
    interface: str = ""                      # default interface of this node ("" = the plan's)

    def address(self, family: int) -> str:
        for a in self.addresses:
            if ipaddress.ip_address(a).version == family:
                return a
        return ""


@dataclass
class Member:
    node: str
    priority: int
    interface: str


@dataclass
class Instance:
    """One vrrp_instance, the same on every node but for priority and interface."""

    name: str
    family: int
    segment: str                 # the VRID space: interface as named by the advertisement, or "default"
    vips: list[str]
    services: list[str]          # service keys served by the VIPs
    members: list[Member]        # in our election order (first = master)
    vrid: int = 0
    scripts: list[str] = field(default_factory=list)

    @property
    def master(self) -> str:
        return self.members[0].node


@dataclass
class VirtualServer:
    vip: str
    port: int
    protocol: str
    service: str
    method: str
    scheduler: str
    servers: list[dict]
    check: dict | None


@dataclass
class Plan:
    options: dict
    nodes: dict[str, KNode]
    instances: list[Instance]
    scripts: dict[str, dict]                 # script name -> {service, check, command}
    virtual_servers: list[VirtualServer]

    @property
    def advert_int(self) -> float:
        return float(self.options["advert_int"])

    def vrids(self) -> dict[str, int]:
        return {i.name: i.vrid for i in self.instances}

    def masters(self) -> dict[str, str]:
        """VIP -> the node keepalived makes MASTER (highest priority) when every member is up."""
        out: dict[str, str] = {}
        for inst in self.instances:
            if not inst.members:
                continue
            for vip in inst.vips:
                out.setdefault(vip, inst.master)
        return out


# --------------------------------------------------------------------------- options and inputs


def _options(options: dict | None) -> dict:
    opts = dict(DEFAULTS)
    unknown = sorted(set(options or {}) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"keepalived: unknown option {_q(unknown[0])} (known: {', '.join(sorted(DEFAULTS))})")
    opts.update({k: v for k, v in (options or {}).items() if v is not None})
    errors = []
    if opts["version"] not in (2, 3):
        errors.append(f"keepalived: version: must be 2 or 3, got {opts['version']!r}")
    if opts["profile"] not in PROFILES:
        errors.append(f"keepalived: profile: {_q(opts['profile'])} is not one of {', '.join(PROFILES)}")
    if opts["advert_int"] is None and opts["profile"] in PROFILES:
        opts["advert_int"] = PROFILES[opts["profile"]]
    adv = opts["advert_int"]
    if isinstance(adv, bool) or not isinstance(adv, (int, float)) or adv <= 0:
        errors.append(f"keepalived: advert_int: must be a positive number of seconds, got {adv!r}")
    elif opts["version"] == 2 and float(adv) != int(adv):
        errors.append(f"keepalived: advert_int {adv:g}s (profile {opts['profile']}) needs VRRPv3: VRRPv2 adverts are "
                      "whole seconds; set version 3 or profile lan")
    elif opts["version"] == 3 and not 0.01 <= float(adv) <= 40.95:
        errors.append(f"keepalived: advert_int {adv:g}s is outside VRRPv3's range 0.01-40.95 s")
    elif opts["version"] == 2 and not 1 <= float(adv) <= 255:
        errors.append(f"keepalived: advert_int {adv:g}s is outside VRRPv2's range 1-255 s")
    if opts["group_by"] not in ("vip", "pool"):
        errors.append(f"keepalived: group_by: {_q(opts['group_by'])} is not one of vip, pool")
    for key in ("priority_base", "priority_step"):
        v = opts[key]
        if key == "priority_step" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            errors.append(f"keepalived: {key}: must be an integer, got {v!r}")
    if isinstance(opts["priority_base"], int) and not PRIORITY_MIN <= opts["priority_base"] <= PRIORITY_MAX:
        errors.append(f"keepalived: priority_base: {opts['priority_base']} is outside {PRIORITY_MIN}-{PRIORITY_MAX} "
                      "(255 is reserved for the address owner)")
    if isinstance(opts["priority_step"], int) and opts["priority_step"] < 0:
        errors.append(f"keepalived: priority_step: must be >= 0, got {opts['priority_step']}")
    if opts["auth_pass"]:
        if opts["version"] != 2:
            errors.append("keepalived: auth_pass: VRRPv3 (RFC 5798) has no authentication; set version 2 or "
                          "leave auth_pass empty")
        elif not _simple_password(opts["auth_pass"]):
            errors.append("keepalived: auth_pass: must be 1-8 printable characters without spaces or quotes "
                          "(VRRPv2 simple password)")
    if not isinstance(opts["interface"], str) or not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", opts["interface"]):
        errors.append(f"keepalived: interface: {_q(opts['interface'])} is not an interface name")
    if not isinstance(opts["drain_file"], str) or not opts["drain_file"].startswith("/") or '"' in opts["drain_file"]:
        errors.append(f"keepalived: drain_file: must be an absolute path, got {opts['drain_file']!r}")
    if opts["services"] is not None:
        if not isinstance(opts["services"], (list, tuple)) or not all(isinstance(x, str) for x in opts["services"]):
            errors.append(f"keepalived: services: must be a list of service keys (namespace/name), got "
                          f"{opts['services']!r}")
        else:
            opts["services"] = set(opts["services"])
    if errors:
        raise ConfigError(errors)
    return opts


def _simple_password(value: Any) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= 8 and value.isprintable() and " " not in value \
        and '"' not in value


def _nodes(nodes: list) -> dict[str, KNode]:
    out: dict[str, KNode] = {}
    errors = []
    for i, raw in enumerate(nodes or []):
        if isinstance(raw, str):
            raw = {"name": raw}
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
            errors.append(f"keepalived: nodes[{i}]: must be a mapping with a name, got {raw!r}")
            continue
        unknown = sorted(set(raw) - {"name", "labels", "interfaces", "addresses", "interface"})
        if unknown:
            errors.append(f"keepalived: node {_q(raw['name'])}: unknown field {_q(unknown[0])}")
        addresses = [str(a).split("/", maxsplit=1)[0] for a in raw.get("addresses") or []]
        for a in addresses:
            try:
                ipaddress.ip_address(a)
            except ValueError:
                errors.append(f"keepalived: node {_q(raw['name'])}: addresses: {_q(a)} is not an IP address")
        if raw["name"] in out:
            errors.append(f"keepalived: node {_q(raw['name'])}: listed twice")
        ifaces = raw.get("interfaces")
        out[raw["name"]] = KNode(raw["name"], dict(raw.get("labels") or {}),
                                 None if ifaces is None else [str(x) for x in ifaces], addresses,
                                 str(raw.get("interface") or ""))
    if not out and not errors:
        errors.append("keepalived: nodes: at least one node is needed")
    if errors:
        raise ConfigError(errors)
    return out


def split_backends(resources: list) -> tuple[list, list]:
    """(MetalLB documents, Backends documents): our Backends kind is read here, not by parse_resources."""
    docs, backends = [], []
    for doc in resources or []:
        if isinstance(doc, dict) and doc.get("kind") == BACKENDS_KIND:
            backends.append(doc)
        else:
            docs.append(doc)
    return docs, backends


def parse_backends(docs: list, config: Config) -> dict[str, dict]:
    """Service key -> Backends spec, checked for what keepalived needs (see notes/MODES.md's shape)."""
    out: dict[str, dict] = {}
    errors = []
    for doc in docs:
        meta = doc.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        where = f"Backends {_q(key)}"
        spec = doc.get("spec") or {}
        if doc.get("apiVersion") != BACKENDS_API:
            errors.append(f"{where}: apiVersion: {_q(doc.get('apiVersion'))} is not supported, use {BACKENDS_API}")
        svc = config.service(key)
        if svc is None:
            errors.append(f"{where}: no Service {_q(key)} to serve")
            continue
        method = spec.get("method", "nat")
        if method == "fullnat":
            errors.append(f"{where}: spec.method: fullnat cannot be expressed in keepalived: LVS has no full-NAT "
                          "forwarding method (lb_kind is NAT, DR or TUN); use nat, dr or tun for this service, or "
                          "serve it with the speaker's data plane")
            continue
        if method not in LB_KIND:
            errors.append(f"{where}: spec.method: {_q(method)} is not one of nat, fullnat, dr, tun")
            continue
        scheduler = spec.get("scheduler", "rr")
        if scheduler not in LB_ALGO:
            errors.append(f"{where}: spec.scheduler: {_q(scheduler)} is not one of {', '.join(LB_ALGO)}")
            continue
        check = None
        if spec.get("healthCheck") is not None:
            raw = spec["healthCheck"]
            try:
                # keepalived checks each real server at its own address; the port is the one given,
                # else the server's (the sentinel 65535 stands for "not given")
                check = parse_health_check(raw, [(65535, "TCP")])
                if not _explicit_port(raw):
                    check["port"] = None
            except ValueError as exc:
                errors.append(f"{where}: spec.healthCheck: {exc}")
                continue
        servers = []
        for j, srv in enumerate(spec.get("servers") or []):
            try:
                addr = str(ipaddress.ip_address(str(srv.get("address"))))
            except (ValueError, AttributeError):
                errors.append(f"{where}: spec.servers[{j}].address: {srv!r} has no valid address")
                continue
            port = srv.get("port")
            weight = srv.get("weight", 1)
            if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
                errors.append(f"{where}: spec.servers[{j}].port: invalid port {port!r}")
                continue
            if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 256:
                errors.append(f"{where}: spec.servers[{j}].weight: {weight!r} is outside 1-256")
                continue
            if method in ("dr", "tun") and port is not None and any(port != p for p, _proto in svc.ports):
                errors.append(f"{where}: spec.servers[{j}].port: {port} differs from the service's port; "
                              f"{method} forwards the packet unchanged, so the real server must listen on the "
                              "service's port (keepalived would reset it)")
                continue
            servers.append({"address": addr, "port": port, "weight": weight})
        if not servers:
            errors.append(f"{where}: spec.servers: at least one server is needed")
            continue
        out[key] = {"method": method, "scheduler": scheduler, "check": check, "servers": servers}
    if errors:
        raise ConfigError(errors)
    return out


def _explicit_port(raw: Any) -> bool:
    if isinstance(raw, dict):
        return raw.get("port") is not None
    text = str(raw).strip()
    if text.startswith("{"):
        return '"port"' in text
    if text.startswith("exec:"):
        return False
    try:
        return urllib.parse.urlsplit(text).port is not None
    except ValueError:
        return False


# --------------------------------------------------------------------------- the plan


def _slug(text: str) -> str:
    return _NAME_RE.sub("_", text)


def _advertisements(config: Config, svc: Service, ip: str) -> list[L2Advertisement]:
    pool = config.pool_for_ip(ip)
    if pool is None:
        return []
    return [a for a in config.l2_advertisements_for_pool(pool.name) if a.selects_service(svc.labels)]


def _views(nodes: dict[str, KNode], config: Config) -> list[NodeView]:
    # the drain label and Local-policy health are runtime states in keepalived
    # (the track file, the vrrp_scripts), not reasons to leave a node out of the
    # config: every node the advertisements select gets its priority
    healthy = frozenset(s.key for s in config.services)
    return [NodeView(n.name, {k: v for k, v in n.labels.items() if k != DRAIN_LABEL}, healthy=healthy)
            for n in nodes.values()]


def _check_command(check: dict, opts: dict) -> list[str]:
    if check["type"] == "exec":
        return list(check["command"])
    host = check["host"]
    fmt = {"host": host, "port": check["port"], "timeout": f"{check['timeout']:g}"}
    if check["type"] == "tcp":
        return [w.format(**fmt) for w in opts["tcp_check_command"]]
    h = f"[{host}]" if ":" in host else host
    fmt["url"] = f"{check['type']}://{h}:{check['port']}{check['path']}"
    return [w.format(**fmt) for w in opts["http_check_command"]]


def spread_step(base: int, candidates: int) -> int:
    """The default priority step: ``candidates`` spread evenly over ``PRIORITY_MIN..base``.

    When a master gives up (priority 0, a drain or a failing check) every backup
    becomes master after its skew time, ``(256 - priority) / 256 x advert_int``.
    Two backups whose priorities differ by 1 fire 1/256 of an advert apart (0.4 ms
    at 0.1 s): the second fires before the first's advert reaches it, both send
    gratuitous ARPs, and a client may keep the MAC of the one that then steps
    back (seen in the lab: 5 s of echoes to a node without the VIP, until the
    master's second ARP burst). Spread, 3 nodes get 254, 128, 2: 49 ms apart."""
    if candidates <= 1:
        return 1
    return max(1, (base - PRIORITY_MIN) // (candidates - 1))


def plan(resources: list, nodes: list, options: dict | None = None) -> Plan:
    """The cluster's keepalived plan (see the module docstring). Raises ConfigError."""
    opts = _options(options)
    knodes = _nodes(nodes)
    docs, backend_docs = split_backends(resources)
    config = parse_resources(docs)
    backends = parse_backends(backend_docs, config)
    views = _views(knodes, config)
    errors: list[str] = []
    for key in sorted(opts["services"] or ()):
        if config.service(key) is None:
            errors.append(f"keepalived: services: no Service {_q(key)} in the resources")

    # VIP -> the services it serves (a shared IP serves several), in key order
    by_vip: dict[str, list[Service]] = {}
    for svc in sorted(config.services, key=lambda s: s.key):
        for ip in svc.ingress_ips:
            by_vip.setdefault(str(ipaddress.ip_address(ip)), []).append(svc)

    scripts: dict[str, dict] = {}
    # (group key) -> dict(vips, services, members, segment, family, ...)
    groups: dict[str, dict] = {}
    for vip in sorted(by_vip, key=lambda a: (ipaddress.ip_address(a).version, ipaddress.ip_address(a))):
        services = by_vip[vip]
        svc = services[0]
        owned = [opts["services"] is None or s.key in opts["services"] for s in services]
        if any(owned) and not all(owned):
            errors.append(f"keepalived: services {', '.join(_q(s.key) for s in services)} share VIP {vip}: "
                          "they move between keepalived and the speaker together (list all of them in services)")
            continue
        family = ipaddress.ip_address(vip).version
        if family == 6 and opts["version"] == 2:
            errors.append(f"keepalived: service {_q(svc.key)}: VIP {vip} is IPv6, which VRRPv2 cannot carry; "
                          "set version 3")
            continue
        advs = _advertisements(config, svc, vip)
        if not advs:
            continue  # not announced in layer 2 by the speaker either
        candidates = layer2_candidates(views, advs, svc)
        if not candidates:
            continue
        order = election_order(candidates, vip, preferred_scores(views, advs))
        ifaces: list[str] = []
        for adv in advs:
            ifaces += [i for i in adv.interfaces if i not in ifaces]
        segments = ifaces or ["default"]
        pool = config.pool_for_ip(vip)
        for seg in segments:
            if opts["group_by"] == "vip":
                gkey = f"vip_{_slug(vip)}_{_slug(seg)}"
            else:
                gkey = f"pool_{_slug(pool.name if pool else 'none')}_v{family}_{_slug(seg)}"
            g = groups.setdefault(gkey, {"vips": [], "services": [], "order": order, "segment": seg,
                                         "family": family, "first": (vip, svc.key), "owned": []})
            g["owned"].append(all(owned))
            g["vips"].append(vip)
            g["services"] += [s.key for s in services if s.key not in g["services"]]
            if g["order"] != order and opts["group_by"] == "pool":
                # the pool's instance follows its first VIP's election; say so where it differs
                g.setdefault("differs", []).append(vip)

    instances: list[Instance] = []
    base = opts["priority_base"]
    for gkey in sorted(groups):
        g = groups[gkey]
        vip0, key0 = g["first"]
        members: list[Member] = []
        step = opts["priority_step"] if opts["priority_step"] is not None else spread_step(base, len(g["order"]))
        for rank, node in enumerate(g["order"]):
            prio = base - rank * step
            kn = knodes[node]
            iface = g["segment"] if g["segment"] != "default" else (kn.interface or opts["interface"])
            if prio < PRIORITY_MIN:
                errors.append(f"keepalived: service {_q(key0)} (VIP {vip0}): node {_q(node)} would get priority "
                              f"{prio}, "
                              f"below VRRP's minimum {PRIORITY_MIN}: {len(g['order'])} candidates need "
                              f"priority_base - {len(g['order']) - 1} x priority_step >= {PRIORITY_MIN} "
                              f"(base {base}, step {step}; at most {PRIORITY_MAX} nodes per VIP)")
                break
            if members and members[-1].priority == prio:
                errors.append(f"keepalived: service {_q(key0)} (VIP {vip0}): nodes {_q(members[-1].node)} and "
                              f"{_q(node)} tie at priority {prio}: keepalived would break the tie by the higher "
                              f"primary IP address, not by our election order; priority_step must be >= 1")
                break
            if kn.interfaces is not None and iface not in kn.interfaces:
                errors.append(f"keepalived: service {_q(key0)} (VIP {vip0}): node {_q(node)} has no interface "
                              f"{_q(iface)} (it has: {', '.join(kn.interfaces) or 'none'})")
                continue
            if opts["unicast"] and not kn.address(g["family"]):
                errors.append(f"keepalived: service {_q(key0)} (VIP {vip0}): node {_q(node)} has no IPv{g['family']} "
                              "address for unicast adverts (nodes[].addresses)")
                continue
            members.append(Member(node, prio, iface))
        inst = Instance(gkey, g["family"], g["segment"], g["vips"], g["services"], members)
        for key in g["services"]:
            local = config.service(key)
            if local is None or local.traffic_policy != "Local":
                continue
            check = local.health_check
            sname = f"chk_{_slug(key)}"
            if check is None:
                errors.append(f"keepalived: service {_q(key)}: externalTrafficPolicy Local needs the "
                              "nocloud.io/health-check annotation (keepalived tracks it as a vrrp_script)")
                continue
            scripts[sname] = {"service": key, "check": check, "command": _check_command(check, opts)}
            inst.scripts.append(sname)
        instances.append(inst)

    # VRIDs over every instance, owned or not, so an ID does not depend on which side serves what
    _assign_vrids(instances, opts, errors)
    instances = [inst for inst in instances if all(groups[inst.name]["owned"])]
    if opts["group_by"] == "pool":
        for gkey, g in groups.items():
            if any(g["owned"]) and not all(g["owned"]):
                errors.append(f"keepalived: group_by pool: instance {gkey} holds VIPs of services keepalived owns and "
                              "of services it does not; move a pool's services together, or use group_by vip")
    used = {s for inst in instances for s in inst.scripts}
    scripts = {name: v for name, v in scripts.items() if name in used}

    vservers: list[VirtualServer] = []
    for key, spec in sorted(backends.items()):
        served = config.service(key)
        if served is None:
            continue
        for vip in served.ingress_ips:
            for port, proto in served.ports:
                if proto not in ("TCP", "UDP", "SCTP"):
                    continue
                vservers.append(VirtualServer(str(ipaddress.ip_address(vip)), port, proto, key, spec["method"],
                                              spec["scheduler"], spec["servers"], spec["check"]))
    if errors:
        raise ConfigError(errors)
    return Plan(opts, knodes, instances, scripts, vservers)


def _taken(opts: dict) -> dict[tuple[str, int], set[int]]:
    taken: dict[tuple[str, int], set[int]] = {}
    errors = []
    for i, t in enumerate(opts["taken_vrids"] or []):
        fam = {"IPv4": 4, "IPv6": 6, 4: 4, 6: 6, "ipv4": 4, "ipv6": 6}.get(t.get("family", "IPv4"))
        if fam is None or not t.get("interface"):
            errors.append(f"keepalived: taken_vrids[{i}]: needs interface and family IPv4|IPv6, got {t!r}")
            continue
        for v in t.get("vrids") or []:
            if isinstance(v, bool) or not isinstance(v, int) or not VRID_MIN <= v <= VRID_MAX:
                errors.append(f"keepalived: taken_vrids[{i}]: VRID {v!r} is outside {VRID_MIN}-{VRID_MAX}")
                continue
            taken.setdefault((str(t["interface"]), fam), set()).add(v)
    if errors:
        raise ConfigError(errors)
    return taken


def _assign_vrids(instances: list[Instance], opts: dict, errors: list[str]) -> None:
    """Deterministic, stable VRIDs per (interface, family)."""
    taken = _taken(opts)
    pins = {}
    for key, v in (opts["vrids"] or {}).items():
        if isinstance(v, bool) or not isinstance(v, int) or not VRID_MIN <= v <= VRID_MAX:
            errors.append(f"keepalived: vrids: {key}: VRID {v!r} is outside {VRID_MIN}-{VRID_MAX}")
        else:
            pins[str(key)] = v
    previous = opts["previous"] or {}
    spaces: dict[tuple[str, int], list[Instance]] = {}
    for inst in instances:
        spaces.setdefault((inst.segment, inst.family), []).append(inst)
    for (seg, fam), insts in sorted(spaces.items()):
        iface = seg if seg != "default" else opts["interface"]
        blocked = taken.get((iface, fam), set()) | (taken.get((seg, fam), set()))
        free = VRID_MAX - VRID_MIN + 1 - len(blocked)
        if len(insts) > free:
            errors.append(f"keepalived: interface {iface} IPv{fam}: {len(insts)} VRRP instances need {len(insts)} "
                          f"virtual router IDs, but VRRP has {VRID_MAX} per interface and family"
                          + (f" and {len(blocked)} are taken ({free} free)" if blocked else "")
                          + f"; services: {', '.join(sorted({s for i in insts for s in i.services})[:5])}"
                          + (" ..." if len(insts) > 5 else "")
                          + "; use group_by: pool, another interface, or fewer VIPs")
            continue
        used: dict[int, str] = {}
        # 1. pins: by instance name or by any of its VIPs
        for inst in sorted(insts, key=lambda i: i.name):
            pin = pins.get(inst.name) or next((pins[v] for v in inst.vips if v in pins), None)
            if pin is None:
                continue
            svc = inst.services[0] if inst.services else inst.name
            if pin in blocked:
                errors.append(f"keepalived: service {_q(svc)} ({inst.name}): pinned VRID {pin} collides with a VRID "
                              f"taken by another VRRP user on {iface} IPv{fam} (taken_vrids)")
            elif pin in used:
                errors.append(f"keepalived: service {_q(svc)} ({inst.name}): pinned VRID {pin} collides with "
                              f"{used[pin]} on {iface} IPv{fam}")
            else:
                used[pin] = inst.name
                inst.vrid = pin
        # 2. the last run's IDs, when still free
        for inst in sorted(insts, key=lambda i: i.name):
            prev = previous.get(inst.name)
            if inst.vrid or not isinstance(prev, int) or isinstance(prev, bool):
                continue
            if VRID_MIN <= prev <= VRID_MAX and prev not in blocked and prev not in used:
                used[prev] = inst.name
                inst.vrid = prev
        # 3. new instances: hash of the name, then the next free ID
        for inst in sorted(insts, key=lambda i: i.name):
            if inst.vrid:
                continue
            start = int.from_bytes(hashlib.sha256(inst.name.encode()).digest()[:4], "big") % VRID_MAX
            for k in range(VRID_MAX):
                cand = (start + k) % VRID_MAX + VRID_MIN
                if cand not in blocked and cand not in used:
                    used[cand] = inst.name
                    inst.vrid = cand
                    break
            else:  # pins took the rest
                errors.append(f"keepalived: service {_q(inst.services[0] if inst.services else inst.name)}: no free "
                              f"virtual router ID on {iface} IPv{fam} (limit {VRID_MAX})")


# --------------------------------------------------------------------------- rendering


def _fmt_interval(seconds: float) -> str:
    return f"{seconds:g}"


def _script_line(words: list[str]) -> str:
    for w in words:
        if '"' in w:
            raise ConfigError(f"keepalived: health check command {words!r}: double quotes cannot be passed to "
                              "keepalived's script parser")
    parts = []
    for w in words:
        if w == "" or any(c in w for c in " \t'"):
            if "'" in w:
                raise ConfigError(f"keepalived: health check command {words!r}: a word with a space and a single "
                                  "quote cannot be quoted for keepalived")
            parts.append(f"'{w}'")
        else:
            parts.append(w)
    return '"' + " ".join(parts) + '"'


def _vip_line(vip: str) -> str:
    return f"{vip}/{32 if ipaddress.ip_address(vip).version == 4 else 128}"


def _checker(check: dict, server: dict, port: int) -> list[str]:
    cport = check.get("port") or port
    timeout = max(1, math.ceil(check["timeout"]))
    retry = [f"retry {check['fall'] - 1}", f"delay_before_retry {max(1, math.ceil(check['interval']))}"]
    if check["type"] == "tcp":
        return ["TCP_CHECK {", f"    connect_port {cport}", f"    connect_timeout {timeout}",
                *("    " + r for r in retry), "}"]
    if check["type"] in ("http", "https"):
        kind = "HTTP_GET" if check["type"] == "http" else "SSL_GET"
        return [f"{kind} {{", "    url {", f"        path {check['path']}", "        status_code 200-399", "    }",
                f"    connect_port {cport}", f"    connect_timeout {timeout}", *("    " + r for r in retry), "}"]
    return ["MISC_CHECK {", f"    misc_path {_script_line(check['command'])}", f"    misc_timeout {timeout}",
            *("    " + r for r in retry), "}"]


def render(p: Plan, node: str, only: set[str] | None = None) -> str:
    """keepalived.conf for ``node`` (a name in the plan's nodes).

    ``only`` (service keys) keeps just the instances and virtual servers of those
    services (for comparisons; the result is still a complete config)."""
    if node not in p.nodes:
        raise ConfigError(f"keepalived: node {_q(node)} is not in the plan's nodes ({', '.join(sorted(p.nodes))})")
    o = p.options
    kn = p.nodes[node]
    mine = [(inst, m) for inst in p.instances for m in inst.members
            if m.node == node and (only is None or set(inst.services) & only)]
    out = [
        f"# keepalived.conf for node {node}, rendered by nocloud.loadbalancer (keepalived_render) from the same",
        "# pools, advertisements and services the speaker reads. Do not edit: changes are overwritten.",
        f"# VRRPv{o['version']}, advert_int {_fmt_interval(p.advert_int)} s (profile {o['profile']}); "
        "priorities follow sha256(node#vip), preempting.",
        "",
        "global_defs {",
        f"    router_id {_slug(node)}",
        f"    vrrp_version {o['version']}",
        "    # scripts run unprivileged and must not be writable by others",
        "    enable_script_security",
        f"    script_user {o['script_user']}",
        "}",
        "",
        "# The drain label: write 1 to this file and every instance of this node goes to FAULT (its VIPs move",
        "# to the next node in the election order); 0 gives them back.",
        "track_file nocloudlb_drain {",
        f"    file \"{o['drain_file']}\"",
        "    weight 0",
        "    init_file 0",
        "}",
    ]
    for inst, _member in mine:
        out += [
            "",
            f"# Held while a migration reloads this node: 1 keeps {inst.name} in FAULT (it never claims the VIP",
            "# before it has heard the master), 0 releases it (roles/keepalived/tasks/migrate_keepalived.yml).",
            f"track_file {_hold_name(inst)} {{",
            f"    file \"{hold_file(o['drain_file'], inst.name)}\"",
            "    weight 0",
            "    init_file 0",
            "}",
        ]
    used_scripts = sorted({s for inst, _member in mine for s in inst.scripts})
    for sname in used_scripts:
        s = p.scripts[sname]
        c = s["check"]
        out += [
            "",
            f"# Local policy of {s['service']}: the node gives the VIP up while its health check fails",
            f"vrrp_script {sname} {{",
            f"    script {_script_line(s['command'])}",
            f"    interval {max(1, math.ceil(c['interval']))}",
            f"    timeout {max(1, math.ceil(c['timeout']))}",
            f"    rise {c['rise']}",
            f"    fall {c['fall']}",
            "    weight 0",
            "}",
        ]
    for inst, m in mine:
        rank = [x.node for x in inst.members].index(node)
        out += [
            "",
            f"# {', '.join(inst.services)}: election order {' > '.join(x.node for x in inst.members)}",
            f"vrrp_instance {inst.name} {{",
            f"    state {'MASTER' if rank == 0 else 'BACKUP'}",
            f"    interface {m.interface}",
            f"    virtual_router_id {inst.vrid}",
            f"    priority {m.priority}",
            f"    advert_int {_fmt_interval(p.advert_int)}",
        ]
        if o["unicast"]:
            peers = [p.nodes[x.node].address(inst.family) for x in inst.members if x.node != node]
            out.append(f"    unicast_src_ip {kn.address(inst.family)}")
            out += ["    unicast_peer {", *(f"        {a}" for a in peers), "    }"]
        if o["auth_pass"]:
            out += ["    authentication {", "        auth_type PASS", f"        auth_pass {o['auth_pass']}", "    }"]
        out += ["    virtual_ipaddress {", *(f"        {_vip_line(v)}" for v in inst.vips), "    }"]
        out += ["    track_file {", "        nocloudlb_drain", f"        {_hold_name(inst)}", "    }"]
        if inst.scripts:
            out += ["    track_script {", *(f"        {s}" for s in inst.scripts), "    }"]
        out.append("}")
    my_vips = {v for inst, _member in mine for v in inst.vips}
    for vs in p.virtual_servers:
        if vs.vip not in my_vips or (only is not None and vs.service not in only):
            continue
        interval = vs.check["interval"] if vs.check else 6
        out += [
            "",
            f"# Backends of {vs.service} ({vs.method}, {vs.scheduler})",
            f"virtual_server {vs.vip} {vs.port} {{",
            f"    delay_loop {max(1, math.ceil(interval))}",
            f"    lb_algo {LB_ALGO[vs.scheduler]}",
            f"    lb_kind {LB_KIND[vs.method]}",
            f"    protocol {vs.protocol}",
        ]
        for srv in vs.servers:
            port = srv["port"] or vs.port
            out += [f"    real_server {srv['address']} {port} {{", f"        weight {srv['weight']}"]
            if vs.check:
                out += ["        " + line for line in _checker(vs.check, srv, port)]
            out.append("    }")
        out.append("}")
    return "\n".join(out) + "\n"


def hold_file(drain_file: str, instance: str) -> str:
    """The track file that holds one instance in FAULT during a migration, beside the drain file."""
    return f"{drain_file.rsplit('/', 1)[0]}/nocloudlb-hold-{instance}"


def _hold_name(inst: Instance) -> str:
    return f"nocloudlb_hold_{inst.name}"


def summary(p: Plan) -> list[dict]:
    """JSON-able instances: name, family, interface space, VRID, VIPs, hold file, services, members (node, priority)."""
    return [{"name": i.name, "family": f"IPv{i.family}", "segment": i.segment, "vrid": i.vrid, "vips": i.vips,
             "hold_file": hold_file(p.options["drain_file"], i.name),
             "services": i.services, "master": i.master if i.members else None,
             "members": [{"node": m.node, "priority": m.priority, "interface": m.interface} for m in i.members],
             "scripts": i.scripts} for i in p.instances]


def service_views(p: Plan, resources: list, key: str) -> dict:
    """Both systems' view of one service: ``speaker`` (its documents and who announces it, in our
    election order) and ``keepalived`` (the master's config reduced to the service's blocks)."""
    insts = [i for i in p.instances if key in i.services]
    docs = []
    for doc in resources or []:
        if not isinstance(doc, dict) or doc.get("kind") not in ("Service", BACKENDS_KIND):
            continue
        meta = doc.get("metadata") or {}
        if f"{meta.get('namespace') or 'default'}/{meta.get('name')}" == key:
            docs.append(doc)
    if not docs:
        raise ConfigError(f"keepalived: service {_q(key)}: no such Service in the resources")
    lines = [f"# speaker: {key}, answered by the first live candidate in this order (sha256(node#vip))"]
    for inst in insts:
        lines.append(f"# {', '.join(inst.vips)} on {inst.segment}: {' > '.join(m.node for m in inst.members)}")
    lines.append(json.dumps(docs, indent=2, sort_keys=True))
    master = insts[0].master if insts and insts[0].members else sorted(p.nodes)[0]
    return {"speaker": "\n".join(lines) + "\n", "keepalived": render(p, master, {key}), "master": master}
