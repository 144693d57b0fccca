"""DR with Maglev and BGP mode's flow handover on the same directors (issue 21, point 5).

A BGP node holds its VIPs on lo and hands TCP segments of flows it does not know to its peers
(``bgp/flows.py``, an ``ip`` prerouting hook at priority -140). A DR VIP's segments must not go
there: any director picks the same real server for a flow, so a segment the router moves to
another director after a rehash is forwarded by that director itself. They do not: the data
plane's DR chain is a netdev ingress hook (priority -400) whose ``fwd`` takes the packet before
the IP stack, conntrack and the handover see it. Here n1 and n2 are directors (DataplaneMode, DR,
Maglev) that also run the handover tables toward each other, with the VIP on lo as BGP mode holds
it; the client's next hop moves from n1 to n2 (a rehash) while connections are held.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from dataplane_harness import HOLD_CODE, VIP, directors, in_table, point_client, prepare, resources
from nocloudlb.bgp.flows import FLOW_TABLE, FlowHandover, netlink_resolver


@pytest.fixture
def netns_prefix() -> str:
    return "ndh"


@pytest.fixture
def lab(make_segment):
    seg = make_segment(hosts=4)
    with directors(seg) as director:
        yield seg, director


def _hold(seg, port: int):
    p = seg.popen(seg.client.ns, [sys.executable, "-u", "-c", HOLD_CODE, VIP, str(port), "3"], stdin=subprocess.PIPE)
    first = p.stdout.readline().strip()

    def again() -> str:
        p.stdin.write("x\n")
        p.stdin.flush()
        return p.stdout.readline().strip()
    return first, again


def _handover_counters(seg, ns: str) -> list[int]:
    text = seg.run(ns, ["nft", "list", "chain", "ip", FLOW_TABLE, "unknown"]).stdout
    return [int(n) for n in re.findall(r"counter packets (\d+)", text)]


def test_dr_segments_of_moved_flows_are_forwarded_not_handed_over(lab):
    seg, director = lab
    prepare(seg, "dr")
    n1, n2 = seg.hosts[:2]
    docs = resources("dr", "maglev", ports=((80, "TCP"),))
    for d in (director(0), director(1)):
        d.apply(docs)
        d.wait_programmed(lambda st: len(in_table(st)) == 2)
    seg.run(n1.ns, ["ping", "-c1", "-W2", n2.ipv4])  # the neighbour entries the handover reads
    for me, other in ((n1, n2), (n2, n1)):
        seg.run(me.ns, f"ip addr add {VIP}/32 dev lo")
        fh = FlowHandover([other.ipv4], lambda argv, stdin=None, ns=me.ns: seg.run(ns, argv, input=stdin).stdout,
                          resolve=netlink_resolver(me.ns))
        fh.refresh({VIP})
        assert fh.status()["active"], fh.status()
    point_client(seg, n1)
    held = [_hold(seg, 32000 + i) for i in range(30)]
    firsts = [first for first, _again in held]
    assert set(firsts) == {"n3", "n4"}, firsts
    point_client(seg, n2)  # the router's rehash: the flows now reach n2, which never saw them
    after = [again() for _first, again in held]
    assert after == firsts, (firsts, after)  # every connection goes on, on its server
    # n2 forwarded them by DR itself: its handover tables saw none of their segments
    listing = seg.run(n2.ns, ["nft", "list", "table", "ip", FLOW_TABLE]).stdout
    assert _handover_counters(seg, n2.ns) == [0, 0, 0], listing
