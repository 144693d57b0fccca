# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""BGP announcements: which prefixes this node announces to which peer, as one pure function.

Beside the layer-2 election (``election.py``): in BGP mode there is no leader. Every node
that may serve a VIP announces it, and the router spreads flows over them (ECMP). For this
node (``me``), ``bgp_decision`` applies MetalLB's rules:

- peers: the BGPPeers whose nodeSelectors select this node's labels;
- for each VIP of a service (``status.loadBalancer.ingress``) that lies in a pool, the
  BGPAdvertisements of that pool whose serviceSelectors select the service and whose
  nodeSelectors select this node; an advertisement with ``peers`` goes only to those peers;
- nothing at all when this node carries the drain label, is not live in its own published
  view, or (``externalTrafficPolicy: Local``) its health check of the service fails;
- the prefix is the VIP masked to ``aggregationLength`` (``aggregationLengthV6``);
- communities (standard ``AS:value`` and large ``large:g:l1:l2``, names from Community
  resources already resolved by the schema) add up over every advertisement that
  produces the same prefix for the same peer; ``localPref`` is sent only to iBGP peers
  (same ASN, or ``dynamicASN: internal``), as MetalLB does (eBGP drops LOCAL_PREF).

Only addresses of a pool are ever produced, so a node cannot announce anything else.
A pool may have L2Advertisements and BGPAdvertisements at once: each mode reads its own.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .election import DRAIN_LABEL, LIVE_STATES, NodeView
from .schema import BGPAdvertisement, BGPPeer, Config, Service, password_problem

REASON_NO_PEER = "noPeer"
REASON_NO_ADVERTISEMENT = "noMatchingAdvertisement"
REASON_DRAINED = "drained"
REASON_NO_HEALTHY_BACKEND = "noHealthyBackend"
REASON_NOT_IN_POOL = "notInAnyPool"
REASON_NOT_LIVE = "notLive"


@dataclass(frozen=True)
class Route:
    """One prefix this node announces to one peer, with its attributes."""

    prefix: str                       # "203.0.113.10/32", "2001:db8:5::10/128"
    communities: tuple[str, ...] = ()        # standard, "AS:value", sorted
    large_communities: tuple[str, ...] = ()  # "g:l1:l2" (without the "large:" marker), sorted
    local_pref: int = 0               # 0 = not set (always 0 toward eBGP peers)

    @property
    def version(self) -> int:
        return ipaddress.ip_network(self.prefix).version


@dataclass
class BgpDecision:
    """What this node does in BGP mode.

    ``peers``: the BGPPeers for this node (sessions to keep up, even with nothing to announce).
    ``routes``: peer name -> the routes for it, sorted by prefix (every selected peer has a key).
    ``vips``: ip -> (announced to at least one peer, reason when not, services).
    ``serve``: VIPs this node may serve through BGP (advertisements select it), to hold on lo.
    """

    peers: list[BGPPeer] = field(default_factory=list)
    routes: dict[str, list[Route]] = field(default_factory=dict)
    vips: dict[str, tuple[bool, str, list[str]]] = field(default_factory=dict)
    serve: set[str] = field(default_factory=set)

    def prefixes(self) -> set[str]:
        """Every prefix announced to some peer."""
        return {r.prefix for routes in self.routes.values() for r in routes}


def is_ibgp(peer: BGPPeer) -> bool:
    """iBGP when the peer's ASN is ours, or its dynamic ASN is ``internal``."""
    if peer.dynamic_asn:
        return peer.dynamic_asn == "internal"
    return peer.peer_asn == (peer.local_asn or peer.my_asn)


def aggregate(ip: str, adv: BGPAdvertisement) -> str:
    """``ip`` masked to the advertisement's aggregation length for its family, as a CIDR."""
    addr = ipaddress.ip_address(ip)
    length = adv.aggregation_length if addr.version == 4 else adv.aggregation_length_v6
    return str(ipaddress.ip_network(f"{addr}/{length}", strict=False))


def peers_for_node(peers: Iterable[BGPPeer], labels: dict | None) -> list[BGPPeer]:
    """The BGPPeers whose nodeSelectors select a node with ``labels`` (manifest order)."""
    return [p for p in peers if p.selects_node(labels)]


