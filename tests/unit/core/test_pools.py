# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pools: range parsing with MetalLB's messages, sizes, buggy IPs, overlaps, selectors."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nocloudlb.core.pools import (
    AddressRange,
    Pool,
    ServiceAllocation,
    find_overlaps,
    ip_is_buggy,
    pool_counts,
    selector_matches,
    selector_problems,
)


@pytest.mark.parametrize(
    "text, start, end, version, size",
    [
        ("198.51.100.0/24", "198.51.100.0", "198.51.100.255", 4, 256),
        ("198.51.100.7/24", "198.51.100.0", "198.51.100.255", 4, 256),  # host bits, as Go's ParseCIDR
        ("198.51.100.9/32", "198.51.100.9", "198.51.100.9", 4, 1),
        ("198.51.100.10-198.51.100.20", "198.51.100.10", "198.51.100.20", 4, 11),
        ("198.51.100.10 - 198.51.100.10", "198.51.100.10", "198.51.100.10", 4, 1),
        ("2001:db8::/120", "2001:db8::", "2001:db8::ff", 6, 256),
        ("2001:db8::1-2001:db8::1:0", "2001:db8::1", "2001:db8::1:0", 6, 65536),
    ],
)
def test_range_parse(text, start, end, version, size):
    rng = AddressRange.parse(text)
    assert (str(rng.start), str(rng.end), rng.version, rng.size, rng.text) == (start, end, version, size, text)
    assert start in rng and end in rng
    assert ipaddress.ip_address(start) in rng
    assert str(ipaddress.ip_address(int(rng.end.__int__()) + 1 if version == 4 else int(rng.end) + 1)) not in rng


@pytest.mark.parametrize(
    "text, message",
    [
        ("198.51.100.0/33", 'invalid CIDR "198.51.100.0/33"'),
        ("198.51.100.0", 'invalid CIDR "198.51.100.0"'),  # Go's ParseCIDR wants a prefix length
        ("not-an-ip", 'invalid IP range "not-an-ip": invalid start IP "not"'),
        ("198.51.100.1-nope", 'invalid IP range "198.51.100.1-nope": invalid end IP "nope"'),
        (
            "198.51.100.20-198.51.100.10",
            'invalid IP range "198.51.100.20-198.51.100.10": start IP "198.51.100.20" is after the end IP '
            '"198.51.100.10"',
        ),
        (
            "198.51.100.1-2001:db8::1",
            'invalid IP range "198.51.100.1-2001:db8::1": start IP "198.51.100.1" and end IP "2001:db8::1" are not '
            "of the same IP family",
        ),
        ("fe80::1%eth0/64", 'invalid CIDR "fe80::1%eth0/64"'),
        ("010.0.0.1/32", 'invalid CIDR "010.0.0.1/32"'),
    ],
)
def test_range_parse_errors(text, message):
    with pytest.raises(ValueError) as info:
        AddressRange.parse(text)
    assert str(info.value) == message


def test_buggy_ips_and_sizes():
    p = Pool("p", [AddressRange.parse("192.0.2.0/23"), AddressRange.parse("2001:db8::/126")], avoid_buggy_ips=True)
    assert p.size(4) == 512 - 4  # .0 and .255 of both /24s
    assert p.size(6) == 4  # IPv6 is never "buggy"
    v4 = list(p.iter_addresses(4))
    assert len(v4) == p.size(4)
    assert str(v4[0]) == "192.0.2.1" and str(v4[-1]) == "192.0.3.254"
    assert not any(ip_is_buggy(ip) for ip in v4)
    assert p.contains("192.0.2.255") and not p.usable("192.0.2.255") and p.usable("192.0.2.254")
    assert p.families() == {4, 6}
    assert [str(ip) for ip in p.iter_addresses(6)] == ["2001:db8::", "2001:db8::1", "2001:db8::2", "2001:db8::3"]
    plain = Pool("q", [AddressRange.parse("192.0.2.250-192.0.3.5")])
    assert plain.size(4) == 12 and plain.size(6) == 0
    assert Pool("r", plain.ranges, avoid_buggy_ips=True).size(4) == 10


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2000))
def test_buggy_count_matches_enumeration(start, length):
    end = min(start + length, 2**32 - 1)
    rng = AddressRange(ipaddress.IPv4Address(start), ipaddress.IPv4Address(end), "x")
    expected = sum(1 for v in range(start, end + 1) if v % 256 in (0, 255))
    assert rng.buggy_count() == expected
    p = Pool("p", [rng], avoid_buggy_ips=True)
    assert p.size(4) == len(list(p.iter_addresses(4)))


