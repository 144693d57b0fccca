"""The node's whole FRR configuration (bgpd, bfdd) from a BgpDecision, rendered with Jinja2.

Per peer and family: an outbound route-map whose entries match per-peer prefix lists, so that
the peer gets exactly the prefixes ``bgp_decision`` gave it, with their attributes, and nothing
outside the pools:

- a ``deny`` entry for the prefixes this router announces to other peers only (per prefix);
- a ``permit`` entry per group of attributes (communities, localPref) for all groups but the
  largest, listing their prefixes one by one;
- last, the largest group, matched by the pools' CIDRs (``permit CIDR ge 32 le 32``, ``ge 128
  le 128``; ``ge`` is the shortest aggregate), one line per pool CIDR whatever the number of VIPs.
  FRR 8.4 charges for each prefix-list entry in proportion to the list's length (1,000 entries
  took 30-34 s of vtysh here, 500 took 9-11 s; 1,000 ``network`` lines 0.1 s), so the common case
  (the VIPs of a pool share their peers and attributes) stays linear.

A peer with nothing to announce gets a ``deny any`` list, and every inbound route-map denies
everything (a node never learns routes). ``network`` statements hold the union of the prefixes
of a router (``no bgp network import-check``: FRR announces them whether or not the RIB has them).
The password appears only in the file (0640 root:frr); ``redact`` hides it for logs and diffs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jinja2

from nocloudlb.core.bgp import BgpDecision, Route, is_ibgp
from nocloudlb.core.schema import BFDProfile, BGPPeer, Config

# The first line marks the file as the speaker's: the frr role keeps a frr.conf without it (one the
# operator or the package wrote) as frr.conf.nocloudlb-backup before the speaker replaces it. FRR and
# frr-reload skip comment lines, so it never shows in a diff against the running config.
MARKER = "nocloudlb-managed"
TEMPLATE = """\
! nocloudlb-managed: written by the nocloudlb speaker (BGP mode), replaced on every change
frr defaults traditional
hostname {{ hostname }}
log syslog informational
service integrated-vtysh-config
{# the forwarding switches as they are: frr-reload would otherwise turn them #}
{% if not forwarding[0] %}
no ip forwarding
{% endif %}
{% if not forwarding[1] %}
no ipv6 forwarding
{% endif %}
!
{% if bfd_profiles %}
bfd
{% for p in bfd_profiles %}
 profile {{ p.name }}
{# only values other than bfdd's defaults: FRR does not show defaults, so frr-reload's diff stays empty #}
{% if p.detect_multiplier != 3 %}
  detect-multiplier {{ p.detect_multiplier }}
{% endif %}
{% if p.receive_interval != 300 %}
  receive-interval {{ p.receive_interval }}
{% endif %}
{% if p.transmit_interval != 300 %}
  transmit-interval {{ p.transmit_interval }}
{% endif %}
{% if p.echo_mode %}
  echo-mode
{% endif %}
{% if p.echo_interval != 50 %}
  echo transmit-interval {{ p.echo_interval }}
  echo receive-interval {{ p.echo_interval }}
{% endif %}
{% if p.passive_mode %}
  passive-mode
{% endif %}
{% if p.minimum_ttl != 254 %}
  minimum-ttl {{ p.minimum_ttl }}
{% endif %}
 exit
 !
{% endfor %}
exit
!
{% endif %}
{% for r in routers %}
router bgp {{ r.asn }}{% if r.vrf %} vrf {{ r.vrf }}{% endif %}

{% if r.router_id %}
 bgp router-id {{ r.router_id }}
{% endif %}
 no bgp ebgp-requires-policy
 no bgp default ipv4-unicast
 no bgp network import-check
{% for n in r.neighbors %}
 neighbor {{ n.id }}{% if n.interface %} interface{% endif %} remote-as {{ n.remote_as }}
{% if n.local_as %}
 neighbor {{ n.id }} local-as {{ n.local_as }} no-prepend replace-as
{% endif %}
{% if n.advertisement_interval %}
 neighbor {{ n.id }} advertisement-interval 0
{% endif %}
{% if n.port != 179 %}
 neighbor {{ n.id }} port {{ n.port }}
{% endif %}
{% if n.timers %}
 neighbor {{ n.id }} timers {{ n.timers[0] }} {{ n.timers[1] }}
{% endif %}
{% if n.connect %}
 neighbor {{ n.id }} timers connect {{ n.connect }}
{% endif %}
{% if n.password %}
 neighbor {{ n.id }} password {{ n.password }}
{% endif %}
{% if n.ebgp_multihop %}
 neighbor {{ n.id }} ebgp-multihop
{% endif %}
{% if n.source %}
 neighbor {{ n.id }} update-source {{ n.source }}
{% endif %}
{% if n.bfd_profile %}
 neighbor {{ n.id }} bfd
 neighbor {{ n.id }} bfd profile {{ n.bfd_profile }}
{% endif %}
{% if n.graceful_restart %}
 neighbor {{ n.id }} graceful-restart
{% endif %}
{% endfor %}
{% for fam in ("ipv4", "ipv6") %}
{% if r.families[fam] %}
 !
 address-family {{ fam }} unicast
{% for prefix in r.networks[fam] %}
  network {{ prefix }}
{% endfor %}
{% for n in r.neighbors if fam in n.families %}
  neighbor {{ n.id }} activate
  neighbor {{ n.id }} route-map {{ n.rm }}-in in
  neighbor {{ n.id }} route-map {{ n.rm }}-out out
{% endfor %}
 exit-address-family
{% endif %}
{% endfor %}
exit
!
{% endfor %}
{% for pl in prefix_lists %}
{% for line in pl.lines %}
{{ pl.kind }} prefix-list {{ pl.name }} seq {{ loop.index * 5 }} {{ line }}
{% endfor %}
!
{% endfor %}
{% for rm in route_maps %}
route-map {{ rm.name }}-in deny 20
exit
!
{% for e in rm.entries %}
route-map {{ rm.name }}-out {{ e.action }} {{ e.seq }}
 match {{ e.kind }} address prefix-list {{ e.prefix_list }}
{% if e.communities %}
 set community {{ e.communities | join(" ") }}
{% endif %}
{% if e.large %}
 set large-community {{ e.large | join(" ") }}
{% endif %}
{% if e.local_pref %}
 set local-preference {{ e.local_pref }}
{% endif %}
exit
!
{% endfor %}
{% endfor %}
end
"""

_ENV = jinja2.Environment(trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True,
                          undefined=jinja2.StrictUndefined, autoescape=False)
_TEMPLATE = _ENV.from_string(TEMPLATE)
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_PASSWORD = re.compile(r"(neighbor \S+ password )([^\s'\"]+)")


@dataclass
class Rendered:
    """The text for frr.conf and what it announces (router key -> family -> prefixes)."""

    text: str
    networks: dict[tuple[str, int], dict[str, list[str]]] = field(default_factory=dict)
    secrets: frozenset[str] = frozenset()

    @property
    def redacted(self) -> str:
        return redact(self.text, self.secrets)


def redact(text: str, secrets: frozenset[str] | set[str] = frozenset()) -> str:
    """``text`` with every neighbour password (and every value in ``secrets``) replaced by ``********``."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "********")
    return _PASSWORD.sub(r"\1********", text)


def rm_name(peer: BGPPeer) -> str:
    """The name of a peer's route-maps and prefix lists (FRR names: no spaces; ours are RFC 1123)."""
    return "nlb-" + peer.name


def _family(route: Route) -> str:
    return "ipv4" if route.version == 4 else "ipv6"


def peer_families(peer: BGPPeer) -> list[str]:
    """The address families a peer's session carries ("ipv4", "ipv6")."""
    if peer.interface or peer.dual_stack_address_family:
        return ["ipv4", "ipv6"]
    return ["ipv4" if ipaddress.ip_address(peer.address).version == 4 else "ipv6"]


def peer_wants(decision: BgpDecision) -> dict[str, dict[str, set[str]]]:
    """Peer name -> family -> the prefixes the decision gives that peer (what its route-map lets out)."""
    out: dict[str, dict[str, set[str]]] = {}
    for peer in decision.peers:
        fams = peer_families(peer)
        out[peer.name] = {fam: set() for fam in fams}
        for rt in decision.routes.get(peer.name, []):
            if _family(rt) in fams:
                out[peer.name][_family(rt)].add(rt.prefix)
    return out


def forwarding_needed(config: Config) -> tuple[bool, bool]:
    """IPv4 and IPv6 forwarding that the data plane needs (NAT and full-NAT route what they rewrite):
    rendered as on, so that a reload that runs before the data plane switched it on never turns it off."""
    v4 = v6 = False
    for b in (getattr(config, "backends", None) or {}).values():
        if getattr(b, "method", "") in ("nat", "fullnat"):
            versions = {getattr(s, "version", 4) for s in getattr(b, "servers", [])}
            v4, v6 = v4 or 4 in versions, v6 or 6 in versions
    return v4, v6


_ROUTER_LINE = re.compile(r"^router bgp (\d+)(?: vrf (\S+))?\s*$")
_AF_LINE = re.compile(r"^\s*address-family (ipv4|ipv6) unicast\s*$")
_NETWORK_LINE = re.compile(r"^\s*network (\S+)\s*$")


def _walk(text: str) -> Iterator[tuple[str, tuple[str, int] | None, str, str]]:
    """Each line of a frr.conf (or bgpd's running config) with the router (vrf, asn) and address
    family it is under, and the prefix when it is a ``network`` line there ("" otherwise)."""
    key: tuple[str, int] | None = None
    fam = ""
    for line in text.splitlines(keepends=True):
        m = _ROUTER_LINE.match(line)
        if m:
            key, fam = (m.group(2) or "", int(m.group(1))), ""
        elif line.startswith(("exit", "!")) and not line.startswith(" "):
            key, fam = (None, "") if line.startswith("exit") else (key, fam)
        elif (a := _AF_LINE.match(line)) is not None:
            fam = a.group(1)
        elif line.strip() == "exit-address-family":
            fam = ""
        elif (n := _NETWORK_LINE.match(line)) is not None and key is not None and fam:
            yield line, key, fam, n.group(1)
            continue
        yield line, key, fam, ""


def strip_networks(text: str, gone: dict[tuple[str, int], dict[str, list[str]]] | None) -> str:
    """``text`` (a frr.conf) without the ``network`` lines of ``gone`` (router key -> family ->
    prefixes), each removed only under its own ``router bgp ASN [vrf V]`` and address family;
    ``gone`` None: without every ``network`` line of every router and family."""
    return "".join(line for line, key, fam, prefix in _walk(text)
                   if not prefix or (gone is not None and key is not None
                                     and prefix not in gone.get(key, {}).get(fam, ())))


def networks_in(text: str) -> dict[tuple[str, int], dict[str, list[str]]]:
    """The ``network`` lines of a frr.conf or of bgpd's running config: router key -> family -> prefixes."""
    out: dict[tuple[str, int], dict[str, list[str]]] = {}
    for _line, key, fam, prefix in _walk(text):
        if prefix and key is not None:
            out.setdefault(key, {}).setdefault(fam, []).append(prefix)
    return out


def _neighbor(peer: BGPPeer, profiles: dict[str, BFDProfile]) -> dict[str, Any]:
    families = set(peer_families(peer))
    timers = None
    if peer.hold_time is not None and peer.keepalive_time is not None:
        timers = (int(peer.keepalive_time), int(peer.hold_time))
    return {
        "id": peer.interface or peer.address,
        "interface": bool(peer.interface),
        "remote_as": peer.dynamic_asn or peer.peer_asn,
        "local_as": peer.local_asn if peer.local_asn and peer.local_asn != peer.my_asn else 0,
        "port": peer.port,
        "timers": timers,
        "connect": int(peer.connect_time) if peer.connect_time else 0,
        "password": peer.password,
        "ebgp_multihop": peer.ebgp_multihop and not is_ibgp(peer),
        "source": peer.source_address,
        "bfd_profile": peer.bfd_profile if peer.bfd_profile in profiles else "",
        "graceful_restart": peer.enable_graceful_restart,
        "families": sorted(families),
        "rm": rm_name(peer),
        "advertisement_interval": not is_ibgp(peer),  # eBGP MRAI: FRR's traditional default is 30 s
    }


def _pool_cidrs(config: Config) -> dict[str, list[IPNetwork]]:
    """Every pool's CIDRs per family (ranges ``a-b`` as the fewest CIDRs that cover them exactly)."""
    out: dict[str, list[IPNetwork]] = {"ipv4": [], "ipv6": []}
    for pool in config.pools.values():
        for rng in pool.ranges:
            out["ipv4" if rng.version == 4 else "ipv6"].extend(rng.networks())
    return out


def _bounded(prefixes: list[str], cidrs: list[IPNetwork]) -> list[str]:
    """Prefix-list lines that match ``prefixes`` and nothing outside the pools: for each pool CIDR
    holding some of them, ``permit CIDR ge G le 32`` (``le 128``) with G the shortest of those
    prefixes (32 or 128 unless aggregated); an exact line for a prefix that no pool CIDR holds
    (an aggregate wider than a range's CIDRs)."""
    shortest: dict[IPNetwork, int] = {}
    exact: list[str] = []
    for p in prefixes:
        net = ipaddress.ip_network(p)
        cidr = next((c for c in shortest if c.version == net.version and net.subnet_of(c)), None)  # type: ignore[arg-type]
        if cidr is None:
            cidr = next((c for c in cidrs if c.version == net.version and net.subnet_of(c)), None)  # type: ignore[arg-type]
            if cidr is None:
                exact.append(p)
                continue
        shortest[cidr] = min(shortest.get(cidr, net.prefixlen), net.prefixlen)
    lines = []
    for c in sorted(shortest, key=lambda c: (c.version, c)):
        top, ge = c.max_prefixlen, shortest[c]
        if c.prefixlen == top:
            lines.append(f"permit {c}")
        elif ge > c.prefixlen:
            lines.append(f"permit {c} ge {ge} le {top}")
        else:
            lines.append(f"permit {c} le {top}")
    return lines + [f"permit {p}" for p in exact]


def render(hostname: str, decision: BgpDecision, config: Config,
           forwarding: tuple[bool, bool] = (True, True)) -> Rendered:
    """The whole frr.conf of this node for ``decision``; ``forwarding``: the node's IPv4 and IPv6
    forwarding switches, rendered as they are so that a reload never changes them."""
    profiles = config.bfd_profiles
    used_profiles = sorted({p.bfd_profile for p in decision.peers if p.bfd_profile in profiles})
    routers: dict[tuple[str, int], dict[str, Any]] = {}
    prefix_lists: list[dict[str, Any]] = []
    route_maps: list[dict[str, Any]] = []
    networks: dict[tuple[str, int], dict[str, list[str]]] = {}
    pool_cidrs = _pool_cidrs(config)
    per_peer: list[tuple[dict[str, Any], dict[str, Any], list[Route]]] = []
    for peer in decision.peers:
        key = (peer.vrf, peer.my_asn)
        r = routers.setdefault(key, {"asn": peer.my_asn, "vrf": peer.vrf, "router_id": "", "graceful_restart": False,
                                     "neighbors": [], "networks": {"ipv4": set(), "ipv6": set()},
                                     "families": {"ipv4": False, "ipv6": False}})
        r["router_id"] = r["router_id"] or peer.router_id
        r["graceful_restart"] = r["graceful_restart"] or peer.enable_graceful_restart
        n = _neighbor(peer, profiles)
        r["neighbors"].append(n)
        for fam in n["families"]:
            r["families"][fam] = True
        routes = decision.routes.get(peer.name, [])
        for rt in routes:
            if _family(rt) in n["families"]:
                r["networks"][_family(rt)].add(rt.prefix)
        per_peer.append((r, n, routes))
    for r, n, routes in per_peer:
        entries = []
        name = n["rm"]
        for fam in n["families"]:
            kind = "ip" if fam == "ipv4" else "ipv6"
            base = 10 if fam == "ipv4" else 1010
            groups: dict[tuple, list[str]] = {}
            for rt in routes:
                if _family(rt) == fam:
                    groups.setdefault((rt.communities, rt.large_communities, rt.local_pref), []).append(rt.prefix)
            if not groups:
                pl = f"{name}-{fam}-none"
                prefix_lists.append({"kind": kind, "name": pl, "lines": ["deny any"]})
                entries.append({"action": "deny", "seq": base, "kind": kind,
                                "prefix_list": pl, "communities": (), "large": (), "local_pref": 0})
                continue
            mine = {p for ps in groups.values() for p in ps}
            skip = sorted(r["networks"][fam] - mine, key=ipaddress.ip_network)
            if skip:  # announced by this router to other peers, not to this one
                pl = f"{name}-{fam}-skip"
                prefix_lists.append({"kind": kind, "name": pl, "lines": [f"permit {p}" for p in skip]})
                entries.append({"action": "deny", "seq": base, "kind": kind,
                                "prefix_list": pl, "communities": (), "large": (), "local_pref": 0})
            ordered = sorted(groups.items())
            # the largest group goes last and is matched by the pools' CIDRs: one line per pool
            # instead of one per VIP (FRR's cost of a prefix-list entry grows with the list)
            last = max(range(len(ordered)), key=lambda i: (len(ordered[i][1]), -i))
            ordered.append(ordered.pop(last))
            for i, ((comms, large, pref), prefixes) in enumerate(ordered):
                pl = f"{name}-{fam}-{i}"
                lines = (_bounded(prefixes, pool_cidrs.get(fam, [])) if i == len(ordered) - 1
                         else [f"permit {p}" for p in prefixes])
                prefix_lists.append({"kind": kind, "name": pl, "lines": lines})
                entries.append({"action": "permit", "seq": base + 1 + i, "kind": kind,
                                "prefix_list": pl, "communities": comms, "large": large, "local_pref": pref})
        route_maps.append({"name": name, "entries": entries})
    out_routers = []
    for key, r in routers.items():
        nets = {fam: sorted(r["networks"][fam], key=ipaddress.ip_network) for fam in ("ipv4", "ipv6")}
        networks[key] = nets
        out_routers.append(dict(r, networks=nets))
    text = _TEMPLATE.render(hostname=hostname, forwarding=forwarding, bfd_profiles=[profiles[n] for n in used_profiles],
                            routers=out_routers, prefix_lists=prefix_lists, route_maps=route_maps)
    secrets = frozenset(p.password for p in decision.peers if p.password)
    return Rendered(text=text, networks=networks, secrets=secrets)
