# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Election order (MetalLB's vectors) and layer-2 eligibility."""

from __future__ import annotations

import itertools

import pytest
from conftest import l2adv, pool, service
from nocloudlb.core.election import (
    DRAIN_LABEL,
    NodeView,
    election_key,
    election_order,
    layer2_candidates,
    layer2_decision,
    leader,
    preferred_scores,
)
from nocloudlb.core.schema import parse_resources

# --------------------------------------------------------------------------- order


@pytest.mark.parametrize(
    "nodes, ip, expected",
    [
        # MetalLB speaker/layer2_controller_test.go, the iris1/iris2 table.
        (["iris1", "iris2"], "10.20.30.1", ["iris2", "iris1"]),
        (["iris1", "iris2"], "10.20.30.2", ["iris1", "iris2"]),
        # MetalLB TestSortL2Candidates (no scores). MetalLB's table names the nodes node-a, node-b, node-c;
        # with those names both of its vectors hold: 10.0.0.1 -> b, a, c and 10.0.0.2 -> b, c, a.
        (["node-a", "node-b", "node-c"], "10.0.0.1", ["node-b", "node-a", "node-c"]),
        (["node-a", "node-b", "node-c"], "10.0.0.2", ["node-b", "node-c", "node-a"]),
        # Issue 2 quotes the vectors for nodes named plainly a, b, c. For those names MetalLB's key
        # sha256(node + "#" + ip) gives b, c, a for 10.0.0.2 (as quoted) but a, c, b for 10.0.0.1, not the
        # quoted b, a, c: that order belongs to node-a/node-b/node-c above. We test what the code computes.
        (["a", "b", "c"], "10.0.0.2", ["b", "c", "a"]),
        (["a", "b", "c"], "10.0.0.1", ["a", "c", "b"]),
    ],
)
def test_metallb_vectors(nodes, ip, expected):
    for perm in itertools.permutations(nodes):
        assert election_order(list(perm), ip) == expected
    assert leader(nodes, ip) == expected[0]


def test_key_is_sha256_of_node_hash_ip():
    import hashlib

    assert election_key("n1", "198.51.100.7") == hashlib.sha256(b"n1#198.51.100.7").digest()
    assert leader([], "198.51.100.7") is None


@pytest.mark.parametrize(
    "nodes, ip, scores, expected",
    [
        # MetalLB TestSortL2Candidates with scores.
        (["edge-a", "edge-b", "worker-a", "worker-b"], "10.20.30.1", {"edge-a": 100},
         ["edge-a", "edge-b", "worker-a", "worker-b"]),
        (["node-a", "node-b"], "10.20.30.1", {"node-a": 100, "node-b": 100}, ["node-b", "node-a"]),
        (["edge-a", "edge-b", "worker-a"], "10.20.30.1", {"edge-a": 100, "edge-b": 100},
         ["edge-b", "edge-a", "worker-a"]),
    ],
)
def test_metallb_preference_vectors(nodes, ip, scores, expected):
    assert election_order(list(reversed(nodes)), ip, scores) == expected


def test_order_spreads_leadership():
    nodes = [f"n{i}" for i in range(5)]
    leaders = [leader(nodes, f"198.51.100.{i}") for i in range(1, 201)]
    counts = {n: leaders.count(n) for n in nodes}
    assert all(20 <= c <= 60 for c in counts.values()), counts  # 40 each on average


# --------------------------------------------------------------------------- eligibility


def _config(adv_spec=None, svc=None):
    docs = [pool("p", "198.51.100.0/28"), l2adv("adv", **(adv_spec or {})), svc or service()]
    config = parse_resources(docs)
    return config.l2_advertisements_for_pool("p"), config.services[0]


def nodes(*specs):
    out = []
    for spec in specs:
        name, rest = (spec.split(":", 1) + [""])[:2]
        labels = {}
        state = "alive"
        healthy = frozenset()
        for part in filter(None, rest.split(",")):
            if part in ("alive", "suspect", "dead", "left"):
                state = part
            elif part == "healthy":
                healthy = frozenset({"prod/web"})
            elif part == "drained":
                labels[DRAIN_LABEL] = ""
            else:
                key, value = (part.split("=", 1) + [""])[:2]
                labels[key] = value
        out.append(NodeView(name=name, labels=labels, state=state, healthy=healthy))
    return out


IP = "198.51.100.3"

ELIGIBILITY = [
    # (description, advertisement spec, service overrides, nodes, expected candidates)
    ("all alive", {}, {}, nodes("n1", "n2", "n3"), ["n1", "n2", "n3"]),
    ("suspect still serves, dead and left do not", {}, {}, nodes("n1:suspect", "n2:dead", "n3:left"), ["n1"]),
    ("drain label excludes, whatever its value", {}, {}, nodes("n1:drained", "n2"), ["n2"]),
    ("node selectors", {"nodeSelectors": [{"matchLabels": {"zone": "a"}}]}, {},
     nodes("n1:zone=a", "n2:zone=b", "n3"), ["n1"]),
    ("Local needs a healthy backend", {}, {"externalTrafficPolicy": "Local"},
     nodes("n1:healthy", "n2", "n3:healthy,drained"), ["n1"]),
    ("Cluster ignores health", {}, {"externalTrafficPolicy": "Cluster"}, nodes("n1", "n2:healthy"), ["n1", "n2"]),
    ("service selectors that miss leave no advertisement", {"serviceSelectors": [{"matchLabels": {"app": "db"}}]}, {},
     nodes("n1", "n2"), []),
]


