# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Backends kind, its checks, Maglev and the data plane's plan."""

from __future__ import annotations

import collections
import random

import pytest
from conftest import errors_of, pool, service
from nocloudlb.core.backends import (
    MAGLEV_SIZES,
    PlanMemo,
    Server,
    check_gateway,
    check_topology,
    dataplane_plan,
    maglev_size,
    maglev_table,
    maglev_with_health,
    slot_ranges,
    smooth_wrr,
)
from nocloudlb.core.schema import parse_resources

VIP = "198.51.100.200"


def backends(name: str = "web", namespace: str = "prod", **spec) -> dict:
    body = {"method": "nat", "scheduler": "rr",
            "servers": [{"address": "198.51.100.31", "port": 8080}, {"address": "198.51.100.32", "port": 8080}]}
    body.update(spec)
    return {"apiVersion": "nocloud.io/v1alpha1", "kind": "Backends", "metadata": {"name": name, "namespace": namespace},
            "spec": body}


def docs(*extra, svc: dict | None = None) -> list[dict]:
    return [pool("p", "198.51.100.200-198.51.100.220"),
            svc or service(status_ips=[VIP], ports=[{"port": 80, "protocol": "TCP"}]), *extra]


def one_error(*extra, svc: dict | None = None) -> str:
    errs = errors_of(docs(*extra, svc=svc))
    assert len(errs) == 1, errs
    return errs[0]


# --------------------------------------------------------------------------- parsing


def test_backends_load():
    cfg = parse_resources(docs(backends(method="fullnat", scheduler="maglev", snatAddress="198.51.100.9",
                                        healthCheck='{"type": "http", "path": "/healthz", "rise": 1, "fall": 2}',
                                        servers=[{"address": "198.51.100.31", "weight": 3},
                                                 {"address": "198.51.100.32", "port": 81}])))
    b = cfg.backends["prod/web"]
    assert (b.method, b.scheduler, b.snat_address) == ("fullnat", "maglev", "198.51.100.9")
    assert b.servers == [Server("198.51.100.31", None, 3), Server("198.51.100.32", 81, 1)]
    assert b.health_check["type"] == "http" and b.health_check["host"] is None and b.health_check["port"] is None
    assert (b.health_check["rise"], b.health_check["fall"], b.health_check["path"]) == (1, 2, "/healthz")


def test_health_check_url_form_keeps_its_port():
    cfg = parse_resources(docs(backends(method="nat", healthCheck="tcp://:9000")))
    assert cfg.backends["prod/web"].health_check["port"] == 9000


@pytest.mark.parametrize(("spec", "field", "why"), [
    ({"method": "ipip"}, "spec.method", 'Unsupported value: "ipip"'),
    ({"scheduler": "lc"}, "spec.scheduler", 'Unsupported value: "lc"'),
    ({"method": "dr", "scheduler": "rr", "servers": [{"address": "198.51.100.31"}]}, "spec.scheduler",
     "only a per-flow hash keeps a connection on one server"),
    ({"servers": []}, "spec.servers", "must be a non-empty list"),
    ({"servers": [{"address": "198.51.100.31", "weight": 0}]}, "spec.servers[0].weight", "invalid weight 0"),
    ({"servers": [{"address": "198.51.100.31", "weight": 257}]}, "spec.servers[0].weight", "1-256 range"),
    ({"servers": [{"address": "198.51.100.31", "weight": True}]}, "spec.servers[0].weight", "invalid weight True"),
    ({"servers": [{"address": "198.51.100.300"}]}, "spec.servers[0].address", 'invalid IP address "198.51.100.300"'),
    ({"servers": [{"address": "198.51.100.31", "port": 0}]}, "spec.servers[0].port", "invalid port 0"),
    ({"servers": [{"address": "198.51.100.31", "prot": 1}]}, "spec.servers[0].prot", 'unknown field "prot"'),
    ({"servers": [{"address": "198.51.100.31"}, {"address": "198.51.100.31"}]}, "spec.servers[1]",
     "duplicate server"),
    ({"method": "dr", "scheduler": "sh", "servers": [{"address": "198.51.100.31", "port": 8080}]},
     "spec.servers[0].port", "DR rewrites only the MAC address, never the port"),
    ({"snatAddress": "198.51.100.9"}, "spec.snatAddress", 'only used with method "fullnat"'),
    ({"healthCheck": "tcp://198.51.100.31:80"}, "spec.healthCheck", "the check runs against each server"),
    ({"healthCheck": "udp://:53"}, "spec.healthCheck", "unsupported health check"),
    ({"servers": [{"address": "2001:db8:1::31"}]}, "spec.servers", "no IPv4 server for the Service's address"),
    ({"lbKind": "NAT"}, "spec.lbKind", 'unknown field "lbKind"'),
])
def test_refused_with_why(spec, field, why):
    message = one_error(backends(**spec))
    assert message.startswith(f'Backends "prod/web": {field}: '), message
    assert why in message


