# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""BGP announcement decision: selectors, aggregation, communities, localPref, drain, Local health."""

from __future__ import annotations

import pytest
from conftest import bgpadv, community, l2adv, peer, pool, service
from nocloudlb.core.bgp import Route, aggregate, bgp_decision, is_ibgp
from nocloudlb.core.election import DRAIN_LABEL, NodeView, layer2_decision
from nocloudlb.core.schema import parse_resources

POOL = pool("bgp", "203.0.113.0/26")
ROUTER = peer("router", myASN=64512, peerASN=64500, peerAddress="198.51.100.1")
IBGP = peer("ibgp", myASN=64512, peerASN=64512, peerAddress="198.51.100.2")
WEB = service("web", status_ips=["203.0.113.10"])
LOCAL = service("local", status_ips=["203.0.113.11"], externalTrafficPolicy="Local")


def decide(docs, me="n1", labels=None, state="alive", healthy=(), others=()):
    cfg = parse_resources(docs)
    nodes = [NodeView(me, labels or {}, state, frozenset(healthy)), *others]
    return bgp_decision(me, nodes, cfg)


def prefixes(decision, peer_name="router"):
    return [r.prefix for r in decision.routes[peer_name]]


# --------------------------------------------------------------------------- table

CASES = [
    # (id, docs, node labels, healthy, expected {peer: [prefixes]})
    ("cluster policy: every peer gets the /32", [POOL, ROUTER, bgpadv("a"), WEB], {}, (),
     {"router": ["203.0.113.10/32"]}),
    ("no advertisement: nothing", [POOL, ROUTER, WEB], {}, (), {"router": []}),
    ("advertisement of another pool: nothing",
     [POOL, pool("other", "203.0.113.64/26"), ROUTER, bgpadv("a", ipAddressPools=["other"]), WEB], {}, (),
     {"router": []}),
    ("advertisement node selector does not select me",
     [POOL, ROUTER, bgpadv("a", nodeSelectors=[{"matchLabels": {"zone": "b"}}]), WEB], {"zone": "a"}, (),
     {"router": []}),
    ("advertisement node selector selects me",
     [POOL, ROUTER, bgpadv("a", nodeSelectors=[{"matchLabels": {"zone": "a"}}]), WEB], {"zone": "a"}, (),
     {"router": ["203.0.113.10/32"]}),
    ("peer node selector leaves the peer out",
     [POOL, peer("router", myASN=64512, peerASN=64500, nodeSelectors=[{"matchLabels": {"rack": "r2"}}]),
      bgpadv("a"), WEB], {"rack": "r1"}, (), {}),
    ("service selector does not select the service",
     [POOL, ROUTER, bgpadv("a", serviceSelectors=[{"matchLabels": {"app": "db"}}]), WEB], {}, (), {"router": []}),
    ("service selector selects the service",
     [POOL, ROUTER, bgpadv("a", serviceSelectors=[{"matchLabels": {"app": "web"}}]),
      service("web", labels={"app": "web"}, status_ips=["203.0.113.10"])], {}, (), {"router": ["203.0.113.10/32"]}),
    ("peers field: only the named peer",
     [POOL, ROUTER, IBGP, bgpadv("a", peers=["ibgp"]), WEB], {}, (), {"router": [], "ibgp": ["203.0.113.10/32"]}),
    ("no peers field: every peer",
     [POOL, ROUTER, IBGP, bgpadv("a"), WEB], {}, (), {"router": ["203.0.113.10/32"], "ibgp": ["203.0.113.10/32"]}),
    ("aggregation length 30",
     [POOL, ROUTER, bgpadv("a", aggregationLength=30), WEB], {}, (), {"router": ["203.0.113.8/30"]}),
    ("aggregation and /32 from two advertisements",
     [POOL, ROUTER, bgpadv("a", aggregationLength=26), bgpadv("b"), WEB], {}, (),
     {"router": ["203.0.113.0/26", "203.0.113.10/32"]}),
    ("two VIPs aggregate into one prefix",
     [POOL, ROUTER, bgpadv("a", aggregationLength=28), WEB, service("api", status_ips=["203.0.113.12"])], {}, (),
     {"router": ["203.0.113.0/28"]}),
    ("IPv6 with aggregationLengthV6",
     [pool("v6", "2001:db8:5::/120"), ROUTER, bgpadv("a", aggregationLengthV6=124),
      service("v6", status_ips=["2001:db8:5::13"])], {}, (), {"router": ["2001:db8:5::10/124"]}),
    ("IPv6 /128",
     [pool("v6", "2001:db8:5::/120"), ROUTER, bgpadv("a"), service("v6", status_ips=["2001:db8:5::13"])], {}, (),
     {"router": ["2001:db8:5::13/128"]}),
    ("VIP outside every pool: never announced",
     [POOL, ROUTER, bgpadv("a"), service("web", status_ips=["198.51.100.99"])], {}, (), {"router": []}),
    ("drained: nothing, peers kept",
     [POOL, ROUTER, bgpadv("a"), WEB], {DRAIN_LABEL: ""}, (), {"router": []}),
    ("Local policy, healthy", [POOL, ROUTER, bgpadv("a"), LOCAL], {}, ("prod/local",),
     {"router": ["203.0.113.11/32"]}),
    ("Local policy, unhealthy", [POOL, ROUTER, bgpadv("a"), LOCAL], {}, (), {"router": []}),
    ("Local unhealthy, Cluster service on the same VIP still announced",
     [POOL, ROUTER, bgpadv("a"), LOCAL,
      service("web", status_ips=["203.0.113.11"], annotations={"metallb.io/allow-shared-ip": "k"})], {}, (),
     {"router": ["203.0.113.11/32"]}),
]


