# -*- coding: utf-8 -*-
"""Properties of the allocator, checked on random small configurations (hypothesis).

Never leaves the pools, never gives one address twice outside the sharing
rules, honours requests, is stable and deterministic. Bounded: each property
runs a fixed number of examples without a deadline, the whole file in well
under a minute on one core.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nocloudlb.core.allocation import allocate
from nocloudlb.core.schema import parse_resources

# NOCLOUD_HYPOTHESIS_EXAMPLES=5000 NOCLOUD_HYPOTHESIS_RANDOM=1 runs a longer, randomised hunt.
SETTINGS = settings(
    max_examples=int(os.environ.get("NOCLOUD_HYPOTHESIS_EXAMPLES", "200")),
    deadline=None,
    derandomize=not os.environ.get("NOCLOUD_HYPOTHESIS_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)

NAMESPACES = ("alpha", "beta")
PORTS = ((80, "TCP"), (443, "TCP"), (53, "UDP"), (53, "TCP"))


@st.composite
def pools(draw):
    """1-3 disjoint small pools, IPv4 (inside 203.0.113.0/24) and optionally IPv6 (2001:db8:N::/125)."""
    count = draw(st.integers(1, 3))
    docs = []
    for index in range(count):
        addresses = []
        base = 64 * index
        if draw(st.booleans()) or index == 0:
            first = base + draw(st.integers(0, 8))
            last = first + draw(st.integers(0, 6))
            addresses.append(f"203.0.113.{first}-203.0.113.{last}")
        if draw(st.booleans()):
            addresses.append(f"2001:db8:{index}::/{draw(st.sampled_from([126, 125]))}")
        if not addresses:
            addresses.append(f"203.0.113.{base + 1}/32")
        spec = {"addresses": addresses}
        if draw(st.integers(0, 3)) == 0:
            spec["autoAssign"] = False
        if draw(st.booleans()):
            spec["avoidBuggyIPs"] = True
        if draw(st.integers(0, 3)) == 0:
            allocation = {"priority": draw(st.integers(1, 3))}
            if draw(st.booleans()):
                allocation["namespaces"] = [draw(st.sampled_from(NAMESPACES))]
            else:
                allocation["serviceSelectors"] = [{"matchLabels": {"tier": "db"}}]
            spec["serviceAllocation"] = allocation
        docs.append({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                     "metadata": {"name": f"pool{index}"}, "spec": spec})
    return docs


def pool_addresses(pool_docs):
    out = []
    for doc in pool_docs:
        for text in doc["spec"]["addresses"]:
            if "-" in text:
                a, b = (ipaddress.ip_address(x) for x in text.split("-"))
                out += [str(ipaddress.ip_address(v)) for v in range(int(a), int(b) + 1)]
            else:
                out += [str(ip) for ip in ipaddress.ip_network(text)]
    return out


@st.composite
def services(draw, pool_docs, prefix="s", min_size=0, max_size=12):
    count = draw(st.integers(min_size, max_size))
    known = pool_addresses(pool_docs) + ["192.0.2.7"]
    names = [d["metadata"]["name"] for d in pool_docs] + ["nopool"]
    docs = []
    for index in range(count):
        annotations = {}
        spec: dict = {"type": "LoadBalancer"}
        ports = draw(st.lists(st.sampled_from(PORTS), min_size=0, max_size=2, unique=True))
        spec["ports"] = [{"port": p, "protocol": proto} for p, proto in ports]
        if draw(st.booleans()):
            annotations["metallb.io/allow-shared-ip"] = draw(st.sampled_from(["k1", "k2"]))
        if draw(st.integers(0, 3)) == 0:
            spec["externalTrafficPolicy"] = "Local"
            if draw(st.booleans()):
                check = {"type": "tcp", "port": draw(st.sampled_from([1, 2]))}
                annotations["nocloud.io/health-check"] = json.dumps(check)
        policy = draw(st.sampled_from(["SingleStack", "SingleStack", "PreferDualStack", "RequireDualStack", None]))
        if policy:
            spec["ipFamilyPolicy"] = policy
        if policy in (None, "SingleStack") and draw(st.booleans()):
            spec["ipFamilies"] = [draw(st.sampled_from(["IPv4", "IPv6"]))]
        elif policy in ("PreferDualStack", "RequireDualStack") and draw(st.booleans()):
            spec["ipFamilies"] = draw(st.permutations(["IPv4", "IPv6"]))
        elif policy == "PreferDualStack" and draw(st.booleans()):
            spec["ipFamilies"] = [draw(st.sampled_from(["IPv4", "IPv6"]))]
        choice = draw(st.integers(0, 9))
        if choice == 0:
            annotations["metallb.io/loadBalancerIPs"] = draw(st.sampled_from(known))
        elif choice == 1:
            annotations["metallb.io/address-pool"] = draw(st.sampled_from(names))
        elif choice == 2:
            spec["loadBalancerClass"] = "example.com/other"
        meta = {"name": f"{prefix}{index}", "namespace": draw(st.sampled_from(NAMESPACES)), "annotations": annotations}
        if draw(st.booleans()):
            meta["labels"] = {"tier": "db"}
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec})
    return docs


@st.composite
def scenario(draw, **kw):
    pool_docs = draw(pools())
    return pool_docs, draw(services(pool_docs, **kw))


def _backend(svc):
    if svc.traffic_policy != "Local":
        return ""
    return json.dumps(svc.health_check, sort_keys=True)


def check_invariants(config, result, previous=None):
    by_key = {s.key: s for s in config.services}
    users: dict[str, list[str]] = {}
    for key, assignment in result.services.items():
        svc = by_key[key]
        if not assignment.ips:
            assert assignment.error and assignment.error.startswith(f'Failed to allocate IP for "{key}": ')
            continue
        assert assignment.error is None
        pool = config.pools[assignment.pool]
        parsed = [ipaddress.ip_address(ip) for ip in assignment.ips]
        # never leaves the pools; never hands out addresses the pool's avoidBuggyIPs forbids
        for ip in parsed:
            assert pool.usable(ip), (key, ip, pool.name)
            assert config.pool_for_ip(ip) is pool
        # family rules
        assert len({ip.version for ip in parsed}) == len(parsed) <= 2
        policy = svc.ip_family_policy
        if policy == "SingleStack":
            assert len(parsed) == 1
            if svc.ip_families:
                assert parsed[0].version == svc.ip_versions[0]
        elif policy == "RequireDualStack":
            assert len(parsed) == 2
        elif policy == "PreferDualStack" and len(svc.ip_families) == 1:
            assert [ip.version for ip in parsed] == svc.ip_versions  # MetalLB: one declared family, that one only
        if len(parsed) == 2 and svc.ip_families:
            assert [ip.version for ip in parsed] == svc.ip_versions
        # requests are honoured
        if svc.requested_ips:
            assert sorted(assignment.ips) == sorted(str(ipaddress.ip_address(i)) for i in svc.requested_ips)
        if svc.requested_pool:
            assert assignment.pool == svc.requested_pool
        if not svc.requested_ips and not svc.requested_pool:
            # an autoAssign=false pool serves only requests, and holders that already had the address
            assert pool.auto_assign or set(assignment.ips) & set((previous or {}).get(key, [])), key
        if pool.allocation is not None:
            ns_labels = {"kubernetes.io/metadata.name": svc.namespace}
            assert pool.allocation.matches(svc.namespace, ns_labels, svc.labels)
        for ip in assignment.ips:
            users.setdefault(ip, []).append(key)
    # never one address twice outside the sharing rules
    for ip, keys in users.items():
        if len(keys) == 1:
            continue
        svcs = [by_key[k] for k in keys]
        assert all(s.sharing_key for s in svcs), (ip, keys)
        assert len({s.sharing_key for s in svcs}) == 1, (ip, keys)
        assert len({_backend(s) for s in svcs}) == 1, (ip, keys)
        seen: set = set()
        for s in svcs:
            ports = set(s.ports)
            assert not ports & seen, (ip, keys)
            seen |= ports
    # class: other classes are left alone
    for key in result.skipped:
        assert by_key[key].load_balancer_class == "example.com/other"


@SETTINGS
@given(scenario())
def test_invariants_hold_and_a_rerun_with_the_result_changes_nothing(case):
    pool_docs, svc_docs = case
    config = parse_resources(pool_docs + svc_docs)
    first = allocate(config, {})
    check_invariants(config, first)
    again = allocate(config, first.assignments)
    assert again.assignments == first.assignments
    assert again.failed == first.failed
    assert not again.changed


@SETTINGS
@given(scenario(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_document_order(case, rnd: random.Random):
    pool_docs, svc_docs = case
    docs = pool_docs + svc_docs
    base = allocate(parse_resources(docs), {})
    shuffled = list(docs)
    rnd.shuffle(shuffled)
    other = allocate(parse_resources(shuffled), {})
    assert other.assignments == base.assignments
    assert other.failed == base.failed
    assert {k: a.pool for k, a in other.services.items()} == {k: a.pool for k, a in base.services.items()}


@SETTINGS
@given(st.data())
def test_adding_services_moves_nobody(data):
    pool_docs, svc_docs = data.draw(scenario())
    extra = data.draw(services(pool_docs, prefix="new", min_size=1, max_size=6))
    first = allocate(parse_resources(pool_docs + svc_docs), {})
    config = parse_resources(pool_docs + svc_docs + extra)
    second = allocate(config, first.assignments)
    check_invariants(config, second)
    for key, ips in first.assignments.items():
        assert second.assignments.get(key) == ips, key


@SETTINGS
@given(st.data())
def test_removing_a_service_moves_nobody_else(data):
    pool_docs, svc_docs = data.draw(scenario(min_size=1))
    victim = data.draw(st.integers(0, len(svc_docs) - 1))
    first = allocate(parse_resources(pool_docs + svc_docs), {})
    rest = svc_docs[:victim] + svc_docs[victim + 1:]
    gone = f"{svc_docs[victim]['metadata']['namespace']}/{svc_docs[victim]['metadata']['name']}"
    second = allocate(parse_resources(pool_docs + rest), first.assignments)
    for key, ips in first.assignments.items():
        if key == gone:
            assert key not in second.assignments
            assert second.changes["removed"] == {key: ips}
            continue
        # a PreferDualStack service may gain the family it lacked; it never loses or changes an address
        assert set(ips) <= set(second.assignments[key]), key


@SETTINGS
@given(st.data())
def test_any_previous_even_conflicting_or_stale_keeps_the_invariants(data):
    pool_docs, svc_docs = data.draw(scenario(min_size=1))
    candidates = pool_addresses(pool_docs) + ["192.0.2.9", "2001:db8:ffff::1"]
    keys = [f"{d['metadata']['namespace']}/{d['metadata']['name']}" for d in svc_docs] + ["gone/old"]
    previous = data.draw(st.dictionaries(st.sampled_from(keys), st.lists(st.sampled_from(candidates), max_size=2)))
    config = parse_resources(pool_docs + svc_docs)
    result = allocate(config, previous)
    check_invariants(config, result, previous)
    again = allocate(config, result.assignments)
    assert again.assignments == result.assignments
    assert not again.changed
