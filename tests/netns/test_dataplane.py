"""The data plane on real nftables and real TCP/UDP traffic between namespaces (root only).

Each test builds dataplane_harness's segment: directors n1, n2 (DataplaneMode), real
servers n3, n4, client 192.0.2.10. Claims are read from client traffic, the real servers'
view of the peer address, and captures.
"""

from __future__ import annotations

import time

import pytest
from dataplane_harness import (
    CLIENT,
    VIP,
    Director,
    backends_of,
    in_table,
    point_client,
    prepare,
    requests,
    resources,
    spread,
)


@pytest.fixture
def netns_prefix() -> str:
    return "ndp"


@pytest.fixture
def lab(make_segment):
    seg = make_segment(hosts=4)
    made: list[Director] = []

    def director(i: int = 0) -> Director:
        d = Director(seg, seg.hosts[i])
        made.append(d)
        return d

    yield seg, director
    for d in made:
        d.close()


def all_in(n: int):
    return lambda st: len(in_table(st)) == n


def test_nat_round_robin_spreads_and_replies_return_through_the_director(lab):
    seg, director = lab
    prepare(seg, "nat")
    d1 = director(0)
    d1.apply(resources("nat", "rr"))
    d1.wait_programmed(all_in(2))
    point_client(seg, seg.hosts[0])
    answers = requests(seg, 20)
    assert spread(answers) == {"n3": 10, "n4": 10}, answers  # numgen inc: strict alternation
    assert {a.split()[1] for a in answers} == {CLIENT}  # NAT: the server sees the client's address
    udp = requests(seg, 10, "udp")
    assert spread(udp) == {"n3": 5, "n4": 5}, udp
    st = d1.cmd("status")
    assert sorted(b["packets"] for b in backends_of(st)) == [10, 10]  # one counted first packet per connection
