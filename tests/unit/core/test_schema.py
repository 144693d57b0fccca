# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""parse_resources: MetalLB-shaped manifests load unchanged; every bad field is named with MetalLB's wording."""

from __future__ import annotations

import copy
import re

import pytest
from conftest import bfd, bgpadv, community, errors_of, l2adv, load_manifest, peer, pool, service
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nocloudlb.core.errors import ConfigError
from nocloudlb.core.schema import parse_community, parse_duration, parse_health_check, parse_resources

# --------------------------------------------------------------------------- manifests that load


def test_l2_manifest_loads_unchanged():
    docs = load_manifest("metallb_l2.manifest")
    before = copy.deepcopy(docs)
    config = parse_resources(docs)
    assert docs == before  # parse_resources never edits its input
    assert list(config.pools) == ["first-pool", "second-pool"]
    first, second = config.pools["first-pool"], config.pools["second-pool"]
    assert first.families() == {4, 6} and first.size(4) == 21 and first.size(6) == 16
    assert (second.auto_assign, second.avoid_buggy_ips, second.size(4)) == (False, True, 15)
    assert second.labels == {"tier": "edge"}
    example, edge = config.l2_advertisements
    assert (example.name, example.pools, example.interfaces) == ("example", ["first-pool"], ["eth0"])
    assert example.selects_node({"kubernetes.io/hostname": "n2"})
    assert not example.selects_node({"kubernetes.io/hostname": "n3"})
    assert (edge.pools, edge.node_selectors, edge.interfaces) == (["second-pool"], [], [])  # by pool selector
    assert [a.name for a in config.l2_advertisements_for_pool("first-pool")] == ["example"]
    assert config.pool_for_ip("203.0.113.5") is second and config.pool_for_ip("192.0.2.1") is None

    nginx, udp, edge_svc = config.services
    assert nginx.key == "prod/nginx" and nginx.traffic_policy == "Local" and nginx.ports == [(80, "TCP")]
    assert nginx.requested_ips == ["198.51.100.210"] and nginx.sharing_key == "nginx-share"
    assert nginx.ingress_ips == ["198.51.100.210"]
    assert nginx.health_check == {"type": "http", "host": "127.0.0.1", "port": 8080, "path": "/healthz",
                                  "command": None, "interval": 2.0, "timeout": 1.0, "rise": 2, "fall": 3}
    assert udp.requested_ips == ["198.51.100.210"] and udp.ports == [(53, "UDP")] and udp.traffic_policy == "Cluster"
    assert udp.health_check is None
    assert edge_svc.requested_pool == "second-pool" and edge_svc.requested_ips == []
    assert edge_svc.namespace == "default" and edge_svc.ip_families == [] and edge_svc.ip_family_policy == "SingleStack"


def test_bgp_manifest_loads_unchanged():
    config = parse_resources(load_manifest("metallb_bgp.manifest"))
    prof = config.bfd_profiles["fastprofile"]
    assert (prof.receive_interval, prof.transmit_interval, prof.detect_multiplier, prof.echo_interval,
            prof.echo_mode, prof.passive_mode, prof.minimum_ttl) == (380, 270, 5, 62, False, True, 254)
    router, router6 = config.bgp_peers
    assert (router.my_asn, router.peer_asn, router.address, router.port) == (64500, 64501, "198.51.100.1", 179)
    assert (router.hold_time, router.keepalive_time, router.bfd_profile) == (90.0, 30.0, "fastprofile")
    assert router.password == "s3cret"  # from the basic-auth Secret
    assert router6.selects_node({"rack": "frontend"}) and not router6.selects_node({})
    assert router6.hold_time is None and router6.keepalive_time is None
    # 1234:1 came in as the YAML 1.1 base-60 integer 74041 and is read back as the community.
    assert config.communities == {"vpn-only": "1234:1", "NO_ADVERTISE": "65535:65282"}
    local, external = config.bgp_advertisements
    assert (local.pools, local.local_pref, local.communities) == (["bgp-pool"], 100, ["1234:1"])
    assert (external.aggregation_length, external.aggregation_length_v6) == (24, 64)
    assert external.communities == ["65535:65282", "large:64500:1:2"] and external.peers == ["router"]
    assert [a.name for a in config.bgp_advertisements_for_pool("bgp-pool")] == ["local", "external"]


def test_allocation_manifest_loads_unchanged():
    config = parse_resources(load_manifest("metallb_allocation.manifest"))
    assert config.namespaces == {"team-a": {"team": "a"}, "team-b": {"team": "b"}}
    alloc = config.pools["ipaddresspool-sample1"].allocation
    assert alloc is not None and alloc.priority == 50 and alloc.namespaces == ["namespace-a", "namespace-b"]
    assert alloc.matches("team-a", config.namespaces["team-a"], {"serviceType": "database"})
    assert not alloc.matches("team-b", config.namespaces["team-b"], {"serviceType": "database"})
    assert config.pools["buggy-pool"].size(4) == 254
    (adv,) = config.l2_advertisements
    assert adv.pools == ["ipaddresspool-sample1", "dualstack-pool", "buggy-pool"]  # empty spec: every pool
    db, app = config.services
    assert db.labels == {"serviceType": "database"}
    assert app.ip_families == ["IPv6", "IPv4"] and app.ip_versions == [6, 4]
    assert app.ip_family_policy == "RequireDualStack"


def test_docs_quirks_are_accepted():
    """Things MetalLB's docs write that a strict reading would refuse, but Kubernetes' loader accepts."""
    docs = [
        None,  # a stray '---'
        {"apiVersion": "v1", "kind": "List", "items": [pool("p", "198.51.100.0/28")]},
        community(legacy=6030),  # YAML 1.1 read "100:30" as 100*60+30
        bgpadv("a", communities=[6030, "legacy"]),
        service(ipFamilies=["ipv4"], ipFamilyPolicy="SingleStack"),
    ]
    config = parse_resources(docs)
    assert config.communities == {"legacy": "100:30"}
    assert config.bgp_advertisements[0].communities == ["100:30", "100:30"]
    assert config.services[0].ip_families == ["IPv4"]


