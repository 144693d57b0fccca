"""Labels BGP mode decides on are published (peers and the node itself decide from published labels)."""

from __future__ import annotations

from nocloudlb.core.schema import parse_resources
from nocloudlb.daemon import label_keys

POOL = {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "bgp"},
        "spec": {"addresses": ["203.0.113.0/28"]}}


def test_bgp_node_selectors_and_the_handover_switch_are_published():
    parsed = parse_resources([
        POOL,
        {"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer", "metadata": {"name": "r1"},
         "spec": {"myASN": 64512, "peerASN": 64500, "peerAddress": "198.51.100.1",
                  "nodeSelectors": [{"matchLabels": {"rack": "a"}}]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "BGPAdvertisement", "metadata": {"name": "bgp"},
         "spec": {"nodeSelectors": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["x"]}]}]}},
    ])
    assert label_keys(parsed) == {"node.kubernetes.io/exclude-from-external-load-balancers", "rack", "zone",
                                  "nocloud.io/bgp-flow-handover"}


def test_layer2_only_config_publishes_no_bgp_keys():
    parsed = parse_resources([POOL, {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement",
                                     "metadata": {"name": "l2"}, "spec": {}}])
    assert label_keys(parsed) == {"node.kubernetes.io/exclude-from-external-load-balancers"}
