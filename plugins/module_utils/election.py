# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Layer-2 leader election: MetalLB's hash order, as one pure function.

Every speaker computes the same answer from the same view of the cluster:
the candidates for a VIP are sorted by ``sha256(node + "#" + ip)`` compared
bytewise, and the first one announces. No votes, no shared store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from .pools import selector_matches
from .schema import L2Advertisement, Service


def election_key(node: str, ip: str) -> bytes:
    """The sort key of ``node`` for ``ip``: sha256 of ``node#ip``."""
    return hashlib.sha256((node + "#" + ip).encode("utf-8")).digest()


def election_order(nodes, ip: str, scores: dict | None = None) -> list:
    """All ``nodes`` ordered for ``ip``; the first one is the leader.

    ``scores`` (node -> preference weight, from L2Advertisement
    preferredNodeSelectors) put higher-scored nodes first; the hash breaks ties,
    as in MetalLB's sortL2Candidates. Without scores it is the pure hash order.
    """
    scores = scores or {}
    return sorted(nodes, key=lambda node: (-scores.get(node, 0), election_key(node, ip)))


def leader(nodes, ip: str, scores: dict | None = None):
    """The node that announces ``ip`` among ``nodes``, or None when there is none."""
    order = election_order(nodes, ip, scores)
    return order[0] if order else None


# --------------------------------------------------------------------------- eligibility

DRAIN_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
LIVE_STATES = frozenset({"alive", "suspect"})

REASON_NOT_OWNER = "notOwner"
REASON_NO_ADVERTISEMENT = "noMatchingAdvertisement"
REASON_DRAINED = "drained"
REASON_NO_HEALTHY_BACKEND = "noHealthyBackend"
REASON_NO_CANDIDATES = "noCandidates"


@dataclass
class NodeView:
    """What one speaker knows about a member: its labels, its membership state
    ("alive", "suspect", "dead" or "left") and the services whose local health
    check passes there (service keys "ns/name")."""

    name: str
    labels: dict = field(default_factory=dict)
    state: str = "alive"
    healthy: frozenset[str] = frozenset()


def _applicable(advertisements: list[L2Advertisement], service: Service) -> list[L2Advertisement]:
    """The advertisements whose serviceSelectors (if any) select the service."""
    return [adv for adv in advertisements if adv.selects_service(service.labels)]


def _selected(advertisements: list[L2Advertisement], node: NodeView) -> bool:
    return any(adv.selects_node(node.labels) for adv in advertisements)


def _ineligibility(node: NodeView, advertisements: list[L2Advertisement], service: Service) -> str:
    """Why ``node`` may not announce ``service`` ("" when it may)."""
    if node.state not in LIVE_STATES:
        return REASON_NOT_OWNER  # refined by layer2_decision
    if not _selected(advertisements, node):
        return REASON_NO_ADVERTISEMENT
    if DRAIN_LABEL in (node.labels or {}):
        return REASON_DRAINED
    if service.traffic_policy == "Local" and service.key not in node.healthy:
        return REASON_NO_HEALTHY_BACKEND
    return ""


def layer2_candidates(nodes: Iterable[NodeView], advertisements: list[L2Advertisement], service: Service) -> list[str]:
    """Names of the nodes that may announce ``service`` in layer 2 mode.

    ``advertisements`` are the L2Advertisements of the service's pool
    (``Config.l2_advertisements_for_pool``); the ones whose serviceSelectors do
    not select the service are ignored. A candidate is alive or suspect,
    selected by the nodeSelectors of at least one advertisement, does not carry
    the drain label, and, under externalTrafficPolicy Local, has the service's
    key in its ``healthy`` set. The names come back sorted by name.
    """
    applicable = _applicable(advertisements, service)
    return sorted(node.name for node in nodes if not _ineligibility(node, applicable, service))


def preferred_scores(nodes: Iterable[NodeView], advertisements: list[L2Advertisement]) -> dict[str, int]:
    """Node -> summed weight of the preferredNodeSelectors that match it.

    Each advertisement scores only the nodes its nodeSelectors select; weights
    add up across advertisements (MetalLB's preferredScoresFor).
    """
    nodes = list(nodes)
    scores: dict[str, int] = {}
    for adv in advertisements:
        for pref in adv.preferred_node_selectors:
            for node in nodes:
                if adv.selects_node(node.labels) and selector_matches(pref.get("preference") or {}, node.labels):
                    scores[node.name] = scores.get(node.name, 0) + int(pref.get("weight", 0))
    return {name: score for name, score in scores.items() if score}


def layer2_decision(my_node: str, nodes: Iterable[NodeView], advertisements: list[L2Advertisement], service: Service,
                    ip: str) -> tuple[str | None, str]:
    """(leader of ``ip`` or None, why ``my_node`` does not announce it).

    Candidates are ordered by preferredNodeSelectors weight, then by hash.
    The reason is "" when ``my_node`` is the leader; otherwise the first that
    applies of: "noMatchingAdvertisement" (no advertisement for the pool or the
    service, or none selects my node), "drained", "noHealthyBackend" (Local
    policy, my node's check fails), "noCandidates" (nobody may announce),
    "notOwner" (another node leads, including when my node is missing from the
    view or not alive/suspect in it).
    """
    nodes = list(nodes)
    applicable = _applicable(advertisements, service)
    candidates = layer2_candidates(nodes, applicable, service)
    winner = leader(candidates, ip, preferred_scores(nodes, applicable))
    if winner == my_node:
        return winner, ""
    mine = next((n for n in nodes if n.name == my_node), None)
    return winner, layer2_reason(winner, my_node, base_reason(mine, applicable, service))


def base_reason(mine: NodeView | None, applicable: list[L2Advertisement], service: Service) -> str:
    """Why ``mine`` would not announce a VIP of ``service`` that it does not win (see ``layer2_decision``)."""
    if not applicable:
        return REASON_NO_ADVERTISEMENT
    if mine is None:
        return REASON_NOT_OWNER
    return _ineligibility(mine, applicable, service) or REASON_NOT_OWNER


def layer2_reason(winner: str | None, my_node: str, base: str) -> str:
    """The reason ``layer2_decision`` gives for a VIP whose leader is ``winner``, ``base`` from ``base_reason``."""
    if winner == my_node:
        return ""
    if winner is None and base == REASON_NOT_OWNER:
        return REASON_NO_CANDIDATES
    return base
