# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router-JSON parsers (plugins/module_utils/routes.py) on output captured from the bgp scenario's r1.

tests/unit/fixtures/r1_*.json were read from the lab router r1 (FRR 8.4.4, iproute2 6.1, Debian 12) with
three nodes announcing 203.0.113.10 and 203.0.113.11: ``ip -j route show proto bgp`` (iproute2 leaves
``protocol`` out when it filters on it), ``ip -j route show``, ``vtysh -c 'show ip route bgp json'`` and
``vtysh -c 'show bgp ipv4 unicast 203.0.113.10/32 json'``.
"""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES
from nocloudlb.core.routes import (
    bgp_paths,
    canonical_prefix,
    kernel_next_hops,
    kernel_routes,
    through,
    zebra_routes,
)

NODES = ["198.51.100.11", "198.51.100.12", "198.51.100.13"]


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_kernel_table_of_the_router():
    text = fixture("r1_ip_route_bgp.json")
    routes = kernel_routes(text)
    assert routes["203.0.113.10/32"] == NODES and routes["203.0.113.11/32"] == NODES
    assert all(p.endswith("/32") for p in routes)
    assert kernel_next_hops(text, "203.0.113.10") == set(NODES)
    assert kernel_next_hops(text, "203.0.113.99/32") == set()
    assert through(routes, "198.51.100.11") == sorted(p for p, hops in routes.items() if "198.51.100.11" in hops)


def test_kernel_table_other_protocols_filtered():
    text = fixture("r1_ip_route_all.json")
    assert kernel_routes(text, protocol="bgp") == kernel_routes(fixture("r1_ip_route_bgp.json"))
    assert kernel_routes(text)["192.0.2.0/24"] == []  # connected: no gateway


def test_zebra_and_kernel_agree():
    kernel = kernel_routes(fixture("r1_ip_route_bgp.json"))
    zebra = zebra_routes(fixture("r1_show_ip_route_bgp.json"))
    assert zebra == kernel


def test_bgp_paths_of_one_prefix():
    paths = bgp_paths(fixture("r1_show_bgp_prefix.json"))
    assert sorted(p["next_hop"] for p in paths) == NODES
    assert sum(p["best"] for p in paths) == 1 and all(p["valid"] for p in paths)
    assert all(p["best"] or p["multipath"] for p in paths)
    assert {p["communities"] for p in paths} == {"64512:100"}


def test_single_path_and_empty_output():
    one = json.dumps([{"dst": "203.0.113.10", "gateway": "198.51.100.12", "dev": "eth0", "protocol": "bgp",
                       "metric": 20, "flags": []}])
    assert kernel_routes(one) == {"203.0.113.10/32": ["198.51.100.12"]}
    assert kernel_routes("") == {} and zebra_routes("") == {} and bgp_paths("{}") == []
    assert through({"2001:db8::10/128": ["2001:db8:1::11"], "203.0.113.10/32": ["198.51.100.11"]},
                   "2001:db8:1::11") == ["2001:db8::10/128"]


@pytest.mark.parametrize("text, want", [("203.0.113.10", "203.0.113.10/32"), ("2001:db8::10", "2001:db8::10/128"),
                                        ("203.0.113.66/30", "203.0.113.64/30")])
def test_canonical_prefix(text, want):
    assert canonical_prefix(text) == want
