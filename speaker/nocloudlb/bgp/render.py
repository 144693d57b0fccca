"""The node's whole FRR configuration (bgpd, bfdd) from a BgpDecision, rendered with Jinja2.

Per peer: an outbound route-map whose entries match per-peer prefix lists that hold only
the prefixes ``bgp_decision`` gave that peer (all pool addresses); a peer with nothing to
announce gets a ``deny any`` list, and every inbound route-map denies everything (a node
never learns routes). ``network`` statements hold the union of the prefixes of a router
(``no bgp network import-check``: FRR announces them whether or not the RIB has them).
The password appears only in the file (0640 root:frr); ``redact`` hides it for logs and diffs.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

import jinja2

from nocloudlb.core.bgp import BgpDecision, Route, is_ibgp
from nocloudlb.core.schema import BFDProfile, BGPPeer, Config

TEMPLATE = """\
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


def _neighbor(peer: BGPPeer, profiles: dict[str, BFDProfile]) -> dict[str, Any]:
    families = set()
    if peer.interface:
        families = {"ipv4", "ipv6"}
    else:
        version = ipaddress.ip_address(peer.address).version
        families.add("ipv4" if version == 4 else "ipv6")
        if peer.dual_stack_address_family:
            families = {"ipv4", "ipv6"}
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
        entries = []
        name = rm_name(peer)
        for fam in n["families"]:
            kind = "ip" if fam == "ipv4" else "ipv6"
            mine = [rt for rt in routes if _family(rt) == fam]
            groups: dict[tuple, list[str]] = {}
            for rt in mine:
                r["networks"][fam].add(rt.prefix)
                groups.setdefault((rt.communities, rt.large_communities, rt.local_pref), []).append(rt.prefix)
            if not groups:
                pl = f"{name}-{fam}-none"
                prefix_lists.append({"kind": kind, "name": pl, "lines": ["deny any"]})
                entries.append({"action": "deny", "seq": 10 if fam == "ipv4" else 1010, "kind": kind,
                                "prefix_list": pl, "communities": (), "large": (), "local_pref": 0})
                continue
            for i, ((comms, large, pref), prefixes) in enumerate(sorted(groups.items())):
                pl = f"{name}-{fam}-{i}"
                prefix_lists.append({"kind": kind, "name": pl, "lines": [f"permit {p}" for p in prefixes]})
                entries.append({"action": "permit", "seq": (10 if fam == "ipv4" else 1010) + i, "kind": kind,
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