def test_unknown_service():
    message = one_error(backends(name="api"))
    assert message.startswith('Backends "prod/api": metadata.name: unknown service "prod/api"')


def test_portful_server_with_tcp_udp_mix():
    dns_ports = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    dns = service(name="dns", status_ips=[VIP], ports=dns_ports)
    message = one_error(backends(name="dns", servers=[{"address": "198.51.100.31", "port": 5353}]), svc=dns)
    assert "spec.servers[0].port" in message and "53/UDP, 53/TCP" in message and "leave the port out" in message
    cfg = parse_resources(docs(backends(name="dns", servers=[{"address": "198.51.100.31"}]), svc=dns))
    rules = dataplane_plan(cfg)
    assert sorted((r.protocol, r.port, r.targets[0].port) for r in rules) == [("tcp", 53, 53), ("udp", 53, 53)]


def test_wrong_api_version_and_duplicate():
    doc = backends()
    doc["apiVersion"] = "nocloud.io/v1"
    assert 'apiVersion: "nocloud.io/v1" is not supported for Backends' in one_error(doc)
    errs = errors_of(docs(backends(), backends()))
    assert any('duplicate definition of Backends "prod/web"' in e for e in errs)


# --------------------------------------------------------------------------- facts of a machine


def test_topology_dr_and_nat_need_the_segment():
    cfg = parse_resources(docs(backends(method="dr", scheduler="maglev",
                                        servers=[{"address": "198.51.100.31"}, {"address": "192.0.2.31"}])))
    errs = check_topology(cfg.backends.values(), ["198.51.100.11/24", "2001:db8:1::11/64"])
    assert len(errs) == 1
    assert errs[0].startswith('Backends "prod/web": server 192.0.2.31 is not on any of this node\'s segments '
                              "(198.51.100.0/24, 2001:db8:1::/64): DR rewrites only the destination MAC")
    cfg = parse_resources(docs(backends(method="nat", servers=[{"address": "192.0.2.31"}])))
    assert "director as the real server's gateway" in check_topology(cfg.backends.values(), ["198.51.100.11/24"])[0]
    cfg = parse_resources(docs(backends(method="fullnat", servers=[{"address": "192.0.2.31"}])))
    assert check_topology(cfg.backends.values(), ["198.51.100.11/24"]) == []  # routed servers are fine


def test_gateway_check():
    assert check_gateway("198.51.100.31", "nat", "198.51.100.11", ["198.51.100.11", "198.51.100.12"]) == ""
    msg = check_gateway("198.51.100.31", "nat", "198.51.100.1", ["198.51.100.11"])
    assert 'default gateway "198.51.100.1" is not a director (198.51.100.11)' in msg
    assert check_gateway("198.51.100.31", "fullnat", "198.51.100.1", ["198.51.100.11"]) == ""


# --------------------------------------------------------------------------- Maglev


NAMES = [f"198.51.100.{i}:80" for i in range(31, 41)]
SIZE = 251  # 10 servers of weight 1: the smallest size of at least 20 slots per server