def test_deprecated_annotations_are_read():
    svc = service(annotations={"metallb.universe.tf/loadBalancerIPs": "198.51.100.3,2001:db8::3",
                               "metallb.universe.tf/address-pool": "p",
                               "metallb.universe.tf/allow-shared-ip": "k"})
    config = parse_resources([pool("p", "198.51.100.0/28"), svc])
    s = config.services[0]
    assert (s.requested_ips, s.requested_pool, s.sharing_key) == (["198.51.100.3", "2001:db8::3"], "p", "k")
    both = service(annotations={"metallb.universe.tf/address-pool": "old", "metallb.io/address-pool": "new"})
    assert parse_resources([both]).services[0].requested_pool == "new"


def test_load_balancer_class_and_empty_config():
    config = parse_resources([service(loadBalancerClass="other.io/lb")])
    assert config.services[0].load_balancer_class == "other.io/lb"
    empty = parse_resources([])
    assert (empty.pools, empty.services, empty.l2_advertisements) == ({}, [], [])


def test_all_errors_at_once():
    errors = errors_of([
        pool("a", "198.51.100.0/33"),
        pool("b", "198.51.100.9-198.51.100.1"),
        l2adv("x", ipAddressPools=["c"]),
        peer(holdTime="1s"),
    ])
    assert len(errors) == 4


# --------------------------------------------------------------------------- every error, by kind

P = pool("p", "198.51.100.0/28")

