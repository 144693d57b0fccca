"""Core benchmark (a script, not a test): allocation at scale and election order.

* Allocation: 10,000 services over four pools that together cover a /16
  (198.18.0.0/16, the range RFC 2544 sets aside for benchmarks; the /16 does not
  fit in the documentation ranges). The services mix what MetalLB's users do:
  most take any address, some share one (same key, other ports), some ask for an
  exact address or a pool, one pool is pinned to some namespaces and one avoids
  .0/.255. Measured: parsing the documents, a cold allocation (no previous), a
  warm re-run (previous = the result), churn (1,000 services removed, 1,000
  added, with previous: how many of the others moved, which must be 0), and the
  peak memory of a cold allocation (tracemalloc, in a separate run because
  tracing slows Python down).
* Election: ``election_order`` of 10,000 VIPs over 100 nodes (MetalLB's
  sha256(node#ip) sort), and the leaders' spread over the nodes.
* A new member at size: the speaker's layer-2 election (``nocloudlb.l2.election``)
  over 10,000 VIPs and 300 known nodes, its objects frozen after the first view as
  the speaker freezes them after a config's first reconcile (``memory.settle``);
  then new names one at a time: the median and worst time of the view that brings
  each, inserted into the kept orders, side by side with the previous way (every
  order sorted again), and the VIPs whose leader changed.

Run: ``.venv/bin/python benchmarks/core_bench.py`` (well under a minute). Prints one
line per figure; ``--json`` prints them as JSON instead.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import statistics
import time
import tracemalloc
from collections import Counter

from nocloudlb import memory
from nocloudlb.core.allocation import allocate
from nocloudlb.core.election import NodeView, election_order
from nocloudlb.core.schema import parse_resources
from nocloudlb.l2 import election as l2election

BASE = ipaddress.IPv4Network("198.18.0.0/16")


def pool_docs() -> list[dict]:
    quarters = list(BASE.subnets(new_prefix=18))
    specs = [
        ("bench-a", {"addresses": [str(quarters[0])]}),
        ("bench-b", {"addresses": [str(quarters[1])], "avoidBuggyIPs": True}),
        ("bench-c", {"addresses": [str(quarters[2])],
                     "serviceAllocation": {"priority": 5, "namespaces": [f"ns{i}" for i in range(0, 20, 2)]}}),
        ("bench-d", {"addresses": [str(quarters[3])], "autoAssign": False}),
    ]
    return [{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": name}, "spec": spec}
            for name, spec in specs]


def service_docs(count: int, prefix: str = "svc", offset: int = 0) -> list[dict]:
    docs = []
    # exact requests count down from the top of bench-d (autoAssign false), away from the pool requests
    top = int(ipaddress.IPv4Address("198.18.255.254")) - offset // 20
    for i in range(count):
        annotations: dict = {}
        ports = [{"port": 443, "protocol": "TCP"}]
        n = i + offset
        if n % 10 == 0:  # pairs sharing one address: same key, other ports
            annotations["metallb.io/allow-shared-ip"] = f"share{n // 20}"
            ports = [{"port": 80 + (n // 10) % 2, "protocol": "TCP"}]
        elif n % 20 == 1:
            annotations["metallb.io/loadBalancerIPs"] = str(ipaddress.IPv4Address(top - i // 20))
        elif n % 20 == 3:
            annotations["metallb.io/address-pool"] = "bench-d"
        docs.append({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{prefix}{n}", "namespace": f"ns{n % 20}", "annotations": annotations},
            "spec": {"type": "LoadBalancer", "ports": ports},
        })
    return docs


def l2_docs(vips: int, labels: dict[str, str] | None = None) -> list[dict]:
    """One pool over BASE with an L2Advertisement, and ``vips`` services, one address each (with ``labels``)."""
    docs: list[dict] = [
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "grow"},
         "spec": {"addresses": [str(BASE)]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "grow"},
         "spec": {"ipAddressPools": ["grow"]}}]
    for i in range(vips):
        ip = str(ipaddress.IPv4Address(int(BASE.network_address) + 1 + i))
        docs.append({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": f"g{i}", "namespace": "bench", "labels": dict(labels or {})},
                     "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
                     "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}})
    return docs


def new_members(parsed, nodes: int, joins: int, insert: bool) -> tuple[float, list[float], int]:
    """(first view s, each new member's view s, VIPs whose leader changed over all joins) for one Election;
    ``insert`` False: every order sorted again on a new name (the previous way)."""
    real = l2election._insert_cheaper
    if not insert:
        l2election._insert_cheaper = lambda _new, _known: False
    try:
        election = l2election.Election()
        view = [NodeView(f"node{i:03d}") for i in range(nodes)]
        first, t_first = timed(election.classes, "node000", view, parsed)
        leaders = {ip: leader for cls, leader, _r, _g in first for ip in cls.ips}
        memory.settle()
        times = []
        for k in range(joins):
            view = [*view, NodeView(f"joiner{k}")]
            out, t = timed(election.classes, "node000", view, parsed)
            times.append(t)
        after = {ip: leader for cls, leader, _r, _g in out for ip in cls.ips}
        return t_first, times, sum(1 for ip in after if after[ip] != leaders[ip])
    finally:
        l2election._insert_cheaper = real
        memory.settle()


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--vips", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--grow-vips", type=int, default=10_000, help="VIPs of the new-member figure")
    parser.add_argument("--grow-nodes", type=int, default=300, help="known nodes before the new members")
    parser.add_argument("--joins", type=int, default=5, help="new members, one view each")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures: dict[str, object] = {}

    pools = pool_docs()
    services = service_docs(args.services)
    config, t_parse = timed(parse_resources, pools + services)
    figures["services"] = args.services
    figures["pool_addresses"] = BASE.num_addresses
    figures["parse_s"] = round(t_parse, 3)

    cold, t_cold = timed(allocate, config, {})
    figures["allocate_cold_s"] = round(t_cold, 3)
    figures["allocated"] = len(cold.assignments)
    figures["failed"] = len(cold.failed)
    figures["distinct_addresses"] = len({ip for ips in cold.assignments.values() for ip in ips})

    warm, t_warm = timed(allocate, config, cold.assignments)
    figures["allocate_warm_s"] = round(t_warm, 3)
    assert warm.assignments == cold.assignments and not warm.changed

    churn = min(1000, args.services // 10)
    kept = services[churn:]
    added = service_docs(churn, prefix="new", offset=args.services)
    churned_config = parse_resources(pools + kept + added)
    churned, t_churn = timed(allocate, churned_config, cold.assignments)
    after = churned.assignments
    moved = [key for key, ips in cold.assignments.items() if key in after and after[key] != ips]
    figures["churn_removed_added"] = churn
    figures["allocate_churn_s"] = round(t_churn, 3)
    figures["churn_moved"] = len(moved)
    figures["churn_added_served"] = len(churned.changes["added"])

    tracemalloc.start()
    allocate(config, {})
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    figures["allocate_cold_peak_mib"] = round(peak / 2**20, 1)

    nodes = [f"node{i:03d}" for i in range(args.nodes)]
    vips = [str(ipaddress.IPv4Address(int(BASE.network_address) + i)) for i in range(args.vips)]
    start = time.perf_counter()
    leaders = Counter(election_order(nodes, vip)[0] for vip in vips)
    t_elect = time.perf_counter() - start
    figures["election_vips"] = args.vips
    figures["election_nodes"] = args.nodes
    figures["election_order_s"] = round(t_elect, 3)
    figures["election_per_vip_us"] = round(t_elect / args.vips * 1e6, 1)
    per_node = [leaders.get(n, 0) for n in nodes]
    figures["leaders_per_node_min_mean_max"] = [min(per_node), round(statistics.mean(per_node), 1), max(per_node)]

    grown = parse_resources(l2_docs(args.grow_vips))
    figures["new_member_vips_nodes"] = [args.grow_vips, args.grow_nodes]
    for label, insert in (("inserted", True), ("sorted_again", False)):
        t_first, times, moved = new_members(grown, args.grow_nodes, args.joins, insert)
        figures[f"new_member_{label}_first_view_s"] = round(t_first, 3)
        figures[f"new_member_{label}_median_max_ms"] = [round(statistics.median(times) * 1000, 1),
                                                        round(max(times) * 1000, 1)]
        figures[f"new_member_{label}_vips_moved"] = moved

    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for key, value in figures.items():
        print(f"{key:34} {value}")


if __name__ == "__main__":
    main()