def test_iter_addresses_sorted_across_ranges():
    p = Pool("p", [AddressRange.parse("198.51.100.20-198.51.100.21"), AddressRange.parse("198.51.100.1/32")])
    assert [str(ip) for ip in p.iter_addresses(4)] == ["198.51.100.1", "198.51.100.20", "198.51.100.21"]


def test_overlaps_use_metallb_wording_and_name_both_sides():
    a = Pool("a", [AddressRange.parse("198.51.100.0/24")])
    b = Pool("b", [AddressRange.parse("203.0.113.0/24"), AddressRange.parse("198.51.100.128-198.51.100.130")])
    c = Pool("c", [AddressRange.parse("2001:db8::/64"), AddressRange.parse("2001:db8::/96")])
    assert find_overlaps([a, b, c]) == [
        'IPAddressPool "b": spec.addresses[1]: CIDR "198.51.100.128/31" in pool "b" overlaps with already defined '
        'CIDR "198.51.100.0/24" (from "198.51.100.0/24" in pool "a")',
        'IPAddressPool "c": spec.addresses[1]: CIDR "2001:db8::/96" in pool "c" overlaps with already defined '
        'CIDR "2001:db8::/64" (from "2001:db8::/64" in pool "c")',
    ]
    # Adjacent ranges and different families never overlap.
    d = Pool("d", [AddressRange.parse("198.51.100.0-198.51.100.9"), AddressRange.parse("198.51.100.10/31")])
    assert find_overlaps([d, c.__class__("e", [AddressRange.parse("::ffff:0:0/96")])]) == []


@pytest.mark.parametrize(
    "selector, labels, expected",
    [
        (None, {"a": "1"}, True),
        ({}, {}, True),
        ({"matchLabels": {"zone": "a"}}, {"zone": "a", "x": "y"}, True),
        ({"matchLabels": {"zone": "a"}}, {"zone": "b"}, False),
        ({"matchLabels": {"zone": "a"}}, {}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}, {"zone": "b"}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, {"zone": "a"}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, {"zone": ""}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, {}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, {"zone": "a"}, False),
        (
            {"matchLabels": {"rack": "1"}, "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"rack": "1", "zone": "b"},
            False,
        ),
    ],
)
def test_selector_matches(selector, labels, expected):
    assert selector_matches(selector, labels) is expected


@pytest.mark.parametrize(
    "selector, problems",
    [
        ({"matchLabels": {"a": "b"}}, []),
        ("zone=a", ["must be a label selector (matchLabels/matchExpressions), got 'zone=a'"]),
        ({"matchLabel": {}}, ['unknown field "matchLabel"']),
        ({"matchLabels": ["a"]}, ["matchLabels: must be a mapping of strings, got ['a']"]),
        ({"matchExpressions": [{"key": "z", "operator": "Equals", "values": ["a"]}]},
         ['matchExpressions[0].operator: "Equals" is not a valid label selector operator']),
        ({"matchExpressions": [{"key": "z", "operator": "In"}]},
         ["matchExpressions[0].values: for 'in', 'notin' operators, values set can't be empty"]),
        ({"matchExpressions": [{"key": "z", "operator": "Exists", "values": ["a"]}]},
         ["matchExpressions[0].values: values set must be empty for exists and does not exist"]),
        ({"matchExpressions": [{"key": "z", "operator": "In", "values": ["a", "a"]}]},
         ['matchExpressions[0].values: duplicate definition of match expression value in label selector "a"']),
        ({"matchExpressions": [{"key": "z", "operator": "In", "values": ["a", "b"]},
                               {"key": "z", "operator": "In", "values": ["b", "a"]}]},
         ["matchExpressions[1]: duplicate definition of match expressions \"z In ['a', 'b']\""]),
        ({"matchExpressions": [{"key": "", "operator": "Exists", "value": 1}]},
         ['matchExpressions[0]: unknown field "value"', "matchExpressions[0].key: invalid label key ''"]),
    ],
)
def test_selector_problems(selector, problems):
    assert selector_problems(selector) == problems