CASES = [
    # ---- documents and metadata
    ("not a list", "not-a-list", ["resources: must be a list of documents, got str"]),
    ("not a mapping", [42], ["resources[0]: must be a mapping (a Kubernetes-style document), got 42"]),
    ("unknown kind", [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}],
     ['resources[0]: unknown kind "Deployment" (apiVersion "apps/v1"); supported kinds: BFDProfile, BGPAdvertisement, '
      "BGPPeer, Backends, Community, IPAddressPool, L2Advertisement, Namespace, Secret, Service"]),
    ("wrong apiVersion", [dict(P, apiVersion="metallb.io/v1")],
     ['IPAddressPool "p": apiVersion: "metallb.io/v1" is not supported for IPAddressPool, use metallb.io/v1beta1']),
    ("unknown top-level field", [dict(P, extra=1)], ['IPAddressPool "p": extra: unknown field "extra"']),
    ("unknown metadata field", [dict(P, metadata={"name": "p", "label": {}})],
     ['IPAddressPool "p": metadata.label: unknown field "label"']),
    ("no metadata", [{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "spec": {}}],
     ["resources[0] (IPAddressPool): metadata: missing metadata (name) in IPAddressPool, got None"]),
    ("missing pool name", [dict(P, metadata={"namespace": "metallb-system"})],
     ["resources[0] (IPAddressPool): metadata.name: missing pool name"]),
    ("name not a string", [dict(P, metadata={"name": 5})],
     ["resources[0] (IPAddressPool): metadata.name: must be a string, got 5"]),
    ("missing bfd name", [dict(bfd(), metadata={})],
     ["resources[0] (BFDProfile): metadata.name: missing bfd profile name"]),
    ("bad name", [pool("Pool_A", "198.51.100.0/28")],
     ['IPAddressPool "Pool_A": metadata.name: "Pool_A" is not a valid name: must be a lowercase RFC 1123 subdomain']),
    ("bad service name", [service(name="1web")],
     ['Service "prod/1web": metadata.name: "1web" is not a valid name: must be a DNS-1035 label (lowercase letters, '
      "digits, '-', starting with a letter)"]),
    ("bad labels", [dict(P, metadata={"name": "p", "labels": {"a": {"b": 1}}})],
     ["IPAddressPool \"p\": metadata.labels.a: must be a string, got {'b': 1}"]),
    ("spec not a mapping", [dict(P, spec=["x"])], ["IPAddressPool \"p\": spec: must be a mapping, got ['x']",
                                                   'IPAddressPool "p": spec.addresses: pool has no prefixes defined']),
    ("duplicate pool", [P, P],
     ['IPAddressPool "p": metadata.name: duplicate definition of pool "p" (also at resources[0])']),
    ("duplicate bfd", [bfd("f"), bfd("f")],
     ['BFDProfile "f": metadata.name: found duplicate bfd profile name f (also at resources[0])']),
    ("duplicate l2", [l2adv("x"), l2adv("x")],
     ['L2Advertisement "x": metadata.name: duplicate definition of L2Advertisement "x" (also at resources[0])']),
    ("list item not a mapping", [{"apiVersion": "v1", "kind": "List", "items": ["x"]}],
     ["resources[0].items[0]: must be a mapping, got 'x'"]),
    # ---- IPAddressPool
    ("no spec", [{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "p"}}],
     ['IPAddressPool "p": spec: missing spec: an IPAddressPool needs spec.addresses']),
    ("no addresses", [pool("p")], ['IPAddressPool "p": spec.addresses: pool has no prefixes defined']),
    ("addresses not a list", [dict(P, spec={"addresses": "198.51.100.0/28"})],
     ["IPAddressPool \"p\": spec.addresses: must be a list of CIDRs or ranges, got '198.51.100.0/28'"]),
    ("invalid CIDR", [pool("p", "198.51.100.0/33")],
     ['IPAddressPool "p": spec.addresses[0]: invalid CIDR "198.51.100.0/33" in pool "p"']),
    ("CIDR not a string", [pool("p", 42)], ['IPAddressPool "p": spec.addresses[0]: invalid CIDR "42" in pool "p"']),
    ("start after end", [pool("p", "198.51.100.0/28", "198.51.100.30-198.51.100.20")],
     ['IPAddressPool "p": spec.addresses[1]: invalid CIDR "198.51.100.30-198.51.100.20" in pool "p": invalid IP range '
      '"198.51.100.30-198.51.100.20": start IP "198.51.100.30" is after the end IP "198.51.100.20"']),
    ("bad start", [pool("p", "198.51.100.x-198.51.100.20")],
     ['IPAddressPool "p": spec.addresses[0]: invalid CIDR "198.51.100.x-198.51.100.20" in pool "p": invalid IP range '
      '"198.51.100.x-198.51.100.20": invalid start IP "198.51.100.x"']),
    ("overlap across pools", [P, pool("q", "198.51.100.8/29")],
     ['IPAddressPool "q": spec.addresses[0]: CIDR "198.51.100.8/29" in pool "q" overlaps with already defined CIDR '
      '"198.51.100.0/28" (from "198.51.100.0/28" in pool "p")']),
    ("overlap within pool", [pool("p", "2001:db8::/64", "2001:db8::5-2001:db8::6")],
     ['IPAddressPool "p": spec.addresses[1]: CIDR "2001:db8::5/128" in pool "p" overlaps with already defined CIDR '
      '"2001:db8::/64" (from "2001:db8::/64" in pool "p")']),
    ("autoAssign type", [pool("p", "198.51.100.0/28", autoAssign="yes")],
     ["IPAddressPool \"p\": spec.autoAssign: must be true or false, got 'yes'"]),
    ("avoidBuggyIPs type", [pool("p", "198.51.100.0/28", avoidBuggyIPs=1)],
     ['IPAddressPool "p": spec.avoidBuggyIPs: must be true or false, got 1']),
    ("unknown spec field", [pool("p", "198.51.100.0/28", autoassign=True)],
     ['IPAddressPool "p": spec.autoassign: unknown field "autoassign"']),
    ("serviceAllocation type", [pool("p", "198.51.100.0/28", serviceAllocation=["x"])],
     ["IPAddressPool \"p\": spec.serviceAllocation: must be a mapping, got ['x']"]),
    ("priority type", [pool("p", "198.51.100.0/28", serviceAllocation={"priority": "high"})],
     ["IPAddressPool \"p\": spec.serviceAllocation.priority: must be an integer, got 'high'"]),
    ("priority range", [pool("p", "198.51.100.0/28", serviceAllocation={"priority": -1})],
     ['IPAddressPool "p": spec.serviceAllocation.priority: invalid value -1, must be in 0-2147483647 range']),
    ("duplicate namespaces", [pool("p", "198.51.100.0/28", serviceAllocation={"namespaces": ["a", "a"]})],
     ['IPAddressPool "p": spec.serviceAllocation.namespaces: duplicate definition in namespaces field: "a"']),
    ("bad namespace", [pool("p", "198.51.100.0/28", serviceAllocation={"namespaces": ["Prod"]})],
     ['IPAddressPool "p": spec.serviceAllocation.namespaces[0]: "Prod" is not a valid namespace name']),
    ("unknown serviceAllocation field", [pool("p", "198.51.100.0/28", serviceAllocation={"namespace": ["a"]})],
     ['IPAddressPool "p": spec.serviceAllocation.namespace: unknown field "namespace"']),
    ("bad service selector", [pool("p", "198.51.100.0/28", serviceAllocation={
        "serviceSelectors": [{"matchExpressions": [{"key": "a", "operator": "Is", "values": ["b"]}]}]})],
     ['IPAddressPool "p": spec.serviceAllocation.serviceSelectors[0]: matchExpressions[0].operator: "Is" is not a '
      "valid label selector operator"]),
    ("duplicate namespace selectors", [pool("p", "198.51.100.0/28", serviceAllocation={
        "namespaceSelectors": [{"matchLabels": {"a": "b"}}, {"matchLabels": {"a": "b"}}]})],
     ['IPAddressPool "p": spec.serviceAllocation.namespaceSelectors[1]: duplicate definition of namespaceSelectors '
      '"a=b"']),
    # ---- L2Advertisement
    ("unknown pool", [P, l2adv("x", ipAddressPools=["p", "nope"])],
     ['L2Advertisement "x": spec.ipAddressPools[1]: unknown pool "nope" (defined pools: "p")']),
    ("unknown pool, none defined", [l2adv("x", ipAddressPools=["nope"])],
     ['L2Advertisement "x": spec.ipAddressPools[0]: unknown pool "nope" (defined pools: none)']),
    ("duplicate pools", [P, l2adv("x", ipAddressPools=["p", "p"])],
     ['L2Advertisement "x": spec.ipAddressPools: duplicate definition of ipAddressPools "p"']),
    ("pools not strings", [P, l2adv("x", ipAddressPools="p")],
     ["L2Advertisement \"x\": spec.ipAddressPools: must be a list of strings, got 'p'"]),
    ("node selector not a list", [P, l2adv("x", nodeSelectors={"matchLabels": {"a": "b"}})],
     ["L2Advertisement \"x\": spec.nodeSelectors: must be a list of label selectors, got {'matchLabels': {'a': 'b'}}"]),
    ("bad interface", [P, l2adv("x", interfaces=["a-very-long-interface-name"])],
     ['L2Advertisement "x": spec.interfaces[0]: invalid interface name "a-very-long-interface-name"']),
    ("unknown l2 field", [P, l2adv("x", interface=["eth0"])],
     ['L2Advertisement "x": spec.interface: unknown field "interface"']),
    ("preferred weight", [P, l2adv("x", preferredNodeSelectors=[{"weight": 0, "preference": {}}])],
     ['L2Advertisement "x": spec.preferredNodeSelectors[0].weight: invalid value 0, must be in 1-100 range']),
    ("preferred missing weight", [P, l2adv("x", preferredNodeSelectors=[{"preference": {"matchLabels": {"a": "b"}}}])],
     ['L2Advertisement "x": spec.preferredNodeSelectors[0].weight: missing weight']),
    ("preferred not a list", [P, l2adv("x", preferredNodeSelectors={"weight": 1})],
     ["L2Advertisement \"x\": spec.preferredNodeSelectors: must be a list, got {'weight': 1}"]),
    # ---- BGPAdvertisement
    ("aggregation v4", [P, bgpadv("b", aggregationLength=33)],
     ['BGPAdvertisement "b": spec.aggregationLength: invalid aggregation length 33 for IPv4']),
    ("aggregation v6", [P, bgpadv("b", aggregationLengthV6=129)],
     ['BGPAdvertisement "b": spec.aggregationLengthV6: invalid aggregation length 129 for IPv6']),
    ("aggregation shorter than pool prefix", [P, bgpadv("b", aggregationLength=24)],
     ['BGPAdvertisement "b": spec.aggregationLength: invalid aggregation length 24: prefix 28 in this pool is more '
      'specific than the aggregation length for addresses 198.51.100.0/28 (pool "p")']),
    ("serviceSelectors with aggregation", [P, bgpadv("b", aggregationLength=30,
                                                     serviceSelectors=[{"matchLabels": {"a": "b"}}])],
     ['BGPAdvertisement "b": spec.aggregationLength: serviceSelectors and aggregationLength are mutually exclusive, '
      "both cannot be set in b"]),
    ("serviceSelectors with aggregation v6", [P, bgpadv("b", aggregationLengthV6=120,
                                                        serviceSelectors=[{"matchLabels": {"a": "b"}}])],
     ['BGPAdvertisement "b": spec.aggregationLengthV6: serviceSelectors and aggregationLengthV6 are mutually '
      "exclusive, both cannot be set in b"]),
    ("localPref range", [P, bgpadv("b", localPref=-5)],
     ['BGPAdvertisement "b": spec.localPref: invalid value -5, must be in 0-4294967295 range']),
    ("bad community value", [P, bgpadv("b", communities=["65536:1"])],
     ['BGPAdvertisement "b": spec.communities[0]: invalid community "65536:1" in BGP advertisement: invalid community '
      'value: invalid section "65536" of community "65536:1", err: "strconv.ParseUint: parsing \\"65536\\": value out '
      'of range"']),
    ("unknown community alias", [P, bgpadv("b", communities=["no-export"])],
     ['BGPAdvertisement "b": spec.communities[0]: invalid community "no-export" in BGP advertisement: invalid '
      "community format: no-export (neither a community value nor the name of one defined in a Community resource)"]),
    ("duplicate community", [P, bgpadv("b", communities=["1:1", "1:1"])],
     ['BGPAdvertisement "b": spec.communities: duplicate definition of community "1:1"']),
    ("unknown peer", [P, peer("r1"), bgpadv("b", peers=["r2"])],
     ['BGPAdvertisement "b": spec.peers[0]: unknown peer "r2" (defined BGPPeers: "r1")']),
    ("conflicting localPref", [P, bgpadv("a", localPref=100), bgpadv("b", localPref=200)],
     ['BGPAdvertisement "b": spec.localPref: invalid local preference 200: local preferernce 100 was already set for '
      "the same type of BGP update. Check existing BGP advertisements with common pools and aggregation lengths "
      '(BGPAdvertisement "a", pool "p")']),
    # ---- BGPPeer
    ("missing local ASN", [peer(myASN=None)], ['BGPPeer "router": spec.myASN: missing local ASN']),
    ("missing peer ASN", [peer(peerASN=None)], ['BGPPeer "router": spec.peerASN: missing peer ASN and dynamicASN']),
    ("both ASN and dynamic", [peer(dynamicASN="external")],
     ['BGPPeer "router": spec.dynamicASN: both peer ASN and dynamicASN specified (peerASN 64501, dynamicASN '
      '"external")']),
    ("bad dynamicASN", [peer(peerASN=None, dynamicASN="outside")],
     ['BGPPeer "router": spec.dynamicASN: invalid dynamicASN outside (must be internal or external)']),
    ("ASN range", [peer(myASN=2**32)], ['BGPPeer "router": spec.myASN: invalid value 4294967296, must be in '
                                        "0-4294967295 range", 'BGPPeer "router": spec.myASN: missing local ASN']),
    ("ebgp multihop on ibgp", [peer(peerASN=64500, ebgpMultiHop=True)],
     ['BGPPeer "router": spec.ebgpMultiHop: invalid ebgp-multihop parameter set for an ibgp peer']),
    ("no address", [peer(peerAddress=None)],
     ['BGPPeer "router": spec.peerAddress: peer has no Address or Interface specified']),
    ("address and interface", [peer(interface="eth1")],
     ['BGPPeer "router": spec.interface: peer has both Address and Interface specified ("198.51.100.1" and "eth1")']),
    ("bad address", [peer(peerAddress="198.51.100.300")],
     ['BGPPeer "router": spec.peerAddress: invalid BGPPeer address "198.51.100.300"']),
    ("bad router id", [peer(routerID="router-1")], ['BGPPeer "router": spec.routerID: invalid router ID "router-1"']),
    ("v6 router id", [peer(routerID="2001:db8::1")],
     ['BGPPeer "router": spec.routerID: invalid router ID "2001:db8::1": a router ID is an IPv4 address']),
    ("bad source", [peer(sourceAddress="x")], ['BGPPeer "router": spec.sourceAddress: invalid source IP "x"']),
    ("port range", [peer(peerPort=20000)],
     ['BGPPeer "router": spec.peerPort: invalid value 20000, must be in 1-16384 range']),
    ("hold time too short", [peer(holdTime="2s")],
     ['BGPPeer "router": spec.holdTime: invalid BGPPeer timers: invalid hold time "2s": must be 0 or >=3s']),
    ("hold time from keepalive", [peer(keepaliveTime="900ms")],
     ['BGPPeer "router": spec.holdTime: invalid BGPPeer timers: invalid hold time "2.7s": must be 0 or >=3s']),
    ("keepalive above hold", [peer(holdTime="30s", keepaliveTime="31s")],
     ['BGPPeer "router": spec.keepaliveTime: invalid BGPPeer timers: invalid keepaliveTime "31s", must be lower than '
      'holdTime "30s"']),
    ("bad duration", [peer(holdTime="90")],
     ['BGPPeer "router": spec.holdTime: invalid BGPPeer timers: time: missing unit in duration "90"']),
    ("bad duration text", [peer(keepaliveTime="soon")],
     ['BGPPeer "router": spec.keepaliveTime: invalid BGPPeer timers: time: invalid duration "soon"']),
    ("negative duration", [peer(holdTime="-3s")],
     ['BGPPeer "router": spec.holdTime: invalid BGPPeer timers: negative duration "-3s"']),
    ("connect time range", [peer(connectTime="0s")],
     ['BGPPeer "router": spec.connectTime: connect time should be between 1 seconds to 65535, got "0s"']),
    ("connect time fraction", [peer(connectTime="1500ms")],
     ['BGPPeer "router": spec.connectTime: connect time should contain a whole number of seconds, got "1500ms"']),
    ("connect time text", [peer(connectTime=5)], ['BGPPeer "router": spec.connectTime: time: invalid duration "5"']),
    ("missing bfd profile", [peer(bfdProfile="fast")],
     ['BGPPeer "router": spec.bfdProfile: peer router referencing non existing bfd profile fast']),
    ("password and secret", [peer(password="a", passwordSecret={"name": "s"})],
     ['BGPPeer "router": spec.passwordSecret: can not have both password and secret ref set in peer config ""/'
      '"router"']),
    ("missing secret", [peer(passwordSecret={"name": "s"})],
     ['BGPPeer "router": spec.passwordSecret.name: secret ref not found for peer config "router": no Secret named '
      '"s"']),
    ("secret type", [peer(passwordSecret={"name": "s"}),
                     {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                      "stringData": {"password": "x"}}],
     ['BGPPeer "router": spec.passwordSecret.name: secret type mismatch on "s", type "kubernetes.io/basic-auth" is '
      'expected (got "Opaque")']),
    ("secret without password", [peer(passwordSecret={"name": "s"}),
                                 {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                                  "type": "kubernetes.io/basic-auth", "data": {"username": "dXNlcg=="}}],
     ['BGPPeer "router": spec.passwordSecret.name: password not specified in the secret "s"']),
    ("secret bad base64",
     [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "!"}}],
     ['Secret "s": data.password: invalid base64 value']),
    ("secretRef field", [peer(passwordSecret={"name": "s", "key": "k"}),
                         {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                          "type": "kubernetes.io/basic-auth", "stringData": {"password": "x"}}],
     ['BGPPeer "router": spec.passwordSecret.key: unknown field "key"']),
    ("duplicate peer", [peer("a"), peer("b", peerASN=64502)],
     ['BGPPeer "b": spec.peerAddress: peer 198.51.100.1 already exists, FRR mode doesn\'t support duplicate BGPPeers '
      'selecting the same node (BGPPeer "a")']),
    ("duplicate peer interface in vrf", [peer("a", peerAddress=None, interface="eth1", vrf="red"),
                                         peer("b", peerAddress=None, interface="eth1", vrf="red")],
     ['BGPPeer "b": spec.interface: peer eth1-red already exists, FRR mode doesn\'t support duplicate BGPPeers '
      'selecting the same node (BGPPeer "a")']),
    ("router ids differ", [peer("a", routerID="198.51.100.10"), peer("b", peerAddress="198.51.100.2")],
     ['BGPPeer "b": spec.routerID: peer  has RouterID different from 198.51.100.10, in FRR mode peers selecting the '
      'same node must all have the same RouterID (BGPPeer "a")']),
    ("myASN differs", [peer("a"), peer("b", myASN=64510, peerAddress="198.51.100.2")],
     ['BGPPeer "b": spec.myASN: peer 198.51.100.2 has myAsn different from 198.51.100.1, in FRR mode peers selecting '
      'the same node must have the same myAsn within the same VRF (BGPPeer "a")']),
    ("bfd echo with IPv6 pool", [pool("v6", "2001:db8::/120"), bfd("echo", echoMode=True),
                                 peer("a", bfdProfile="echo"), bgpadv("adv")],
     ['BGPAdvertisement "adv": spec: pool v6 has bgpadvertisement adv which references peer a which has bfd echo '
      'enabled, which is not possible (the pool has IPv6 addresses; BFDProfile "echo" sets echoMode)']),
    ("v1beta3 peer", [dict(peer(), apiVersion="metallb.io/v1beta3")],
     ['BGPPeer "router": apiVersion: "metallb.io/v1beta3" is not supported for BGPPeer, use metallb.io/v1beta2 or '
      "metallb.io/v1beta1"]),
    ("bool as int", [peer(myASN=True)], ['BGPPeer "router": spec.myASN: must be an integer, got True',
                                         'BGPPeer "router": spec.myASN: missing local ASN']),
    # ---- BFDProfile
    ("detect multiplier", [bfd(detectMultiplier=1)],
     ['BFDProfile "bfd": spec.detectMultiplier: invalid detect multiplier value: invalid value 1, must be in 2-255 '
      "range"]),
    ("receive interval", [bfd(receiveInterval=60001)],
     ['BFDProfile "bfd": spec.receiveInterval: invalid receive interval value: invalid value 60001, must be in '
      "10-60000 range"]),
    ("transmit interval", [bfd(transmitInterval=9)],
     ['BFDProfile "bfd": spec.transmitInterval: invalid transmit interval value: invalid value 9, must be in 10-60000 '
      "range"]),
    ("minimum ttl", [bfd(minimumTtl=255)],
     ['BFDProfile "bfd": spec.minimumTtl: invalid minimum ttl value: invalid value 255, must be in 1-254 range']),
    ("echo interval", [bfd(echoInterval="50ms")],
     ["BFDProfile \"bfd\": spec.echoInterval: invalid echo interval value: must be an integer, got '50ms'"]),
    ("echo mode", [bfd(echoMode="on")], ["BFDProfile \"bfd\": spec.echoMode: must be true or false, got 'on'"]),
    ("bfd unknown field", [bfd(minimumTTL=3)], ['BFDProfile "bfd": spec.minimumTTL: unknown field "minimumTTL"']),
    # ---- Community
    ("community format", [community(bad="1:2:3")],
     ['Community "communities": spec.communities[0].value: parsing community "bad": invalid community format: 1:2:3']),
    ("large marker", [community(big="huge:1:2:3")],
     ['Community "communities": spec.communities[0].value: parsing community "big": invalid community value: invalid '
      'marker for large community, expected community to be of format large:<uint32>:<uint32>:<uint32> but got '
      '"huge:1:2:3" instead']),
    ("large section", [community(big="large:1:x:3")],
     ['Community "communities": spec.communities[0].value: parsing community "big": invalid community value: invalid '
      'section "x" of community "large:1:x:3", err: "strconv.ParseUint: parsing \\"x\\": invalid syntax"']),
    ("duplicate alias", [community("c1", a="1:1"), community("c2", a="1:2")],
     ['Community "c2": spec.communities[0].name: duplicate definition of community "a"']),
    ("alias without name", [{"apiVersion": "metallb.io/v1beta1", "kind": "Community", "metadata": {"name": "c"},
                             "spec": {"communities": [{"value": "1:1"}]}}],
     ['Community "c": spec.communities[0].name: missing community name, got None']),
    ("communities not a list", [{"apiVersion": "metallb.io/v1beta1", "kind": "Community", "metadata": {"name": "c"},
                                 "spec": {"communities": {"a": "1:1"}}}],
     ["Community \"c\": spec.communities: must be a list of name/value pairs, got {'a': '1:1'}"]),
    # ---- Service
    # (bad address requests - not an address, both fields, two of one family - fail that service alone, at
    # allocation: test_allocation.py::test_one_bad_request_among_five_fails_only_that_service)
    ("loadBalancerIPs not a string", [service(annotations={"metallb.io/loadBalancerIPs": ["198.51.100.1"]})],
     ["Service \"prod/web\": metadata.annotations[metallb.io/loadBalancerIPs]: must be a string, got "
      "['198.51.100.1']"]),
    ("not LoadBalancer", [service(type="ClusterIP")],
     ['Service "prod/web": spec.type: "ClusterIP" is not supported: only services of type LoadBalancer get an '
      "address"]),
    ("no type", [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                  "spec": {"ports": [{"port": 1}]}}],
     ['Service "default/web": spec.type: missing: set type: LoadBalancer (Kubernetes would default to ClusterIP, '
      "which gets no address)"]),
    ("traffic policy", [service(externalTrafficPolicy="local")],
     ['Service "prod/web": spec.externalTrafficPolicy: Unsupported value: "local": supported values: "Cluster", '
      '"Local"']),
    ("port range", [service(ports=[{"port": 0}])],
     ['Service "prod/web": spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive']),
    ("protocol", [service(ports=[{"port": 53, "protocol": "udp"}])],
     ['Service "prod/web": spec.ports[0].protocol: Unsupported value: "udp": supported values: "SCTP", "TCP", "UDP"']),
    ("duplicate port", [service(ports=[{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "UDP"}])],
     ['Service "prod/web": spec.ports[1]: Duplicate value: port 53/UDP']),
    ("ports not a list", [service(ports={"port": 53})],
     ["Service \"prod/web\": spec.ports: must be a list, got {'port': 53}"]),
    ("unknown port field", [service(ports=[{"port": 53, "proto": "UDP"}])],
     ['Service "prod/web": spec.ports[0].proto: unknown field "proto"']),
    ("unknown spec field", [service(loadBalancerIPs=["198.51.100.1"])],
     ['Service "prod/web": spec.loadBalancerIPs: unknown field "loadBalancerIPs"']),
    ("ip families", [service(ipFamilies=["IPv4", "IPv4"])],
     ['Service "prod/web": spec.ipFamilies: Invalid value: [\'IPv4\', \'IPv4\']: must be one or two distinct values of '
      '"IPv4", "IPv6"']),
    ("single stack with two families", [service(ipFamilies=["IPv4", "IPv6"])],
     ['Service "prod/web": spec.ipFamilies: Invalid value: [\'IPv4\', \'IPv6\']: when spec.ipFamilyPolicy is '
      "SingleStack, only one IP family may be given"]),
    ("family policy", [service(ipFamilyPolicy="DualStack")],
     ['Service "prod/web": spec.ipFamilyPolicy: Unsupported value: "DualStack": supported values: "PreferDualStack", '
      '"RequireDualStack", "SingleStack"']),
    ("status ip", [service(status_ips=["198.51.100.999"])],
     ['Service "prod/web": status.loadBalancer.ingress[0].ip: invalid IP address "198.51.100.999"']),
    ("status field", [dict(service(), status={"loadBalancer": {"ingres": []}})],
     ['Service "prod/web": status.loadBalancer.ingres: unknown field "ingres"']),
    ("annotation not a string", [service(annotations={"metallb.io/address-pool": ["a"]})],
     ["Service \"prod/web\": metadata.annotations[metallb.io/address-pool]: must be a string, got ['a']"]),
    ("duplicate service", [service(), service()],
     ['Service "prod/web": metadata.name: duplicate definition of Service "prod/web" (also at resources[0])']),
    ("health check", [service(annotations={"nocloud.io/health-check": "udp://127.0.0.1:53"})],
     ['Service "prod/web": metadata.annotations[nocloud.io/health-check]: invalid health check "udp://127.0.0.1:53": '
      'unsupported health check "udp://127.0.0.1:53": use tcp://HOST:PORT, http(s)://HOST:PORT/PATH, exec:COMMAND or '
      "a JSON object"]),
    ("bad namespace", [service(namespace="Prod")],
     ['Service "Prod/web": metadata.namespace: "Prod" is not a valid namespace name']),
]