def _ineligible(me: NodeView | None, svc: Service) -> str:
    if me is None or me.state not in LIVE_STATES:
        return REASON_NOT_LIVE
    if DRAIN_LABEL in (me.labels or {}):
        return REASON_DRAINED
    if svc.traffic_policy == "Local" and svc.key not in me.healthy:
        return REASON_NO_HEALTHY_BACKEND
    return ""


def bgp_decision(me: str, nodes: Iterable[NodeView], config: Config) -> BgpDecision:
    """The prefixes ``me`` announces to each of its peers (see the module's docstring).

    ``nodes`` is the published view (``me`` included, as peers see it): only ``me``'s own
    entry matters in BGP mode, since every eligible node announces. A node missing from the
    view announces nothing.
    """
    mine = next((n for n in nodes if n.name == me), None)
    labels = mine.labels if mine is not None else {}
    peers = peers_for_node(config.bgp_peers, labels)
    by_name = {p.name: p for p in peers}
    decision = BgpDecision(peers=peers, routes={p.name: [] for p in peers})
    # (peer, prefix) -> [communities, large, localPref]
    acc: dict[tuple[str, str], tuple[set[str], set[str], list[int]]] = {}
    for svc in config.services:
        for ip in svc.ingress_ips:
            ip = str(ipaddress.ip_address(ip))
            pool = config.pool_for_ip(ip)
            entry = decision.vips.setdefault(ip, (False, "", []))
            services = entry[2] + [svc.key]
            if pool is None:
                decision.vips[ip] = (entry[0], entry[1] or REASON_NOT_IN_POOL, services)
                continue
            advs = [a for a in config.bgp_advertisements_for_pool(pool.name)
                    if a.selects_service(svc.labels) and a.selects_node(labels)]
            if advs:
                decision.serve.add(ip)
            reason = "" if advs else REASON_NO_ADVERTISEMENT
            reason = reason or _ineligible(mine, svc)
            if not reason and not peers:
                reason = REASON_NO_PEER
            sent = False
            if not reason:
                for adv in advs:
                    targets = [by_name[n] for n in adv.peers if n in by_name] if adv.peers else peers
                    prefix = aggregate(ip, adv)
                    for peer in targets:
                        comms, large, prefs = acc.setdefault((peer.name, prefix), (set(), set(), []))
                        for c in adv.communities:
                            if c.startswith("large:"):
                                large.add(c[len("large:"):])
                            else:
                                comms.add(c)
                        if adv.local_pref and is_ibgp(peer):
                            prefs.append(adv.local_pref)
                        sent = True
                if not sent:
                    reason = REASON_NO_PEER
            if entry[0] or sent:
                decision.vips[ip] = (True, "", services)
            else:
                decision.vips[ip] = (False, entry[1] or reason, services)
    for (peer_name, prefix), (comms, large, prefs) in acc.items():
        decision.routes[peer_name].append(
            Route(prefix, tuple(sorted(comms, key=_community_key)), tuple(sorted(large, key=_community_key)),
                  max(prefs) if prefs else 0))
    for routes in decision.routes.values():
        routes.sort(key=lambda r: (r.version, ipaddress.ip_network(r.prefix)))
    return decision


def read_password_files(config: Config, read: Callable[[str], str] | None = None) -> list[str]:
    """Fill each BGPPeer's password from its ``passwordFile``; the problems, naming peer, field and path.

    Run where the files live (``nocloudlb validate`` and every (re)load on the node, or
    ``pool_validate`` with ``check_password_files``). ``read`` (path -> text) defaults to reading the
    file; one trailing newline is dropped. No message ever contains the password.
    """
    def _read(path: str) -> str:
        with open(path, encoding="utf-8") as fh:
            return fh.read(4096)

    reader = read or _read
    errors = []
    for peer in config.bgp_peers:
        if not peer.password_file:
            continue
        where = f'BGPPeer "{peer.name}": spec.passwordFile'
        try:
            text = reader(peer.password_file)
        except FileNotFoundError:
            errors.append(f'{where}: password file "{peer.password_file}" not found')
            continue
        except (OSError, UnicodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            errors.append(f'{where}: password file "{peer.password_file}" cannot be read: {reason}')
            continue
        text = text[:-1] if text.endswith("\n") else text
        problem = password_problem(text)
        if problem:
            errors.append(f'{where}: password file "{peer.password_file}": {problem}')
            continue
        peer.password = text
    return errors


def _community_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(":"))