@pytest.mark.parametrize("desc, adv_spec, svc_spec, view, expected", ELIGIBILITY, ids=[c[0] for c in ELIGIBILITY])
def test_layer2_candidates(desc, adv_spec, svc_spec, view, expected):
    advs, svc = _config(adv_spec, service(**svc_spec))
    assert layer2_candidates(view, advs, svc) == expected


def test_two_advertisements_union_of_node_selectors():
    config = parse_resources([
        pool("p", "198.51.100.0/28"),
        l2adv("a", nodeSelectors=[{"matchLabels": {"zone": "a"}}]),
        l2adv("b", nodeSelectors=[{"matchLabels": {"zone": "b"}}]),
        service(),
    ])
    view = nodes("n1:zone=a", "n2:zone=b", "n3:zone=c")
    assert layer2_candidates(view, config.l2_advertisements_for_pool("p"), config.services[0]) == ["n1", "n2"]


def test_decision_reasons():
    advs, svc = _config({"nodeSelectors": [{"matchLabels": {"zone": "a"}}]}, service(externalTrafficPolicy="Local"))
    view = nodes("n1:zone=a,healthy", "n2:zone=a,healthy", "n3:zone=b,healthy", "n4:zone=a,drained,healthy",
                 "n5:zone=a", "n6:zone=a,healthy,dead")
    order = election_order(["n1", "n2"], IP)
    win = order[0]
    assert layer2_decision(win, view, advs, svc, IP) == (win, "")
    assert layer2_decision(order[1], view, advs, svc, IP) == (win, "notOwner")
    assert layer2_decision("n3", view, advs, svc, IP) == (win, "noMatchingAdvertisement")
    assert layer2_decision("n4", view, advs, svc, IP) == (win, "drained")
    assert layer2_decision("n5", view, advs, svc, IP) == (win, "noHealthyBackend")
    assert layer2_decision("n6", view, advs, svc, IP) == (win, "notOwner")  # dead in the view: someone else leads
    assert layer2_decision("ghost", view, advs, svc, IP) == (win, "notOwner")
    # No advertisement at all for the pool.
    assert layer2_decision("n1", view, [], svc, IP) == (None, "noMatchingAdvertisement")
    # Nobody may announce and my node is not in the view.
    lonely = nodes("n5:zone=a")
    assert layer2_decision("ghost", lonely, advs, svc, IP) == (None, "noCandidates")
    assert layer2_decision("n5", lonely, advs, svc, IP) == (None, "noHealthyBackend")


def test_decision_failover_follows_hash_order():
    advs, svc = _config()
    view = nodes("n1", "n2", "n3")
    order = election_order(["n1", "n2", "n3"], IP)
    assert layer2_decision(order[1], view, advs, svc, IP) == (order[0], "notOwner")
    for node in view:
        if node.name == order[0]:
            node.state = "dead"
    assert layer2_decision(order[1], view, advs, svc, IP) == (order[1], "")
    for node in view:
        if node.name == order[1]:
            node.labels[DRAIN_LABEL] = "true"
    assert layer2_decision(order[1], view, advs, svc, IP) == (order[2], "drained")


def test_preferred_node_selectors_decide_before_the_hash():
    spec = {"preferredNodeSelectors": [{"weight": 50, "preference": {"matchLabels": {"tier": "edge"}}}],
            "nodeSelectors": [{"matchExpressions": [{"key": "tier", "operator": "Exists"}]}]}
    advs, svc = _config(spec)
    view = nodes("n1:tier=worker", "n2:tier=worker", "n3:tier=edge", "n4")
    assert preferred_scores(view, advs) == {"n3": 50}
    for ip in ("198.51.100.1", "198.51.100.2", "198.51.100.3"):
        assert layer2_decision("n3", view, advs, svc, ip) == ("n3", "")
    view[2].state = "dead"  # the preferred node fails: the hash decides among the rest
    winner = election_order(["n1", "n2"], IP)[0]
    assert layer2_decision(winner, view, advs, svc, IP) == (winner, "")


# MetalLB speaker/layer2_controller_test.go TestShouldAnnounce (Local policy, nodes iris1 and iris2):
# a node with a ready (or serving) endpoint is a node whose health check passes here.
# (healthy nodes, VIP, the node that announces or None)
SHOULD_ANNOUNCE = [
    ({"iris1"}, "10.20.30.1", "iris1"),  # two endpoints on iris1: controller 1 announces
    (set(), "10.20.30.1", None),  # no endpoint ready: nobody announces
    ({"iris1", "iris2"}, "10.20.30.1", "iris2"),  # endpoints on both hosts: the hash picks iris2 for .1
    ({"iris1", "iris2"}, "10.20.30.2", "iris1"),  # ... and iris1 for .2
    ({"iris2"}, "10.20.30.1", "iris2"),
    ({"iris1"}, "10.20.30.2", "iris1"),
]


@pytest.mark.parametrize("healthy, ip, announcer", SHOULD_ANNOUNCE)
def test_metallb_should_announce_table(healthy, ip, announcer):
    advs, svc = _config(svc=service(externalTrafficPolicy="Local"))
    view = [NodeView(name, {}, "alive", frozenset({"prod/web"}) if name in healthy else frozenset())
            for name in ("iris1", "iris2")]
    for me in ("iris1", "iris2"):
        winner, reason = layer2_decision(me, view, advs, svc, ip)
        assert winner == announcer
        # MetalLB answers "notOwner" to both when nobody has an endpoint; we say why: "noHealthyBackend".
        expected = "" if me == announcer else ("noHealthyBackend" if me not in healthy else "notOwner")
        assert reason == expected
