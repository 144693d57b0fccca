# -*- coding: utf-8 -*-
"""Table tests of the allocator: MetalLB's semantics, our determinism and stability."""

from __future__ import annotations

import pytest
from nocloudlb.core.allocation import LOAD_BALANCER_CLASS, allocate, normalize_previous
from nocloudlb.core.errors import ConfigError
from nocloudlb.core.schema import Config, Service, parse_resources


def pool(name, *addresses, auto=None, buggy=None, allocation=None, labels=None):
    spec = {"addresses": list(addresses)}
    if auto is not None:
        spec["autoAssign"] = auto
    if buggy is not None:
        spec["avoidBuggyIPs"] = buggy
    if allocation is not None:
        spec["serviceAllocation"] = allocation
    meta = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": meta, "spec": spec}


def svc(name, ns="default", ports=((80, "TCP"),), ann=None, labels=None, ingress=None, **spec):
    meta = {"name": name, "namespace": ns}
    if ann:
        meta["annotations"] = dict(ann)
    if labels:
        meta["labels"] = dict(labels)
    doc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"type": "LoadBalancer", "ports": [{"port": p, "protocol": proto} for p, proto in ports], **spec},
    }
    if ingress is not None:
        doc["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in ingress]}}
    return doc


def namespace(name, labels):
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def run(docs, previous=None):
    return allocate(parse_resources(docs), previous or {})


def ips(result):
    return result.assignments


def err(result, key):
    return result.services[key].error


SHARE = "metallb.io/allow-shared-ip"
IPS = "metallb.io/loadBalancerIPs"
POOL = "metallb.io/address-pool"


# --------------------------------------------------------------------------- basics


def test_lowest_free_addresses_in_key_order_and_pool_reported():
    r = run([pool("p", "203.0.113.10-203.0.113.12"), svc("b"), svc("a"), svc("c")])
    assert ips(r) == {"default/a": ["203.0.113.10"], "default/b": ["203.0.113.11"], "default/c": ["203.0.113.12"]}
    assert {k: a.pool for k, a in r.services.items()} == {"default/a": "p", "default/b": "p", "default/c": "p"}
    assert r.failed == []
    assert r.pool_usage == {"p": {"ipv4": {"assigned": 3, "available": 0}}}


def test_exhausted_pool_fails_one_service_with_metallb_message_and_serves_the_others():
    r = run([pool("p", "203.0.113.10/31"), svc("a"), svc("b"), svc("c")])
    assert ips(r) == {"default/a": ["203.0.113.10"], "default/b": ["203.0.113.11"]}
    assert r.failed == ['Failed to allocate IP for "default/c": no available IPs']
    assert r.services["default/c"].ips == [] and r.services["default/c"].pool is None


def test_pools_are_tried_by_name_not_manifest_order():
    r = run([pool("zeta", "203.0.113.0/30"), pool("alpha", "203.0.113.8/30"), svc("a")])
    assert ips(r) == {"default/a": ["203.0.113.8"]}


def test_other_load_balancer_class_is_left_alone_ours_and_none_are_served():
    r = run([
        pool("p", "203.0.113.10-203.0.113.20"),
        svc("foreign", loadBalancerClass="example.com/other"),
        svc("mine", loadBalancerClass=LOAD_BALANCER_CLASS),
        svc("plain"),
    ])
    assert set(ips(r)) == {"default/mine", "default/plain"}
    assert "default/foreign" in r.skipped and "example.com/other" in r.skipped["default/foreign"]
    assert "default/foreign" not in r.services
    assert r.failed == []


# --------------------------------------------------------------------------- requests


def test_explicit_address_via_annotation_and_deprecated_spec_field():
    r = run([
        pool("p", "203.0.113.10-203.0.113.20"),
        svc("a", ann={IPS: "203.0.113.15"}),
        svc("b", loadBalancerIP="203.0.113.17"),
        svc("c"),
    ])
    assert ips(r) == {"default/a": ["203.0.113.15"], "default/b": ["203.0.113.17"], "default/c": ["203.0.113.10"]}


def test_explicit_address_outside_every_pool_is_not_allowed_in_config():
    r = run([pool("p", "203.0.113.10-203.0.113.20"), svc("a", ann={IPS: "192.0.2.1"}), svc("b")])
    assert err(r, "default/a") == 'Failed to allocate IP for "default/a": ["192.0.2.1"] is not allowed in config'
    assert ips(r) == {"default/b": ["203.0.113.10"]}


def test_new_explicit_requests_are_served_before_new_automatic_ones():
    # "a" sorts first but must not take the address "b" asked for
    r = run([pool("p", "203.0.113.10/31"), svc("a"), svc("b", ann={IPS: "203.0.113.10"})])
    assert ips(r) == {"default/a": ["203.0.113.11"], "default/b": ["203.0.113.10"]}


def test_unknown_pool_and_full_pool():
    r = run([
        pool("p", "203.0.113.10/32"),
        svc("a", ann={POOL: "nope"}),
        svc("b", ann={POOL: "p"}),
        svc("c", ann={POOL: "p"}),
    ])
    assert err(r, "default/a") == 'Failed to allocate IP for "default/a": unknown pool "nope"'
    assert ips(r) == {"default/b": ["203.0.113.10"]}
    assert err(r, "default/c") == 'Failed to allocate IP for "default/c": no available IPs in pool "p"'


def test_explicit_address_must_match_the_requested_pool():
    r = run([
        pool("p", "203.0.113.10/31"),
        pool("q", "203.0.113.20/31"),
        svc("a", ann={IPS: "203.0.113.10", POOL: "q"}),
        svc("b", ann={IPS: "203.0.113.20", POOL: "q"}),
    ])
    assert err(r, "default/a") == (
        'Failed to allocate IP for "default/a": requested loadBalancer IP(s) ["203.0.113.10"] is not compatible '
        "with requested address pool q"
    )
    assert ips(r) == {"default/b": ["203.0.113.20"]}


def test_auto_assign_false_pool_only_by_explicit_request():
    docs = [pool("manual", "203.0.113.10/31", auto=False), pool("zauto", "203.0.113.20/32")]
    r = run(docs + [svc("a"), svc("b"), svc("c", ann={POOL: "manual"}), svc("d", ann={IPS: "203.0.113.11"})])
    assert ips(r) == {"default/a": ["203.0.113.20"], "default/c": ["203.0.113.10"], "default/d": ["203.0.113.11"]}
    assert r.failed == ['Failed to allocate IP for "default/b": no available IPs']


def test_avoid_buggy_ips_skips_dot_zero_and_dot_255_and_refuses_them_explicitly():
    r = run([
        pool("p", "203.0.113.254-203.0.113.255", "198.51.100.0/30", buggy=True),
        svc("a"), svc("b"), svc("c"), svc("d"),
        svc("e", ann={IPS: "203.0.113.255"}),
    ])
    assigned = sorted(ip for v in ips(r).values() for ip in v)
    assert assigned == ["198.51.100.1", "198.51.100.2", "198.51.100.3", "203.0.113.254"]
    assert err(r, "default/e") == 'Failed to allocate IP for "default/e": ["203.0.113.255"] is not allowed in config'
    assert r.pool_usage["p"]["ipv4"] == {"assigned": 4, "available": 0}


# --------------------------------------------------------------------------- sharing


def test_same_sharing_key_and_distinct_ports_share_one_address():
    r = run([
        pool("p", "203.0.113.10-203.0.113.20"),
        svc("dns-tcp", ports=[(53, "TCP")], ann={SHARE: "dns"}),
        svc("dns-udp", ports=[(53, "UDP")], ann={SHARE: "dns"}),
        svc("other"),
    ])
    assert ips(r) == {
        "default/dns-tcp": ["203.0.113.10"],
        "default/dns-udp": ["203.0.113.10"],
        "default/other": ["203.0.113.11"],
    }
    assert r.pool_usage["p"]["ipv4"]["assigned"] == 2


def test_same_key_but_overlapping_ports_get_different_addresses():
    r = run([
        pool("p", "203.0.113.10-203.0.113.20"),
        svc("a", ann={SHARE: "k"}),
        svc("b", ann={SHARE: "k"}),
    ])
    assert ips(r) == {"default/a": ["203.0.113.10"], "default/b": ["203.0.113.11"]}


def test_explicit_sharing_conflicts_use_metallb_messages():
    r = run([
        pool("p", "203.0.113.10-203.0.113.20"),
        svc("a", ann={SHARE: "k", IPS: "203.0.113.12"}),
        svc("b", ann={SHARE: "k", IPS: "203.0.113.12"}),
        svc("c", ann={SHARE: "other", IPS: "203.0.113.12"}, ports=[(81, "TCP")]),
        svc("d", ann={IPS: "203.0.113.12"}, ports=[(82, "TCP")]),
        svc("e", ann={SHARE: "k", IPS: "203.0.113.12"}, ports=[(83, "TCP")]),
    ])
    assert err(r, "default/b") == (
        'Failed to allocate IP for "default/b": port TCP/80 is already in use on "203.0.113.12"'
    )
    assert err(r, "default/c") == (
        'Failed to allocate IP for "default/c": can\'t change sharing key for "default/c", address also in use by '
        "default/a,default/e"
    )
    assert err(r, "default/d").endswith("address also in use by default/a,default/e")
    assert ips(r) == {"default/a": ["203.0.113.12"], "default/e": ["203.0.113.12"]}


def test_cluster_and_local_never_share_local_shares_only_with_the_same_health_check():
    hc1 = '{"type": "tcp", "port": 8080}'
    hc2 = '{"type": "tcp", "port": 8081}'
    docs = [
        pool("p", "203.0.113.10-203.0.113.20"),
        svc("cluster", ann={SHARE: "k"}, ports=[(1, "TCP")]),
        svc("local1", ann={SHARE: "k", "nocloud.io/health-check": hc1}, ports=[(2, "TCP")],
            externalTrafficPolicy="Local"),
        svc("local2", ann={SHARE: "k", "nocloud.io/health-check": hc1}, ports=[(3, "TCP")],
            externalTrafficPolicy="Local"),
        svc("local3", ann={SHARE: "k", "nocloud.io/health-check": hc2}, ports=[(4, "TCP")],
            externalTrafficPolicy="Local"),
    ]
    r = run(docs)
    assert ips(r) == {
        "default/cluster": ["203.0.113.10"],
        "default/local1": ["203.0.113.11"],
        "default/local2": ["203.0.113.11"],
        "default/local3": ["203.0.113.12"],
    }
    r = run(docs + [svc("want", ann={SHARE: "k", IPS: "203.0.113.11"}, ports=[(5, "TCP")])], r.assignments)
    assert "can't change sharing key" in err(r, "default/want")


# --------------------------------------------------------------------------- dual stack


DUAL = pool("dual", "203.0.113.10/31", "2001:db8::10/127")


def test_require_dual_stack_gets_both_families_from_one_pool_in_ip_families_order():
    r = run([
        DUAL,
        svc("a", ipFamilyPolicy="RequireDualStack"),
        svc("b", ipFamilyPolicy="RequireDualStack", ipFamilies=["IPv6", "IPv4"]),
        svc("c", ipFamilyPolicy="RequireDualStack"),
    ])
    assert ips(r) == {"default/a": ["203.0.113.10", "2001:db8::10"], "default/b": ["2001:db8::11", "203.0.113.11"]}
    assert err(r, "default/c") == 'Failed to allocate IP for "default/c": no available IPs'


def test_require_dual_stack_never_mixes_pools():
    r = run([
        pool("v4", "203.0.113.10/32"),
        pool("v6", "2001:db8::10/128"),
        svc("a", ipFamilyPolicy="RequireDualStack"),
        svc("b", ipFamilyPolicy="RequireDualStack", ann={POOL: "v4"}),
    ])
    assert ips(r) == {}
    assert err(r, "default/b") == (
        'Failed to allocate IP for "default/b": no available IPs in pool "v4" for DualStack IPFamily'
    )


def test_prefer_dual_stack_takes_a_dual_pool_else_one_family():
    r = run([
        pool("a-v4only", "203.0.113.10/32"),
        pool("b-dual", "203.0.113.20/32", "2001:db8::20/128"),
        svc("x", ipFamilyPolicy="PreferDualStack"),
        svc("y", ipFamilyPolicy="PreferDualStack"),
        svc("z", ipFamilyPolicy="PreferDualStack"),
    ])
    # MetalLB's findBestPoolForService: the first pool that can give both wins over an earlier single-family one
    assert ips(r) == {"default/x": ["203.0.113.20", "2001:db8::20"], "default/y": ["203.0.113.10"]}
    assert "no available IPs" in err(r, "default/z")


def test_single_stack_families():
    r = run([
        DUAL,
        svc("v6", ipFamilies=["IPv6"]),
        svc("v4", ipFamilies=["IPv4"]),
        svc("any"),
        svc("v6b", ipFamilyPolicy="SingleStack", ipFamilies=["IPv6"]),
        svc("v6c", ipFamilies=["IPv6"]),
    ])
    assert ips(r) == {
        "default/any": ["203.0.113.10"],
        "default/v4": ["203.0.113.11"],
        "default/v6": ["2001:db8::10"],
        "default/v6b": ["2001:db8::11"],
    }
    assert err(r, "default/v6c") == 'Failed to allocate IP for "default/v6c": no available IPs'


def test_single_stack_without_families_falls_back_to_ipv6():
    r = run([pool("v6", "2001:db8::/126"), svc("a")])
    assert ips(r) == {"default/a": ["2001:db8::"]}


def test_explicit_addresses_must_match_the_family_policy():
    r = run([
        DUAL,
        svc("single2", ann={IPS: "203.0.113.10,2001:db8::10"}),
        svc("req1", ann={IPS: "203.0.113.10"}, ipFamilyPolicy="RequireDualStack"),
        svc("fam", ann={IPS: "203.0.113.10"}, ipFamilies=["IPv6"]),
        svc("ok", ann={IPS: "2001:db8::11, 203.0.113.11"}, ipFamilyPolicy="RequireDualStack"),
    ])
    for key in ("default/single2", "default/req1", "default/fam"):
        assert "does not match the ipFamily of the service" in err(r, key), key
    assert ips(r) == {"default/ok": ["203.0.113.11", "2001:db8::11"]}


def test_explicit_pair_across_two_pools_is_refused():
    r = run([
        pool("v4", "203.0.113.10/32"),
        pool("v6", "2001:db8::10/128"),
        svc("a", ann={IPS: "203.0.113.10,2001:db8::10"}, ipFamilyPolicy="RequireDualStack"),
    ])
    assert "is not allowed in config: the addresses are in different pools (v4, v6)" in err(r, "default/a")


# --------------------------------------------------------------------------- serviceAllocation


def test_service_allocation_pins_pools_by_priority_then_name_before_plain_pools():
    r = run([
        pool("aaa-plain", "203.0.113.1/32"),
        pool("low", "203.0.113.10/32", allocation={"priority": 20, "namespaces": ["prod"]}),
        pool("high", "203.0.113.20/32", allocation={"priority": 10, "namespaces": ["prod"]}),
        pool("noprio", "203.0.113.30/32", allocation={"namespaces": ["prod"]}),
        svc("s1", ns="prod"), svc("s2", ns="prod"), svc("s3", ns="prod"), svc("s4", ns="prod"),
        svc("s5", ns="prod"),
    ])
    assert ips(r) == {
        "prod/s1": ["203.0.113.20"],
        "prod/s2": ["203.0.113.10"],
        "prod/s3": ["203.0.113.30"],
        "prod/s4": ["203.0.113.1"],
    }
    assert r.failed == ['Failed to allocate IP for "prod/s5": no available IPs']


def test_service_allocation_restricts_who_may_use_a_pool():
    r = run([
        namespace("team-a", {"team": "a"}),
        pool("by-ns", "203.0.113.10/32", allocation={"namespaces": ["prod"]}),
        pool("by-nssel", "203.0.113.20/32", allocation={"namespaceSelectors": [{"matchLabels": {"team": "a"}}]}),
        pool("by-name", "203.0.113.25/32",
             allocation={"namespaceSelectors": [{"matchLabels": {"kubernetes.io/metadata.name": "staging"}}]}),
        pool("by-svcsel", "203.0.113.30/32", allocation={"serviceSelectors": [{"matchLabels": {"tier": "db"}}]}),
        svc("x", ns="dev"),
        svc("p", ns="prod"),
        svc("t", ns="team-a"),
        svc("s", ns="staging"),
        svc("d", ns="dev", labels={"tier": "db"}),
        svc("asks", ns="dev", ann={POOL: "by-ns"}),
        svc("asks-ip", ns="dev", ann={IPS: "203.0.113.20"}),
    ])
    assert ips(r) == {
        "prod/p": ["203.0.113.10"],
        "team-a/t": ["203.0.113.20"],
        "staging/s": ["203.0.113.25"],
        "dev/d": ["203.0.113.30"],
    }
    assert err(r, "dev/x") == 'Failed to allocate IP for "dev/x": no available IPs'
    assert err(r, "dev/asks") == 'Failed to allocate IP for "dev/asks": pool by-ns not compatible for ip assignment'
    assert err(r, "dev/asks-ip") == (
        'Failed to allocate IP for "dev/asks-ip": pool by-nssel not compatible for ip assignment'
    )


# --------------------------------------------------------------------------- stability


def test_previous_addresses_are_kept_even_when_lower_ones_are_free():
    docs = [pool("p", "203.0.113.10-203.0.113.20"), svc("a"), svc("b")]
    r = run(docs, {"default/a": ["203.0.113.15"], "default/b": ["203.0.113.19"]})
    assert ips(r) == {"default/a": ["203.0.113.15"], "default/b": ["203.0.113.19"]}
    assert not r.changed


def test_status_ingress_counts_as_previous_unless_previous_names_the_service():
    docs = [
        pool("p", "203.0.113.10-203.0.113.20"),
        svc("a", ingress=["203.0.113.14"]),
        svc("b", ingress=["203.0.113.16"]),
    ]
    r = run(docs)
    assert ips(r) == {"default/a": ["203.0.113.14"], "default/b": ["203.0.113.16"]}
    r = run(docs, {"default/a": ["203.0.113.18"], "default/b": []})
    assert ips(r) == {"default/a": ["203.0.113.18"], "default/b": ["203.0.113.10"]}
    assert r.changes == {"added": {"default/b": ["203.0.113.10"]}, "changed": {}, "removed": {}}


def test_holders_come_first_a_new_service_cannot_take_a_held_address():
    docs = [pool("p", "203.0.113.10-203.0.113.20"), svc("a"), svc("b", ann={IPS: "203.0.113.12"})]
    r = run(docs, {"default/a": ["203.0.113.12"]})
    assert ips(r) == {"default/a": ["203.0.113.12"]}
    assert err(r, "default/b") == (
        'Failed to allocate IP for "default/b": can\'t change sharing key for "default/b", address also in use by '
        "default/a"
    )


def test_a_service_moves_only_when_its_own_request_or_pool_makes_it_necessary():
    previous = {"default/gone-pool": ["192.0.2.5"], "default/new-pool": ["203.0.113.11"],
                "default/new-ip": ["203.0.113.12"], "default/stays": ["203.0.113.13"],
                "default/deleted": ["203.0.113.14"]}
    r = run([
        pool("p", "203.0.113.10-203.0.113.15"),
        pool("q", "203.0.113.30/32"),
        svc("gone-pool"), svc("new-pool", ann={POOL: "q"}), svc("new-ip", ann={IPS: "203.0.113.15"}), svc("stays"),
    ], previous)
    assert ips(r) == {
        "default/gone-pool": ["203.0.113.10"],
        "default/new-pool": ["203.0.113.30"],
        "default/new-ip": ["203.0.113.15"],
        "default/stays": ["203.0.113.13"],
    }
    assert r.changes == {
        "added": {},
        "changed": {
            "default/gone-pool": {"before": ["192.0.2.5"], "after": ["203.0.113.10"]},
            "default/new-ip": {"before": ["203.0.113.12"], "after": ["203.0.113.15"]},
            "default/new-pool": {"before": ["203.0.113.11"], "after": ["203.0.113.30"]},
        },
        "removed": {"default/deleted": ["203.0.113.14"]},
    }


def test_holder_whose_pool_no_longer_serves_it_moves():
    r = run([
        pool("a-pinned", "203.0.113.10/32", allocation={"namespaces": ["prod"]}),
        pool("b-plain", "203.0.113.20/32"),
        svc("s", ns="dev"),
    ], {"dev/s": ["203.0.113.10"]})
    assert ips(r) == {"dev/s": ["203.0.113.20"]}


def test_holder_in_an_auto_assign_false_pool_keeps_its_address():
    r = run([pool("manual", "203.0.113.10/31", auto=False), svc("s")], {"default/s": ["203.0.113.11"]})
    assert ips(r) == {"default/s": ["203.0.113.11"]}


def test_conflicting_holders_the_first_key_keeps_the_address():
    r = run([pool("p", "203.0.113.10/30"), svc("a"), svc("b")],
            {"default/a": ["203.0.113.11"], "default/b": ["203.0.113.11"]})
    assert ips(r) == {"default/a": ["203.0.113.11"], "default/b": ["203.0.113.8"]}


def test_dual_stack_holders_complete_or_shrink_to_what_their_policy_wants():
    docs = [
        DUAL,
        svc("prefer", ipFamilyPolicy="PreferDualStack"),
        svc("require", ipFamilyPolicy="RequireDualStack"),
        svc("single", ipFamilies=["IPv4"]),
    ]
    previous = {"default/prefer": ["203.0.113.10"], "default/require": ["2001:db8::11"],
                "default/single": ["203.0.113.11", "2001:db8::10"]}
    r = run(docs, previous)
    # "single" keeps its IPv4 address, so "require" cannot complete in the same pool and fails afresh
    assert r.services["default/single"].ips == ["203.0.113.11"]
    assert r.services["default/prefer"].ips == ["203.0.113.10", "2001:db8::10"]
    assert r.services["default/require"].ips == []
    assert "no available IPs" in err(r, "default/require")


def test_require_dual_stack_holder_completes_from_the_same_pool():
    r = run([DUAL, svc("require", ipFamilyPolicy="RequireDualStack")], {"default/require": ["2001:db8::11"]})
    assert ips(r) == {"default/require": ["203.0.113.10", "2001:db8::11"]}
    assert r.changes["changed"] == {
        "default/require": {"before": ["2001:db8::11"], "after": ["203.0.113.10", "2001:db8::11"]}
    }


def test_same_input_in_any_order_gives_the_same_result():
    docs = [
        pool("b", "203.0.113.20/30"), pool("a", "203.0.113.10/31"),
        svc("z"), svc("y", ann={SHARE: "k"}), svc("x", ann={SHARE: "k"}, ports=[(81, "TCP")]), svc("w"),
    ]
    first = run(docs)
    second = run(list(reversed(docs)))
    assert first.assignments == second.assignments
    assert list(first.services) == list(second.services)


# --------------------------------------------------------------------------- inputs


def test_previous_is_checked_and_canonicalised():
    assert normalize_previous({"a/b": "2001:DB8::1", "c/d": ["203.0.113.1"], "e/f": None}) == {
        "a/b": ["2001:db8::1"], "c/d": ["203.0.113.1"], "e/f": []
    }
    with pytest.raises(ConfigError) as exc:
        normalize_previous({"a/b": ["203.0.113.300"], "c/d": 5})
    assert exc.value.errors == [
        "previous['a/b']: '203.0.113.300' is not an IP address",
        "previous['c/d']: expected a list of addresses, got 5",
    ]


def test_bad_requests_on_hand_built_services_fail_only_that_service():
    # the same requests as documents: test_one_bad_request_among_five_fails_only_that_service
    config = parse_resources([pool("p", "203.0.113.10-203.0.113.20")])
    bad = {
        "both": ({IPS: "203.0.113.11"}, {"loadBalancerIP": "203.0.113.12"},
                 "service can not have both metallb.io/loadBalancerIPs and svc.Spec.LoadBalancerIP"),
        "garbage": ({IPS: "203.0.113.11,nope"}, {}, 'invalid metallb.io/loadBalancerIPs: "203.0.113.11,nope"'),
        "three": ({IPS: "203.0.113.11,203.0.113.12,2001:db8::1"}, {},
                  'more than two addresses ["203.0.113.11" "203.0.113.12" "2001:db8::1"]'),
        "samefam": ({IPS: "203.0.113.11,203.0.113.12"}, {}, '"203.0.113.11" "203.0.113.12" has the same family'),
    }
    services = [
        Service(namespace="default", name=name, labels={}, annotations=ann,
                spec={"type": "LoadBalancer", "ports": [{"port": 80}], **spec}, status={})
        for name, (ann, spec, _reason) in bad.items()
    ]
    services.append(Service(namespace="default", name="fine", labels={}, annotations={},
                            spec={"type": "LoadBalancer", "ports": [{"port": 80}]}, status={}))
    services.append(Service(namespace="default", name="notlb", labels={}, annotations={},
                            spec={"type": "ClusterIP"}, status={}))
    r = allocate(Config(pools=config.pools, services=services), {})
    for name, (_ann, _spec, reason) in bad.items():
        assert err(r, f"default/{name}") == f'Failed to allocate IP for "default/{name}": {reason}'
    assert ips(r) == {"default/fine": ["203.0.113.10"]}
    assert "default/notlb" in r.skipped


def test_deprecated_metallb_universe_tf_annotations_are_honoured():
    r = run([
        pool("p", "203.0.113.10-203.0.113.20"),
        pool("q", "203.0.113.30/32", auto=False),
        svc("a", ann={"metallb.universe.tf/address-pool": "q"}),
        svc("b", ann={"metallb.universe.tf/loadBalancerIPs": "203.0.113.19"}),
    ])
    assert ips(r) == {"default/a": ["203.0.113.30"], "default/b": ["203.0.113.19"]}


# --------------------------------------------------------------------------- issue 8 section 5: one bad service


HC = "nocloud.io/health-check"


@pytest.mark.parametrize(
    ("ann", "spec", "reason"),
    [
        ({IPS: "not-an-ip"}, {}, 'invalid metallb.io/loadBalancerIPs: "not-an-ip"'),
        ({}, {"loadBalancerIP": "not-an-ip"}, 'invalid spec.loadBalancerIP "not-an-ip"'),
        ({IPS: "203.0.113.11,203.0.113.12"}, {}, '"203.0.113.11" "203.0.113.12" has the same family'),
        ({IPS: "2001:db8::1, 2001:db8::2"}, {}, '"2001:db8::1" "2001:db8::2" has the same family'),
        ({IPS: "203.0.113.11,203.0.113.12,2001:db8::1"}, {},
         'more than two addresses ["203.0.113.11" "203.0.113.12" "2001:db8::1"]'),
        ({IPS: "203.0.113.11"}, {"loadBalancerIP": "203.0.113.12"},
         "service can not have both metallb.io/loadBalancerIPs and svc.Spec.LoadBalancerIP"),
    ],
)
def test_one_bad_request_among_five_fails_only_that_service(ann, spec, reason):
    docs = [pool("p", "203.0.113.10-203.0.113.20")]
    docs += [svc(f"ok{i}", ns="demo") for i in range(4)]
    docs.append(svc("bad", ns="demo", ann=ann, **spec))
    r = run(docs)  # parse_resources accepts the manifest: the bad request is the service's own problem
    assert r.failed == [f'Failed to allocate IP for "demo/bad": {reason}']
    assert ips(r) == {f"demo/ok{i}": [f"203.0.113.{10 + i}"] for i in range(4)}


def test_malformed_documents_still_refuse_the_whole_manifest():
    good = [pool("p", "203.0.113.10-203.0.113.20"), svc("a")]
    for bad in (["not", "a", "mapping"], {"apiVersion": "v1", "kind": "Deployment", "metadata": {"name": "x"}}):
        with pytest.raises(ConfigError):
            parse_resources([*good, bad])


def test_not_allowed_in_config_prints_the_requested_list_as_metallb_does():
    r = run([pool("p", "203.0.113.10-203.0.113.20"), svc("hello-d", ns="demo", ann={IPS: "198.51.100.230"})])
    assert r.failed == ['Failed to allocate IP for "demo/hello-d": ["198.51.100.230"] is not allowed in config']
    r = run([DUAL, svc("pair", ann={IPS: "203.0.113.10,2001:db8::99"}, ipFamilyPolicy="RequireDualStack")])
    assert r.failed == [
        'Failed to allocate IP for "default/pair": ["203.0.113.10" "2001:db8::99"] is not allowed in config'
    ]


def test_local_services_sharing_one_address_must_agree_on_the_health_check():
    hc1 = '{"type": "tcp", "port": 8080}'
    hc1_spelled_otherwise = '{"port": 8080, "type": "tcp"}'
    hc2 = '{"type": "tcp", "port": 8081}'
    local = {"externalTrafficPolicy": "Local"}
    docs = [
        pool("p", "203.0.113.10-203.0.113.20"),
        svc("a", ann={SHARE: "k", IPS: "203.0.113.12", HC: hc1}, ports=[(80, "TCP")], **local),
        svc("b", ann={SHARE: "k", IPS: "203.0.113.12", HC: hc1_spelled_otherwise}, ports=[(81, "TCP")], **local),
        svc("c", ann={SHARE: "k", IPS: "203.0.113.12", HC: hc2}, ports=[(82, "TCP")], **local),
        svc("d", ann={SHARE: "k", IPS: "203.0.113.12"}, ports=[(83, "TCP")], **local),
    ]
    r = run(docs)
    assert ips(r) == {"default/a": ["203.0.113.12"], "default/b": ["203.0.113.12"]}
    for key in ("default/c", "default/d"):
        assert err(r, key) == (
            f'Failed to allocate IP for "{key}": can\'t change sharing key for "{key}", address also in use by '
            "default/a,default/b"
        )
    # the same through pools: a Local service asking for the shared key's pool address by sharing key alone
    # and a different health check does not join the shared address (MetalLB: another free address)
    r = run([
        pool("p", "203.0.113.10-203.0.113.20"),
        svc("a", ann={SHARE: "k", HC: hc1}, ports=[(80, "TCP")], **local),
        svc("b", ann={SHARE: "k", HC: hc2}, ports=[(81, "TCP")], **local),
    ])
    assert ips(r) == {"default/a": ["203.0.113.10"], "default/b": ["203.0.113.11"]}


def test_prefer_dual_stack_with_one_declared_family_gets_that_family_only():
    r = run([
        DUAL,
        svc("v4", ipFamilyPolicy="PreferDualStack", ipFamilies=["IPv4"]),
        svc("v6", ipFamilyPolicy="PreferDualStack", ipFamilies=["IPv6"]),
        svc("both", ipFamilyPolicy="PreferDualStack", ipFamilies=["IPv4", "IPv6"]),
    ])
    assert ips(r) == {
        "default/both": ["203.0.113.10", "2001:db8::10"],
        "default/v4": ["203.0.113.11"],
        "default/v6": ["2001:db8::11"],
    }
    # a holder of both families shrinks to the declared one
    r = run([DUAL, svc("v4", ipFamilyPolicy="PreferDualStack", ipFamilies=["IPv4"])],
            {"default/v4": ["203.0.113.10", "2001:db8::10"]})
    assert ips(r) == {"default/v4": ["203.0.113.10"]}