@pytest.mark.parametrize("docs, expected", [pytest.param(d, e, id=i) for i, d, e in CASES])
def test_errors(docs, expected):
    assert errors_of(docs) == expected


# --------------------------------------------------------------------------- building blocks


@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0), ("0", 0.0), ("1.5s", 1.5), ("-2s", -2.0),
     ("10us", 1e-5), ("2h45m", 9900.0)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, message", [
    ("", 'time: invalid duration ""'), ("s", 'time: invalid duration "s"'), ("5", 'time: missing unit in duration "5"'),
    ("5d", 'time: invalid duration "5d"'), (5, 'time: invalid duration "5"'),
])
def test_parse_duration_errors(text, message):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(info.value) == message


@pytest.mark.parametrize("value, expected", [
    ("65535:65281", "65535:65281"), ("0:0", "0:0"), ("large:4294967295:0:1", "large:4294967295:0:1"),
    ("007:8", "7:8"),
])
def test_parse_community(value, expected):
    assert parse_community(value) == expected


@pytest.mark.parametrize("value, ports, expected", [
    ("tcp://:8080", [], {"type": "tcp", "host": "127.0.0.1", "port": 8080, "path": None}),
    ("tcp://198.51.100.5", [(443, "TCP")], {"type": "tcp", "host": "198.51.100.5", "port": 443}),
    ("https://localhost:8443/ready?x=1", [], {"type": "https", "host": "localhost", "port": 8443,
                                              "path": "/ready?x=1"}),
    ("http://127.0.0.1", [(80, "TCP")], {"type": "http", "port": 80, "path": "/"}),
    ("exec:/usr/local/bin/check --quick 'a b'", [],
     {"type": "exec", "command": ["/usr/local/bin/check", "--quick", "a b"], "host": None, "port": None}),
    ('{"type": "tcp", "port": 22, "interval": "500ms", "timeout": 0.2, "rise": 1, "fall": 1}', [],
     {"type": "tcp", "port": 22, "interval": 0.5, "timeout": 0.2, "rise": 1, "fall": 1}),
    ({"type": "exec", "command": "true"}, [], {"command": ["true"], "interval": 2.0, "timeout": 1.0, "fall": 3}),
])
def test_health_check_forms(value, ports, expected):
    result = parse_health_check(value, ports)
    assert {k: result[k] for k in expected} == expected


