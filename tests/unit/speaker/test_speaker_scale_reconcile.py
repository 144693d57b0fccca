"""Issue 10 section 5: reconcile after a membership change touches only the VIPs whose owner changed.

``Election.classes`` cuts the VIPs into classes decided alike (same kind of service, same hash order of
the known nodes): a handful at 1,000 VIPs on three nodes. ``L2Mode.apply`` decides per class and builds
rows only for the classes whose decision changed; these tests hold it equal to the per-VIP decision
(``decide``, itself held equal to ``layer2_decision``) and to a mode that decides from scratch."""

from __future__ import annotations

import gc
import random

import pytest
from inproc_speaker import Journal, RecordingAnnouncer, RecordingDelivery, pool_docs, service_doc
from nocloudlb import memory
from nocloudlb.core.election import NodeView
from nocloudlb.core.schema import parse_resources
from nocloudlb.l2 import plan as l2plan
from nocloudlb.l2.election import Election
from nocloudlb.l2.mode import L2Mode
from test_speaker_scale_l2 import NODES, random_config, random_view

pytestmark = pytest.mark.timeout(120)


def test_classes_decide_every_vip_as_decide_does():
    rng = random.Random(11)
    for _round in range(60):
        parsed = random_config(rng)
        by_class, by_vip = Election(), Election()
        keys = [s.key for s in parsed.services]
        for _view in range(4):  # the same Elections across views: cached orders and classes stay right
            nodes = random_view(rng, keys)
            me = rng.choice(NODES)
            want = [(ip, skey, leader, reason) for ip, skey, _p, leader, reason, _g in by_vip.decide(me, nodes, parsed)]
            got: dict[int, tuple] = {}
            for cls, leader, reason, g in by_class.classes(me, nodes, parsed):
                for i in cls.idxs:
                    ip, svc = by_class.entries[i][0], by_class.entries[i][1]
                    got[i] = (ip, svc.key, leader, reason)
                    if g is not None and reason == "":  # the runner-up (suspectedByPeer) too
                        assert by_class.class_runner_up(me, g, cls) == by_vip.runner_up(me, g, ip), (ip, nodes)
            assert [got[i] for i in range(len(want))] == want, (me, nodes)


def mode_for(me: str) -> tuple[L2Mode, RecordingAnnouncer]:
    journal = Journal()
    ann = RecordingAnnouncer(journal, me, None)
    return L2Mode(ann, RecordingDelivery(journal), "/nonexistent"), ann


def rows_of(mode: L2Mode) -> list[tuple]:
    return [(r.ip, r.service, r.pool, r.leader, r.announcing, r.reason, r.interfaces, r.on_lo) for r in mode._rows]


def test_rows_kept_across_views_equal_rows_decided_afresh(tmp_path):
    """One mode through a series of views (rows reused by class) against a new mode for each view."""
    rng = random.Random(12)
    for _round in range(25):
        parsed = random_config(rng)
        keys = [s.key for s in parsed.services]
        me = rng.choice(NODES)
        kept, kept_ann = mode_for(me)
        kept.state_dir = str(tmp_path)
        for _view in range(5):
            nodes = random_view(rng, keys)
            suspecters = frozenset(rng.sample(NODES, rng.randint(0, 2)))
            kept.suspecters = lambda s=suspecters: s
            kept.apply(me, nodes, parsed)
            fresh, fresh_ann = mode_for(me)
            fresh.state_dir = str(tmp_path)
            fresh.suspecters = kept.suspecters
            fresh.apply(me, nodes, parsed)
            assert rows_of(kept) == rows_of(fresh), (me, nodes, suspecters)
            assert kept_ann.current == fresh_ann.current


def big(n: int):
    docs = pool_docs() + [service_doc(f"svc{i}", f"2001:db8:100::{i + 1:x}") for i in range(n)]
    for d in docs:
        if d["kind"] == "IPAddressPool":
            d["spec"]["addresses"] = ["2001:db8:100::/112"]
    return parse_resources(docs)


def view(alive: list[str], parsed) -> list[NodeView]:
    healthy = frozenset(s.key for s in parsed.services)
    return [NodeView(n, {"zone": "a"}, "alive" if n in alive else "dead", healthy) for n in ["n1", "n2", "n3"]]