def test_service_allocation_matches():
    # Namespaces listed or selected; service selectors all optional.
    alloc = ServiceAllocation(priority=10, namespaces=["prod"], namespace_selectors=[{"matchLabels": {"team": "a"}}],
                              service_selectors=[{"matchLabels": {"db": "yes"}}])
    assert alloc.matches("prod", {}, {"db": "yes"})
    assert alloc.matches("other", {"team": "a"}, {"db": "yes"})
    assert not alloc.matches("other", {"team": "b"}, {"db": "yes"})
    assert not alloc.matches("prod", {}, {})
    assert ServiceAllocation().matches("any", None, None)
    assert ServiceAllocation(service_selectors=[{"matchLabels": {"a": "b"}}]).matches("x", {}, {"a": "b"})


def test_pool_counts_counts_shared_addresses_once():
    p = Pool("p", [AddressRange.parse("192.0.2.0/30"), AddressRange.parse("2001:db8::/127")], avoid_buggy_ips=True)
    counts = pool_counts(p, ["192.0.2.1", "192.0.2.1", "192.0.2.0", "203.0.113.1", "garbage", "2001:db8::1"])
    # 192.0.2.0 is buggy: assigned (explicitly requested) but not taken from the usable ones.
    assert counts == {4: {"total": 3, "assigned": 2, "available": 2}, 6: {"total": 2, "assigned": 1, "available": 1}}


_v4 = st.integers(0, 2**12 - 1).map(lambda n: ipaddress.IPv4Address(0xC6336400 + n))  # 198.51.100.0 + n


@st.composite
def _ranges(draw):
    """A random IPv4 range or CIDR around 198.51.100.0/20, spelled as an operator would."""
    if draw(st.booleans()):
        length = draw(st.integers(20, 32))
        net = ipaddress.ip_network(f"{draw(_v4)}/{length}", strict=False)
        return AddressRange.parse(str(net))
    a, b = sorted([draw(_v4), draw(_v4)])
    return AddressRange.parse(f"{a}-{b}")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_ranges(), min_size=1, max_size=3), min_size=1, max_size=4))
def test_find_overlaps_agrees_with_brute_force(pool_ranges):
    pools = [Pool(f"p{i}", ranges) for i, ranges in enumerate(pool_ranges)]
    flat = [r for p in pools for r in p.ranges]
    expected = 0
    for i, rng in enumerate(flat):
        own = set(range(int(rng.start), int(rng.end) + 1))
        if any(own & set(range(int(o.start), int(o.end) + 1)) for o in flat[:i]):
            expected += 1
    assert len(find_overlaps(pools)) == expected


@settings(max_examples=150, deadline=None)
@given(_ranges())
def test_range_networks_cover_exactly_the_range(rng):
    nets = rng.networks()
    assert sum(n.num_addresses for n in nets) == rng.size
    assert nets[0].network_address == rng.start and nets[-1].broadcast_address == rng.end


def test_more_selector_problems_and_texts():
    from nocloudlb.core.pools import selector_text

    assert selector_problems({"matchLabels": {"": "a", "b": ["x"]}}) == [
        "matchLabels: invalid label key ''", "matchLabels[b]: invalid label value ['x']"]
    assert selector_problems({"matchExpressions": {"key": "a"}}) == [
        "matchExpressions: must be a list, got {'key': 'a'}"]
    assert selector_problems(None) == []
    assert selector_text(None) == "<everything>"
    assert selector_text({"matchLabels": {"b": "2", "a": "1"}, "matchExpressions": [
        {"key": "x", "operator": "DoesNotExist"}, {"key": "y", "operator": "Exists"},
        {"key": "z", "operator": "NotIn", "values": ["2", "1"]}]}) == "!x,a=1,b=2,y,z notin (1,2)"
    assert not selector_matches({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, {"a": "1"})


def test_junk_addresses_are_never_in_a_pool():
    from nocloudlb.core.pools import parse_ip

    p = Pool("p", [AddressRange.parse("198.51.100.0/30")])
    for junk in ("", " 198.51.100.1", "198.51.100.1 ", "fe80::1%eth0", "nope", None, 42):
        assert not p.contains(junk) and not p.usable(junk)
        with pytest.raises(ValueError):
            parse_ip(junk)
    assert 42 not in p.ranges[0] and "nope" not in p.ranges[0]
    assert p.contains(ipaddress.ip_address("198.51.100.3")) and not p.contains("2001:db8::1")