@pytest.mark.parametrize("value, message", [
    ("tcp://:99999", 'invalid port in "tcp://:99999"'),
    ("tcp://127.0.0.1:80/x", 'a tcp health check takes no path, got "tcp://127.0.0.1:80/x"'),
    ("tcp://127.0.0.1", "port: no port given and the service has no ports"),
    ("{nope", 'invalid JSON "{nope": Expecting property name enclosed in double quotes: line 1 column 2 (char 1)'),
    ('{"type": "tcp", "port": 1, "retries": 3}',
     'unknown field "retries" (known: command, fall, host, interval, path, port, rise, timeout, type)'),
    ('{"type": "icmp"}', 'type: "icmp" is not one of tcp, http, https, exec'),
    ('{"type": "exec", "command": []}', "command: must be a non-empty list of strings, got []"),
    ('{"type": "tcp", "port": 1, "host": "bad host"}', 'host: invalid host "bad host"'),
    ('{"type": "http", "port": 1, "path": "ready"}', "path: must start with '/', got 'ready'"),
    ('{"type": "tcp", "port": 1, "interval": 0}', "interval: must be a positive number of seconds, got 0"),
    ('{"type": "tcp", "port": 1, "interval": "x"}', 'interval: time: invalid duration "x"'),
    ('{"type": "tcp", "port": 1, "interval": 1, "timeout": 2}', "timeout 2s must not exceed interval 1s"),
    ('{"type": "tcp", "port": 1, "rise": 0}', "rise: must be an integer >= 1, got 0"),
    ('["tcp"]',
     'unsupported health check "[\\"tcp\\"]": use tcp://HOST:PORT, http(s)://HOST:PORT/PATH, exec:COMMAND or a JSON '
     "object"),
    (42, "must be a string, got 42"),
    ("exec:'unclosed", 'invalid command "\'unclosed": No closing quotation'),
])
def test_health_check_errors(value, message):
    with pytest.raises(ValueError) as info:
        parse_health_check(value, [])
    assert str(info.value) == message