def test_maglev_size_follows_the_weights():
    assert maglev_size([1] * 10) == SIZE
    assert maglev_size([1]) == 31 and maglev_size([1, 1]) == 61 and maglev_size([]) == 31
    assert maglev_size([5] * 10) == SIZE and maglev_size([2, 4, 2]) == maglev_size([1, 2, 1]) == 127  # ratios only
    assert maglev_size([1] * 12) == SIZE and maglev_size([1] * 13) == 509  # 260 slots wanted: the next step
    assert maglev_size([256, 255] * 100) == MAGLEV_SIZES[-1]  # beyond the last step: the last
    for n in range(1, 200):
        m = maglev_size([1] * n)
        assert m in MAGLEV_SIZES and (m >= 20 * n or m == MAGLEV_SIZES[-1])
        assert all(m % d for d in range(2, int(m ** 0.5) + 1))  # prime: every skip walks every slot


@pytest.mark.parametrize("n", [1, 2, 3, 5, 10, 20, 50])
def test_maglev_balance_bound(n):
    """Every server's share is within 1/20 of its fair share (the bound maglev_size documents)."""
    names = [f"198.51.100.{i}:80" for i in range(n)]
    table = maglev_table(names)
    counts = collections.Counter(table)
    fair = len(table) / n
    assert len(table) == maglev_size([1] * n) and set(counts) == set(range(n))
    assert all(abs(c - fair) <= fair / 20 for c in counts.values())
    weighted = collections.Counter(maglev_table(names[:3], [1, 2, 3] if n >= 3 else None))
    if n >= 3:
        total = sum(weighted.values())
        assert all(abs(weighted[i] - total * w / 6) <= total * w / 6 / 20 for i, w in enumerate([1, 2, 3]))


def test_maglev_balanced_and_order_free():
    table = maglev_table(NAMES)
    assert len(table) == SIZE and set(table) == set(range(10))
    counts = collections.Counter(table)
    assert max(counts.values()) - min(counts.values()) <= 1  # Maglev fills in turns: near perfect balance
    shuffled = NAMES[:]
    random.Random(7).shuffle(shuffled)
    again = maglev_table(shuffled)
    assert [shuffled[i] for i in again] == [NAMES[i] for i in table]  # every director, any order: same table


def test_maglev_weights():
    counts = collections.Counter(maglev_table(NAMES[:3], [1, 2, 1]))
    assert counts[1] == pytest.approx(2 * counts[0], abs=2) and counts[0] == pytest.approx(counts[2], abs=1)


@pytest.mark.parametrize("down", range(10))
def test_maglev_failure_moves_only_its_flows(down):
    full = maglev_table(NAMES)
    healthy = [i != down for i in range(10)]
    after = maglev_with_health(NAMES, [1] * 10, healthy)
    assert len(after) == len(full) == SIZE  # the size follows the configured servers, never health
    moved = [s for s in range(SIZE) if full[s] != after[s]]
    assert moved and all(full[s] == down for s in moved)  # only the failed server's slots move
    assert down not in after
    spread = collections.Counter(after[s] for s in moved)
    assert len(spread) >= 6  # its flows spread over the others, not onto one neighbour
    assert maglev_with_health(NAMES, [1] * 10, [True] * 10) == full  # recovery moves them back


def test_plain_maglev_removal_is_near_minimal():
    """A server removed from the config (same size): the others' flows mostly stay. Over 20 server
    sets of 10 at 251 slots: 5.2 % of the slots move beyond the removed server's own on average,
    9.2 % at worst (1021 slots: 2.4 %, 4.3 %); maglev_with_health makes a health flip exact."""
    moved, worst = [], 0.0
    for base in range(0, 200, 10):
        names = [f"198.51.100.{base % 250 + i}:{80 + base}" for i in range(10)]
        full = maglev_table(names)
        for d in range(10):
            rest = names[:d] + names[d + 1:]
            sub = maglev_table(rest, size=len(full))
            frac = sum(1 for s in range(len(full)) if full[s] != d and names[full[s]] != rest[sub[s]]) / len(full)
            moved.append(frac)
            worst = max(worst, frac)
    assert sum(moved) / len(moved) < 0.06 and worst < 0.10


