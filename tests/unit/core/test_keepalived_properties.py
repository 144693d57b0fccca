# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Property: for random node sets, VIPs and failures, keepalived's master (the highest
priority among the members still up, as VRRP elects it) is the speaker's leader
(layer2_decision on the same view). Also: VRIDs unique per interface and family."""

from __future__ import annotations

import os

from conftest import l2adv, pool, service
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nocloudlb.core import keepalived as k
from nocloudlb.core.election import NodeView, layer2_decision
from nocloudlb.core.schema import parse_resources

SETTINGS = settings(
    max_examples=int(os.environ.get("NOCLOUD_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    derandomize=not os.environ.get("NOCLOUD_HYPOTHESIS_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)

names = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)


@SETTINGS
@given(
    nodes=st.lists(names, min_size=1, max_size=12, unique=True),
    last_octets=st.lists(st.integers(1, 254), min_size=1, max_size=10, unique=True),
    v6=st.lists(st.integers(1, 65535), max_size=4, unique=True),
    zone_b=st.sets(st.integers(0, 11)),
    down=st.sets(st.integers(0, 11)),
    drained=st.sets(st.integers(0, 11)),
    prefer=st.booleans(),
)
def test_keepalived_master_is_our_leader(nodes, last_octets, v6, zone_b, down, drained, prefer):
    ips = [f"198.51.100.{o}" for o in last_octets] + [f"2001:db8:1::{x:x}" for x in v6]
    labels = {n: {"zone": "b" if i in zone_b else "a"} for i, n in enumerate(nodes)}
    spec = {"interfaces": ["eth0"]}
    if prefer:
        spec["preferredNodeSelectors"] = [{"weight": 5, "preference": {"matchLabels": {"zone": "b"}}}]
    docs = [pool("p4", "198.51.100.0/24"), pool("p6", "2001:db8:1::/112"), l2adv("lan", **spec)]
    docs += [service(f"s{i}", status_ips=[ip]) for i, ip in enumerate(ips)]
    plan = k.plan(docs, [{"name": n, "labels": labels[n]} for n in nodes])
    config = parse_resources(docs)
    seen: dict[tuple[str, int], set[int]] = {}
    for inst in plan.instances:
        assert inst.vrid not in seen.setdefault((inst.segment, inst.family), set())
        seen[(inst.segment, inst.family)].add(inst.vrid)
        svc = config.service(inst.services[0])
        ip = inst.vips[0]
        advs = config.l2_advertisements_for_pool(config.pool_for_ip(ip).name)
        # up: not killed; a drained node's track file puts it in FAULT (not a candidate in VRRP either)
        up = [m for m in inst.members if nodes.index(m.node) not in down and nodes.index(m.node) not in drained]
        vrrp_master = max(up, key=lambda m: m.priority).node if up else None
        view = [NodeView(n, dict(labels[n], **({k.DRAIN_LABEL: ""} if i in drained else {})),
                         "dead" if i in down else "alive") for i, n in enumerate(nodes)]
        ours, _reason = layer2_decision(nodes[0], view, advs, svc, ip)
        assert vrrp_master == ours, (ip, [(m.node, m.priority) for m in inst.members])