def test_config_error_str_and_list():
    err = ConfigError(["a", "b"])
    assert err.errors == ["a", "b"] and str(err) == "a\nb"
    assert ConfigError("only").errors == ["only"]


def test_frr_rules_spare_peers_on_other_nodes():
    """Peers with different nodeSelectors are taken to run on different nodes (different ASNs, router IDs)."""
    docs = [
        peer("a", nodeSelectors=[{"matchLabels": {"rack": "1"}}], routerID="198.51.100.11"),
        peer("b", nodeSelectors=[{"matchLabels": {"rack": "2"}}], myASN=64510, routerID="198.51.100.12"),
        peer("c", nodeSelectors=[{"matchLabels": {"rack": "1"}}], routerID="198.51.100.11", vrf="red", myASN=64511),
        # IPv4-only pool: BFD echo is fine there.
        pool("v4", "198.51.100.0/28"),
        bfd("echo", echoMode=True),
        peer("d", bfdProfile="echo", peerAddress="192.0.2.1", nodeSelectors=[{"matchLabels": {"x": "y"}}]),
        bgpadv("adv"),
    ]
    assert [p.name for p in parse_resources(docs).bgp_peers] == ["a", "b", "c", "d"]


# --------------------------------------------------------------------------- robustness

_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.text(max_size=12),
                  st.lists(st.text(max_size=5), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                                             max_size=2))