@pytest.mark.parametrize("docs, labels, healthy, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decision_table(docs, labels, healthy, expected):
    d = decide(docs, labels=labels, healthy=healthy)
    assert {name: [r.prefix for r in routes] for name, routes in d.routes.items()} == expected
    assert d.prefixes() <= {r.prefix for rs in d.routes.values() for r in rs}


# --------------------------------------------------------------------------- attributes


def test_communities_standard_large_and_named_merge_per_prefix():
    docs = [POOL, ROUTER, community("c", NO_ADVERTISE="65535:65282", big="large:64512:1:2"),
            bgpadv("a", communities=["64512:100", "NO_ADVERTISE"]), bgpadv("b", communities=["big", "64512:7"]), WEB]
    d = decide(docs)
    assert d.routes["router"] == [Route("203.0.113.10/32", ("64512:7", "64512:100", "65535:65282"),
                                        ("64512:1:2",), 0)]


def test_communities_differ_per_prefix_when_advertisements_differ():
    docs = [POOL, ROUTER, bgpadv("a", communities=["64512:1"], aggregationLength=30), bgpadv("b"), WEB]
    routes = decide(docs).routes["router"]
    assert routes == [Route("203.0.113.8/30", ("64512:1",)), Route("203.0.113.10/32")]


def test_local_pref_only_toward_ibgp():
    docs = [POOL, ROUTER, IBGP, bgpadv("a", localPref=150), WEB]
    d = decide(docs)
    assert d.routes["ibgp"][0].local_pref == 150
    assert d.routes["router"][0].local_pref == 0


@pytest.mark.parametrize("spec, expected", [
    ({"peerASN": 64512}, True), ({"peerASN": 64500}, False),
    ({"peerASN": None, "dynamicASN": "internal"}, True), ({"peerASN": None, "dynamicASN": "external"}, False),
])
def test_is_ibgp(spec, expected):
    cfg = parse_resources([peer("p", myASN=64512, **spec)])
    assert is_ibgp(cfg.bgp_peers[0]) is expected


def test_aggregate():
    docs = [pool("p", "203.0.113.0/24"), bgpadv("a", aggregationLength=24, aggregationLengthV6=64)]
    adv = parse_resources(docs).bgp_advertisements[0]
    assert aggregate("203.0.113.77", adv) == "203.0.113.0/24"
    assert aggregate("2001:db8:1:2::5", adv) == "2001:db8:1:2::/64"


# --------------------------------------------------------------------------- node state, reasons, serve


def test_node_missing_or_dead_in_its_published_view_announces_nothing():
    cfg = parse_resources([POOL, ROUTER, bgpadv("a"), WEB])
    assert bgp_decision("n1", [NodeView("n2")], cfg).prefixes() == set()
    dead = bgp_decision("n1", [NodeView("n1", state="dead")], cfg)
    assert dead.vips["203.0.113.10"] == (False, "notLive", ["prod/web"])
    assert bgp_decision("n1", [NodeView("n1", state="suspect")], cfg).prefixes() == {"203.0.113.10/32"}


def test_other_nodes_do_not_change_my_routes():
    """BGP has no leader: drained or unhealthy peers change nothing on this node."""
    docs = [POOL, ROUTER, bgpadv("a"), WEB]
    alone = decide(docs)
    crowd = decide(docs, others=[NodeView("n2", {DRAIN_LABEL: ""}), NodeView("n3", state="dead")])
    assert alone.routes == crowd.routes


@pytest.mark.parametrize("docs, labels, healthy, reason", [
    ([POOL, ROUTER, WEB], {}, (), "noMatchingAdvertisement"),
    ([POOL, ROUTER, bgpadv("a"), WEB], {DRAIN_LABEL: ""}, (), "drained"),
    ([POOL, ROUTER, bgpadv("a"), LOCAL], {}, (), "noHealthyBackend"),
    ([POOL, bgpadv("a"), WEB], {}, (), "noPeer"),
    ([POOL, ROUTER, IBGP, bgpadv("a", peers=["ibgp"]),
      WEB], {}, (), ""),
])
def test_reasons(docs, labels, healthy, reason):
    d = decide(docs, labels=labels, healthy=healthy)
    ip = next(iter(d.vips))
    assert d.vips[ip][1] == reason
    assert d.vips[ip][0] is (reason == "")


def test_serve_holds_vips_the_advertisements_select_even_when_drained():
    d = decide([POOL, ROUTER, bgpadv("a"), WEB, LOCAL], labels={DRAIN_LABEL: ""})
    assert d.serve == {"203.0.113.10", "203.0.113.11"} and d.prefixes() == set()


# --------------------------------------------------------------------------- layer 2 beside BGP


def test_l2_and_bgp_on_different_pools():
    docs = [POOL, pool("l2", "198.51.100.200/29"), ROUTER, bgpadv("a", ipAddressPools=["bgp"]),
            l2adv("b", ipAddressPools=["l2"]), WEB, service("lan", status_ips=["198.51.100.201"])]
    cfg = parse_resources(docs)
    nodes = [NodeView("n1")]
    d = bgp_decision("n1", nodes, cfg)
    assert d.prefixes() == {"203.0.113.10/32"}
    lan = cfg.service("prod/lan")
    assert layer2_decision("n1", nodes, cfg.l2_advertisements_for_pool("l2"), lan, "198.51.100.201") == ("n1", "")
    web = cfg.service("prod/web")
    assert layer2_decision("n1", nodes, cfg.l2_advertisements_for_pool("bgp"), web, "203.0.113.10")[0] is None


def test_l2_and_bgp_on_one_pool():
    cfg = parse_resources([POOL, ROUTER, bgpadv("a"), l2adv("b"), WEB])
    nodes = [NodeView("n1"), NodeView("n2")]
    web = cfg.service("prod/web")
    leader = layer2_decision("n1", nodes, cfg.l2_advertisements_for_pool("bgp"), web, "203.0.113.10")[0]
    assert leader in ("n1", "n2")
    # BGP: both nodes announce, whoever leads layer 2
    assert bgp_decision("n1", nodes, cfg).prefixes() == {"203.0.113.10/32"}
    assert bgp_decision("n2", nodes, cfg).prefixes() == {"203.0.113.10/32"}


def test_only_pool_addresses_ever_announced():
    """Whatever the services say, every announced prefix lies in a pool's network."""
    import ipaddress

    docs = [POOL, ROUTER, bgpadv("a", aggregationLength=28),
            service("a", status_ips=["203.0.113.1", "203.0.113.63"]),
            service("b", status_ips=["203.0.113.64", "198.51.100.1"]),
            service("c", status_ips=["2001:db8::1"])]
    d = decide(docs)
    pool_net = ipaddress.ip_network("203.0.113.0/26")
    assert d.prefixes() == {"203.0.113.0/28", "203.0.113.48/28"}
    assert all(ipaddress.ip_network(p).subnet_of(pool_net) for p in d.prefixes())