# --------------------------------------------------------------------------- the plan


def test_smooth_wrr_interleaves():
    assert smooth_wrr([5, 1, 1]) == [0, 0, 1, 0, 2, 0, 0]
    assert collections.Counter(smooth_wrr([3, 2])) == {0: 3, 1: 2}


def test_plan_per_scheduler_and_health():
    servers = [{"address": "198.51.100.31", "weight": 2}, {"address": "198.51.100.32", "weight": 1}]
    for sched, selector, slots in [("rr", "numgen", [0, 1]), ("wrr", "numgen", [0, 1, 0]),
                                   ("sh", "jhash-src", [0, 0, 1])]:
        cfg = parse_resources(docs(backends(scheduler=sched, servers=servers)))
        (rule,) = dataplane_plan(cfg)
        assert (rule.vip, rule.protocol, rule.port, rule.selector, rule.slots) == (VIP, "tcp", 80, selector, slots)
        assert [t.ident for t in rule.targets] == ["198.51.100.31:80", "198.51.100.32:80"]
        (rule,) = dataplane_plan(cfg, healthy={"prod/web 198.51.100.32:80"})
        assert set(rule.slots) == {1} and [t.healthy for t in rule.targets] == [False, True]
        (rule,) = dataplane_plan(cfg, healthy=set())
        assert rule.slots == []  # nobody healthy: the speaker programs no forwarding for it
    cfg = parse_resources(docs(backends(method="dr", scheduler="maglev", servers=servers)))
    (rule,) = dataplane_plan(cfg)
    assert rule.selector == "jhash-flow" and len(rule.slots) == maglev_size([2, 1]) == 61 and rule.method == "dr"


def test_plan_memo_gives_the_same_rules_and_reuses_unchanged_ones():
    svcs = [service(name=f"web{i}", status_ips=[f"198.51.100.{200 + i}"], ports=[{"port": 80, "protocol": "TCP"}])
            for i in range(3)]
    bks = [backends(name=f"web{i}", scheduler="maglev") for i in range(3)]
    cfg = parse_resources([pool("p", "198.51.100.200-198.51.100.220"), *svcs, *bks])
    every = {f"prod/web{i} 198.51.100.{a}:8080" for i in range(3) for a in (31, 32)}
    memo = PlanMemo()
    first = dataplane_plan(cfg, every, memo)
    assert first == dataplane_plan(cfg, every) and len(first) == 3
    flip = every - {"prod/web1 198.51.100.31:8080"}
    second = dataplane_plan(cfg, flip, memo)
    assert second == dataplane_plan(cfg, flip)
    assert second[0] is first[0] and second[2] is first[2] and second[1] is not first[1]  # only web1 replanned
    assert dataplane_plan(cfg, None, memo) == dataplane_plan(cfg)
    other = parse_resources([pool("p", "198.51.100.200-198.51.100.220"), *svcs, *bks])
    assert dataplane_plan(other, flip, memo)[0] is not first[0]  # another config: planned anew


def test_plan_dual_stack_picks_the_vip_family():
    svc = service(status_ips=[VIP, "2001:db8:1::200"], ports=[{"port": 80, "protocol": "TCP"}],
                  ipFamilies=["IPv4", "IPv6"], ipFamilyPolicy="RequireDualStack")
    cfg = parse_resources(docs(backends(servers=[{"address": "198.51.100.31"}, {"address": "2001:db8:1::31"}]),
                               svc=svc))
    by_vip = {r.vip: [t.address for t in r.targets] for r in dataplane_plan(cfg)}
    assert by_vip == {VIP: ["198.51.100.31"], "2001:db8:1::200": ["2001:db8:1::31"]}


def test_slot_ranges():
    assert slot_ranges([0, 0, 1, 1, 1, 0]) == [(0, 1, 0), (2, 4, 1), (5, 5, 0)]
    assert slot_ranges([]) == []