_PREFIX = re.compile(r'^(resources(\[\d+\])?(\.items\[\d+\])?( \(\w+\))?|\w+ "(?:[^"\\]|\\.)*"): ')


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, prefix + (index,))


def _replace(node, path, value):
    if not path:
        return value
    node = copy.copy(node)
    node[path[0]] = _replace(node[path[0]], path[1:], value)
    return node


_ALL_DOCS = [d for name in ("metallb_l2.manifest", "metallb_bgp.manifest", "metallb_allocation.manifest")
             for d in load_manifest(name) if d is not None]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_manifests_fail_cleanly(data):
    """Any field replaced by junk: parse_resources either accepts it or raises ConfigError, never crashes,
    and every message starts with the resource it is about."""
    docs = list(_ALL_DOCS)
    for _round in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(docs) - 1))
        paths = list(_paths(docs[index]))
        path = data.draw(st.sampled_from(paths))
        docs[index] = _replace(docs[index], path, data.draw(_JUNK))
    try:
        parse_resources(docs)
    except ConfigError as exc:
        assert exc.errors
        for message in exc.errors:
            assert _PREFIX.match(message), message


MORE_CASES = [
    ("preferred item not a mapping", [P, l2adv("x", preferredNodeSelectors=["edge"])],
     ["L2Advertisement \"x\": spec.preferredNodeSelectors[0]: must be a mapping with weight and preference, "
      "got 'edge'"]),
    ("preferred preference invalid",
     [P, l2adv("x", preferredNodeSelectors=[{"weight": 5, "preference": {"x": 1}}])],
     ['L2Advertisement "x": spec.preferredNodeSelectors[0].preference: unknown field "x"']),
    ("community item not a mapping",
     [{"apiVersion": "metallb.io/v1beta1", "kind": "Community", "metadata": {"name": "c"},
       "spec": {"communities": ["1:1"]}}],
     ["Community \"c\": spec.communities[0]: must be a mapping with name and value, got '1:1'"]),
    ("annotations not a mapping", [dict(service(), metadata={"name": "web", "annotations": ["a"]})],
     ["Service \"default/web\": metadata.annotations: must be a mapping of strings, got ['a']"]),
    ("status not a mapping", [dict(service(), status="up")],
     ["Service \"prod/web\": status: must be a mapping, got 'up'"]),
    ("loadBalancer not a mapping", [dict(service(), status={"loadBalancer": ["198.51.100.1"]})],
     ["Service \"prod/web\": status.loadBalancer: must be a mapping with ingress, got ['198.51.100.1']"]),
    ("ingress not a list", [dict(service(), status={"loadBalancer": {"ingress": {"ip": "198.51.100.1"}}})],
     ["Service \"prod/web\": status.loadBalancer.ingress: must be a list, got {'ip': '198.51.100.1'}"]),
    ("ingress item not a mapping", [dict(service(), status={"loadBalancer": {"ingress": ["198.51.100.1"]}})],
     ["Service \"prod/web\": status.loadBalancer.ingress[0]: must be a mapping with ip, got '198.51.100.1'"]),
    ("secret data not a mapping", [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": ["x"]}],
     ["Secret \"s\": data: must be a mapping, got ['x']"]),
    ("secret stringData not a mapping", [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                                          "stringData": "x"}],
     ["Secret \"s\": stringData: must be a mapping, got 'x'"]),
    ("list items not a list", [{"apiVersion": "v1", "kind": "List", "items": {"a": 1}}],
     ["resources[0].items: must be a list of documents, got {'a': 1}"]),
    ("health check port", [service(annotations={"nocloud.io/health-check": '{"type": "tcp", "port": 70000}'})],
     ['Service "prod/web": metadata.annotations[nocloud.io/health-check]: invalid health check '
      '"{\\"type\\": \\"tcp\\", \\"port\\": 70000}": port: invalid port 70000, must be in 1-65535 range']),
    ("namespace not a string", [dict(service(), metadata={"name": "web", "namespace": 7})],
     ['Service "7/web": metadata.namespace: must be a string, got 7']),
]


