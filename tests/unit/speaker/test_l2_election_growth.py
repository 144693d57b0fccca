"""The layer-2 election as the cluster grows past ``INTERN_MAX`` known nodes: a new name is inserted into each
VIP's kept order (binary search over the kept key prefixes) rather than sorting every order again. The orders,
the decisions and the rows must stay what sorting afresh gives, whichever way the names arrive, including when
key prefixes are equal (forced here with one-byte prefixes)."""

from __future__ import annotations

import random

import pytest
from nocloudlb.core.election import NodeView, election_order, layer2_decision
from nocloudlb.l2 import election as l2election
from nocloudlb.l2.election import INTERN_MAX, Election
from test_speaker_scale_l2 import random_config
from test_speaker_scale_reconcile import big, mode_for, rows_built

pytestmark = pytest.mark.timeout(120)


def grow_view(rng: random.Random, names: list[str], services: list[str]) -> list[NodeView]:
    out = []
    for name in names:
        labels = {"zone": rng.choice("xy")}
        healthy = frozenset(s for s in services if rng.random() < 0.8)
        out.append(NodeView(name, labels, rng.choice(["alive", "alive", "alive", "suspect", "dead"]), healthy))
    return out


@pytest.mark.parametrize("prefix_bytes", [4, 1])
def test_names_arriving_one_by_one_or_in_batches_decide_as_layer2_decision(monkeypatch, prefix_bytes):
    monkeypatch.setattr(l2election, "PREFIX_BYTES", prefix_bytes)  # 1 byte: many equal prefixes at 40 nodes
    rng = random.Random(23 + prefix_bytes)
    inserted = 0
    for _round in range(12):
        parsed = random_config(rng)
        keys = [s.key for s in parsed.services]
        pool = [f"node-{rng.randrange(10**6)}" for _i in range(40)]
        election, by_class = Election(), Election()
        names = pool[:3]
        while len(names) < len(pool):
            names = names + pool[len(names):len(names) + rng.choice([1, 1, 1, 2, 5, 9])]
            nodes = grow_view(rng, names, keys)
            me = rng.choice(names)
            want = {}
            for ip, skey, p, leader, reason, _g in election.decide(me, nodes, parsed):
                if p is None:
                    continue
                want[ip, skey] = layer2_decision(me, nodes, parsed.l2_advertisements_for_pool(p),
                                                 parsed.service(skey), ip)
                assert (leader, reason) == want[ip, skey], (ip, me, len(names))
            for cls, leader, reason, _g in by_class.classes(me, nodes, parsed):  # kept classes, new orders
                for i in cls.idxs if cls.gkey is not None else ():
                    ip, svc = by_class.entries[i][0], by_class.entries[i][1]
                    assert (leader, reason) == want[ip, svc.key], (ip, me, len(names))
            for ip, order in election._order.items():  # the kept orders themselves, not only their first
                assert list(order) == election_order(sorted(set(names)), ip), (ip, len(names))
            inserted += len(names) > INTERN_MAX
    assert inserted > 100  # the insertion path ran, not only the sort


def nodes_named(names: list[str], parsed) -> list[NodeView]:
    healthy = frozenset(s.key for s in parsed.services)
    return [NodeView(n, {"zone": "a"}, "alive", healthy) for n in names]


def test_a_new_member_above_intern_max_keeps_the_classes_and_rebuilds_only_the_vips_it_takes(tmp_path, monkeypatch):
    parsed = big(200)
    names = [f"n{i}" for i in range(1, 21)]
    mode, ann = mode_for("n1")
    mode.state_dir = str(tmp_path)
    mode.apply("n1", nodes_named(names, parsed), parsed)
    classes = list(mode._planner.election._partition())
    before = {r.ip: r for r in mode._rows}

    built = rows_built(monkeypatch)
    mode.apply("n1", nodes_named([*names, "newcomer"], parsed), parsed)
    after = {r.ip: r for r in mode._rows}
    taken = {ip for ip, r in after.items() if r.leader == "newcomer"}
    assert 3 <= len(taken) <= 25  # about 200 / 21 of them
    assert all(before[ip].leader != "newcomer" for ip in taken)
    assert set(built) == taken  # only the VIPs the new name leads now were decided into new rows
    assert mode._planner.election._partition() == classes and all(
        a is b for a, b in zip(mode._planner.election._partition(), classes, strict=True))
    assert {ip for ip, r in after.items() if r.leader == "n1"} == set(ann.current)
    fresh, fresh_ann = mode_for("n1")
    fresh.state_dir = str(tmp_path)
    fresh.apply("n1", nodes_named([*names, "newcomer"], parsed), parsed)
    assert [(r.ip, r.leader, r.reason) for r in fresh._rows] == [(r.ip, r.leader, r.reason) for r in mode._rows]
    assert fresh_ann.current == ann.current


def test_an_insertion_that_fails_half_way_sorts_everything_again_next_time(monkeypatch):
    parsed = big(50)
    names = [f"n{i}" for i in range(1, 13)]
    election = Election()
    election.decide("n1", nodes_named(names, parsed), parsed)
    calls = {"n": 0}
    real = l2election.insert

    def failing(*a):
        calls["n"] += 1
        if calls["n"] == 20:
            raise MemoryError("injected")
        return real(*a)

    monkeypatch.setattr(l2election, "insert", failing)
    with pytest.raises(MemoryError):
        election.decide("n1", nodes_named([*names, "late"], parsed), parsed)
    monkeypatch.setattr(l2election, "insert", real)
    election.decide("n1", nodes_named([*names, "late"], parsed), parsed)
    for ip, order in election._order.items():
        assert list(order) == election_order([*names, "late"], ip)
