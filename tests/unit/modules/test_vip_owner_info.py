"""vip_owner_info against real ARP/NDP answers on a bridge in network namespaces."""

from __future__ import annotations

from .conftest import run_module

OWNER = "02:00:00:5e:00:21"
TWIN = "02:00:00:5e:00:22"
CLIENT = "02:00:00:5e:00:20"
NODES = {"n1": OWNER, "n2": TWIN}


def test_one_owner_v4_and_v6_named_by_node(segment):
    client = segment.attach("c", ["198.51.100.50/24", "2001:db8:1::50/64"], mac=CLIENT).ns
    segment.attach("n1", ["198.51.100.11/24", "198.51.100.200/24", "2001:db8:1::200/64"], mac=OWNER)
    res = run_module("vip_owner_info", {"address": ["198.51.100.200", "2001:db8:1::200"], "nodes": NODES,
                                        "fail_on_none": True, "fail_on_multiple": True, "timeout": 0.5}, client)
    assert not res.get("failed"), res
    assert res["changed"] is False
    assert res["owners"] == {"198.51.100.200": "n1", "2001:db8:1::200": "n1"}
    for r in res["results"]:
        assert r["interface"] == "eth0"
        assert [a["mac"] for a in r["answers"]] == [OWNER]
        assert 0 < r["answers"][0]["latency_ms"] < 500
    assert [r["family"] for r in res["results"]] == [4, 6]


def test_two_owners_fail_on_multiple_names_both(segment):
    client = segment.attach("c", ["198.51.100.50/24"], mac=CLIENT).ns
    segment.attach("n1", ["198.51.100.200/24"], mac=OWNER)
    segment.attach("n2", ["198.51.100.200/24"], mac=TWIN)
    res = run_module("vip_owner_info", {"address": "198.51.100.200", "nodes": NODES, "timeout": 0.5}, client)
    assert not res.get("failed"), res
    assert sorted(a["node"] for a in res["answers"]) == ["n1", "n2"]
    assert res["owners"] == {"198.51.100.200": None}
    res = run_module("vip_owner_info", {"address": "198.51.100.200", "nodes": NODES, "timeout": 0.5,
                                        "fail_on_multiple": True}, client)
    assert res["failed"]
    assert "198.51.100.200: 2 MACs answer" in res["msg"] and "(n1)" in res["msg"] and "(n2)" in res["msg"]


def test_free_address_and_expected_node(segment):
    client = segment.attach("c", ["198.51.100.50/24", "2001:db8:1::50/64"], mac=CLIENT).ns
    segment.attach("n1", ["198.51.100.200/24"], mac=OWNER)
    free = run_module("vip_owner_info", {"address": ["198.51.100.201", "2001:db8:1::201"], "timeout": 0.3,
                                         "fail_on_answer": True}, client)
    assert not free.get("failed"), free
    assert all(r["free"] for r in free["results"])
    none = run_module("vip_owner_info", {"address": "198.51.100.201", "timeout": 0.3, "fail_on_none": True}, client)
    assert none["failed"] and "198.51.100.201: no answer on eth0" in none["msg"]
    taken = run_module("vip_owner_info", {"address": "198.51.100.200", "timeout": 0.3, "fail_on_answer": True},
                       client)
    assert taken["failed"] and "not free, answered by 02:00:00:5e:00:21" in taken["msg"]
    wrong = run_module("vip_owner_info", {"address": "198.51.100.200", "timeout": 0.3, "nodes": NODES,
                                          "expected_node": "n2"}, client)
    assert wrong["failed"] and "expected n2 as the only owner, answered by 02:00:00:5e:00:21 (n1)" in wrong["msg"]
    right = run_module("vip_owner_info", {"address": "198.51.100.200", "timeout": 0.3, "nodes": NODES,
                                          "expected_node": "n1"}, client, check_mode=True)
    assert not right.get("failed"), right


def test_bad_input_is_named(segment):
    client = segment.attach("c", ["198.51.100.50/24"], mac=CLIENT).ns
    res = run_module("vip_owner_info", {"address": "198.51.100.300"}, client)
    assert res["failed"] and "'198.51.100.300' is not an IPv4 or IPv6 address" in res["msg"]
    res = run_module("vip_owner_info", {"address": "198.51.100.200", "nodes": {"n1": "zz"}}, client)
    assert res["failed"] and "nodes['n1']: 'zz' is not a MAC address" in res["msg"]
    res = run_module("vip_owner_info", {"address": "198.51.100.50"}, client)
    assert res["failed"] and "is local to this host" in res["msg"]