@pytest.mark.parametrize("docs, expected", [pytest.param(d, e, id=i) for i, d, e in MORE_CASES])
def test_more_errors(docs, expected):
    assert errors_of(docs) == expected


def test_local_prefs_that_do_not_collide():
    """Different localPref is fine when the updates differ: aggregation, peers or nodes."""
    dual = pool("d", "198.51.100.16/28", "2001:db8::/120")
    v6 = pool("six", "2001:db8:1::/120")
    docs = [
        P, dual, v6, peer("r1"), peer("r2", peerAddress="198.51.100.2"),
        bgpadv("a", ipAddressPools=["p"], localPref=100),
        bgpadv("b", ipAddressPools=["p"], localPref=200, aggregationLength=30),  # IPv4 pool, other aggregation
        bgpadv("c", ipAddressPools=["d"], localPref=100, peers=["r1"]),
        bgpadv("e", ipAddressPools=["d"], localPref=200, peers=["r2"]),  # disjoint peers
        bgpadv("f", ipAddressPools=["d"], localPref=300, nodeSelectors=[{"matchLabels": {"rack": "9"}}]),
        bgpadv("g", ipAddressPools=["six"], localPref=100),
        bgpadv("h", ipAddressPools=["six"], localPref=200, aggregationLengthV6=124),  # IPv6 pool, other aggregation
        bgpadv("i", ipAddressPools=["d"], localPref=400, aggregationLength=30, aggregationLengthV6=124,
               nodeSelectors=[{"matchLabels": {"rack": "8"}}]),
        bgpadv("j", ipAddressPools=["d"], localPref=500, serviceSelectors=[{"matchLabels": {"a": "b"}}]),
    ]
    config = parse_resources(docs)
    assert [a.local_pref for a in config.bgp_advertisements] == [100, 200, 100, 200, 300, 100, 200, 400, 500]
    h = config.bgp_advertisements[6]
    assert h.selects_node({}) and h.selects_service({})
    j = config.bgp_advertisements[-1]
    assert j.selects_service({"a": "b"}) and not j.selects_service({})
    assert not config.bgp_advertisements[4].selects_node({"rack": "1"})


def test_peer_connect_time_and_lookup_helpers():
    config = parse_resources([peer(connectTime="10s"), service()])
    assert config.bgp_peers[0].connect_time == 10.0
    assert config.service("prod/web") is config.services[0] and config.service("prod/nope") is None
    assert config.pool_for_ip("not an ip") is None