def rows_built(monkeypatch) -> list[str]:
    """The VIPs whose rows the layer-2 mode builds from now on (a list that fills as it builds them)."""
    built: list[str] = []
    real = l2plan.VipRow

    def counting(*a, **k):
        built.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(l2plan, "VipRow", counting)
    return built


def test_a_membership_change_builds_rows_only_for_the_vips_that_moved(tmp_path, monkeypatch):
    parsed = big(1000)
    mode, ann = mode_for("n1")
    mode.state_dir = str(tmp_path)
    mode.apply("n1", view(["n1", "n2", "n3"], parsed), parsed)
    classes = mode._planner.election._partition()
    assert len(classes) <= 6, "3 nodes: at most 3! hash orders of one kind of service"
    before = {r.ip: r for r in mode._rows}
    led_by_n2 = {ip for ip, r in before.items() if r.leader == "n2"}
    assert 200 < len(led_by_n2) < 500

    built = rows_built(monkeypatch)
    mode.apply("n1", view(["n1", "n3"], parsed), parsed)  # n2 dies
    after = {r.ip: r for r in mode._rows}
    moved = {ip for ip in after if after[ip].leader != before[ip].leader}
    assert moved == led_by_n2
    assert set(built) == moved  # the classes n2 led, no other row
    assert all(after[ip] is before[ip] for ip in after if ip not in moved)
    assert {ip for ip, r in after.items() if r.leader == "n1"} == set(ann.current)


def test_each_config_in_use_is_collected_once_then_frozen(harness, monkeypatch):
    """memory.settle after the first reconcile of each config (not on every reconcile): the collector's
    full passes no longer walk the config's objects in the middle of a reconcile."""
    calls: list[int] = []
    real = memory.settle

    def settle() -> int:
        calls.append(1)
        return real()

    monkeypatch.setattr(memory, "settle", settle)
    docs = pool_docs() + [service_doc("svc0", "198.51.100.10")]
    sp = harness.speaker("s", docs)
    try:
        sp.reconcile()
        assert len(calls) == 1 and gc.get_freeze_count() > 0
        for _tick in range(3):
            sp._iteration(["tick"])
        sp.reload()  # the same file: the same config object, nothing to collect
        sp.reconcile()
        assert len(calls) == 1
        path = harness.write("s", harness.config("s", docs + [service_doc("svc1", "198.51.100.11")]))
        assert path.exists()
        out = sp.reload()
        assert out["ok"]
        sp.reconcile()
        assert len(calls) == 2
    finally:
        gc.unfreeze()


def test_a_failing_group_of_vips_keeps_what_it_announced_then_withdraws_and_spares_the_others(
        tmp_path, monkeypatch):
    """A group of VIPs whose part of the apply raises (here the runner-up lookup the suspecters rule makes)
    keeps what this node announced of it for GROUP_FAIL_BOUND s, then withdraws it (reason stepFailed);
    every other group is decided as before; the group is decided normally once the step works again."""
    parsed = parse_resources(pool_docs() + [service_doc(f"svc{i}", f"198.51.100.{200 + i}") for i in range(12)])
    nodes = [NodeView(n, {}, "alive", frozenset()) for n in NODES]
    me = NODES[0]
    mode, ann = mode_for(me)
    mode.state_dir = str(tmp_path)
    mode.apply(me, nodes, parsed)
    mine = set(ann.current)
    assert mine
    victim = sorted(mine)[0]
    real = mode._planner.election.class_runner_up

    def runner_up(me_, g, cls):
        if victim in cls.ipset:
            raise RuntimeError("injected")
        return real(me_, g, cls)

    monkeypatch.setattr(mode._planner.election, "class_runner_up", runner_up)
    mode.suspecters = lambda: frozenset({"nobody"})  # makes the apply ask for the runner-up of every group
    mode.apply(me, nodes, parsed)
    assert set(ann.current) == mine  # kept while within the bound
    monkeypatch.setattr(l2plan, "GROUP_FAIL_BOUND", 0.0)
    mode.apply(me, nodes, parsed)
    assert victim not in ann.current and set(ann.current) | {victim} >= mine
    row = next(r for r in mode._rows if r.ip == victim)
    assert (row.announcing, row.reason) == (False, "stepFailed")
    monkeypatch.setattr(mode._planner.election, "class_runner_up", real)
    mode.apply(me, nodes, parsed)
    assert set(ann.current) == mine
