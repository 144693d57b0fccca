"""The heartbeat simulator (benchmarks/heartbeat_sim.py): the real ``Heartbeat`` class run on a virtual
clock over an in-memory transport. Each test reads what it asserts from the real objects (their
``view()``, ``counters``, ``status()``), so a simulator that did not drive the class faithfully fails."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "benchmarks" / "heartbeat_sim.py"
_spec = importlib.util.spec_from_file_location("heartbeat_sim", _PATH)
assert _spec is not None and _spec.loader is not None
hs = importlib.util.module_from_spec(_spec)
sys.modules["heartbeat_sim"] = hs  # dataclasses look their module up
_spec.loader.exec_module(hs)

INTERVAL, MISS = 0.025, 4  # the fast profile
TIMEOUT = INTERVAL * MISS
NAMES = ("n1", "n2", "n3", "n4", "n5")


def sim(faults=None, gossip=None, names=NAMES, seed=1, **kw):
    return hs.Simulator(names, INTERVAL, MISS, faults or hs.Faults(), gossip or hs.Gossip(), seed, **kw)


def views(s):
    return {n.name: n.hb.view() for n in s.nodes}


def assert_clean(s, skip=()):
    for name, v in views(s).items():
        if name in skip:
            continue
        assert not v.suspected and not v.cut_off and v.quorum, (name, v)


def test_no_faults_no_suspicion_and_everyone_connected():
    s = sim()
    s.run(5.0)
    for n in s.nodes:
        v = n.hb.view()
        assert v.suspected == frozenset() and v.suspecters == frozenset() and not v.cut_off
        assert v.quorum and v.votes == 5 and v.total == 5
        assert v.connected == frozenset(NAMES) - {n.name}
        assert n.hb.counters["suspicions"] == 0 and n.hb.rejected == {}
        assert n.hb.counters["received"] > 4 * 5.0 / INTERVAL * 0.95  # it really took the others' datagrams
    assert s.suspicions == []


def test_datagrams_per_node_is_members_over_interval():
    s = sim()
    s.run(1.0)
    before = {n.name: n.hb.counters["sent"] for n in s.nodes}
    s.run(3.0)
    for n in s.nodes:
        rate = (n.hb.counters["sent"] - before[n.name]) / 2.0
        assert rate == pytest.approx((len(NAMES) - 1) / INTERVAL, rel=0.05), (n.name, rate)


def test_the_clock_is_virtual():
    s = sim()
    s.run(2.0)
    peers = s.nodes[0].hb.status()["peers"]  # status() reads the clock given to Heartbeat
    assert set(peers) == set(NAMES[1:])
    assert all(0 <= p["heardMsAgo"] <= 2 * INTERVAL * 1000 and p["hearsMe"] for p in peers.values()), peers


def test_a_crash_is_suspected_by_every_survivor_within_the_timeout_and_not_before():
    s = sim(hs.Faults(crashes={"n5": 1.0}))
    s.run(1.0 + TIMEOUT - INTERVAL - 1e-6)
    assert all("n5" not in v.suspected for v in views(s).values())  # nobody before interval x (miss - 1)
    s.run(1.0 + TIMEOUT + INTERVAL / 2)
    for name, v in views(s).items():
        if name != "n5":
            assert v.suspected == {"n5"} and v.quorum and not v.cut_off, (name, v)
    firsts = {x.observer: x.time - 1.0 for x in s.suspicions if x.target == "n5"}
    assert set(firsts) == set(NAMES[:4])
    assert all(TIMEOUT - INTERVAL <= t <= TIMEOUT + INTERVAL / 2 for t in firsts.values()), firsts
    assert not any(x.false for x in s.suspicions)


def test_gossip_oracle_suspects_then_removes_a_crashed_member():
    gossip = hs.Gossip.of("fast")
    s = sim(hs.Faults(crashes={"n5": 1.0}), gossip)
    s.run(1.0 + gossip.dead_after + 0.01)
    for n in s.nodes[:4]:
        assert "n5" not in n.hb.status()["peers"]  # set_peers dropped it: gossip declared it dead
        v = n.hb.view()
        assert not v.suspected and v.quorum and v.total == 5  # the quorum basis still counts it
    assert {x.observer for x in s.suspicions if x.target == "n5"} == set(NAMES[:4])


def test_partition_minority_has_no_quorum_and_majority_suspects_it():
    two, three = frozenset({"n1", "n2"}), frozenset({"n3", "n4", "n5"})
    s = sim(hs.Faults(partitions=[hs.Partition((two, three), 1.0, 2.0)]))
    s.run(1.5)
    v = views(s)
    for name in two:
        assert v[name].suspected == three and not v[name].cut_off and not v[name].quorum, v[name]
    for name in three:
        assert v[name].suspected == two and v[name].quorum and not v[name].cut_off, v[name]
    s.run(2.5)
    assert_clean(s)
    conv = s.converged_after(2.0)
    assert conv is not None and conv < TIMEOUT
    assert s.suspicions and not any(x.false for x in s.suspicions)  # across the partition: excused


def test_a_node_alone_in_a_partition_is_cut_off_and_suspects_nobody():
    one, rest = frozenset({"n1"}), frozenset(NAMES) - {"n1"}
    s = sim(hs.Faults(partitions=[hs.Partition((one, rest), 1.0, 2.0)]))
    s.run(1.5)
    v = views(s)
    assert v["n1"].cut_off and not v["n1"].quorum and v["n1"].suspected == frozenset()
    for name in rest:
        assert v[name].suspected == {"n1"} and v[name].quorum


def test_total_loss_on_one_path_needs_a_second_opinion():
    s = sim()
    s.run(1.0)  # heard once first: a member never heard is not suspected (gossip's word counts)
    s.faults.path_loss[("n1", "n2")] = 1.0
    s.run(6.0)
    v = views(s)
    assert all(n.hb.counters["suspicions"] == 0 for n in s.nodes)
    assert_clean(s)
    assert "n1" not in v["n2"].connected  # the path really is cut: n2 does not hear n1 ...
    assert v["n1"].deaf_to == {"n2"}  # ... and says so (F_DEAF)
    assert s.dropped["loss"] > 0.9 * 5.0 / INTERVAL


def test_a_member_never_heard_is_not_suspected():
    s = sim(hs.Faults(path_loss={("n1", "n2"): 1.0, ("n1", "n3"): 1.0}))
    s.run(2.0)
    v = views(s)
    assert "n1" not in v["n2"].suspected and "n1" in v["n2"].connected  # on gossip's word until heard


def test_two_lossy_paths_make_no_suspicion_three_make_one_counted_false():
    s = sim()
    s.run(1.0)
    s.faults.path_loss.update({("n1", "n2"): 1.0, ("n1", "n3"): 1.0})
    s.run(2.0)
    assert not [x for x in s.suspicions if x.false]  # n2 and n3 miss n1, but each has one other opinion only
    assert {n for n, v in views(s).items() if "n1" in v.suspected} == set()
    s.faults.path_loss[("n1", "n4")] = 1.0
    s.run(3.0)
    v = views(s)
    assert all("n1" in v[n].suspected for n in ("n2", "n3", "n4"))  # two others agree with each of them
    assert "n1" not in v["n5"].suspected  # it hears n1
    assert {(x.observer, x.target) for x in s.suspicions if x.false} == {("n2", "n1"), ("n3", "n1"), ("n4", "n1")}


def test_in_a_three_node_cluster_one_other_opinion_suffices():
    s = sim(names=["n1", "n2", "n3"])
    s.run(1.0)
    s.faults.path_loss.update({("n1", "n2"): 1.0, ("n1", "n3"): 1.0})  # n1's outbound link, say
    s.run(2.0)
    v = views(s)
    assert "n1" in v["n2"].suspected and "n1" in v["n3"].suspected


def test_ten_percent_loss_reaches_the_class_without_false_suspicions():
    s = sim(hs.Faults(loss=0.1), seed=3)
    s.run(5.0)
    sent = sum(n.hb.counters["sent"] for n in s.nodes)
    received = sum(n.hb.counters["received"] for n in s.nodes)
    assert received / sent == pytest.approx(0.9, abs=0.02)
    assert not [x for x in s.suspicions if x.false]
    assert all(n.hb.counters["suspicions"] == 0 for n in s.nodes)


def test_a_stall_longer_than_the_timeout_is_suspected_and_recovers():
    s = sim(hs.Faults(stalls=[hs.Stall("n3", 1.0, 3 * TIMEOUT)]))
    s.run(1.0 + TIMEOUT + INTERVAL)
    for name, v in views(s).items():
        if name != "n3":
            assert v.suspected == {"n3"}, (name, v)
    received = s.by_name["n3"].hb.counters["received"]
    s.run(1.0 + 3 * TIMEOUT + 2 * INTERVAL)
    assert s.by_name["n3"].hb.counters["received"] > received + 4 * 2 * TIMEOUT / INTERVAL  # the backlog
    assert_clean(s)
    assert s.suspicions and not any(x.false for x in s.suspicions)
    assert "n3" not in {x.target for x in s.suspicions if x.observer == "n3"}


def test_a_stall_shorter_than_the_timeout_goes_unnoticed():
    s = sim(hs.Faults(stalls=[hs.Stall("n3", 1.0, TIMEOUT - 2 * INTERVAL)]))
    s.run(2.0)
    assert s.suspicions == [] and all(n.hb.counters["suspicions"] == 0 for n in s.nodes)


def test_measured_cpu_time_keeps_a_small_cluster_clean():
    s = sim(hs.Faults(loss=0.05), cpu_scale=1.0)
    s.run(2.0)
    assert_clean(s)
    assert all(n.hb.counters["received"] > 0 for n in s.nodes)


def test_cli_runs_the_timeline_and_reports_from_the_real_class(capsys):
    assert hs.main(["--sizes", "4", "--seconds", "3", "--loss", "0.05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["rows"]
    assert row["datagrams_per_node"] == pytest.approx(3 / INTERVAL, rel=0.05)
    assert row["detected_by"] == 3 and row["detect_max_ms"] <= (TIMEOUT + INTERVAL) * 1000
    assert row["convergence_ms"] is not None and row["false_suspicions"] == 0


def test_cli_reports_a_size_out_of_reach_instead_of_skipping_it(capsys):
    assert hs.main(["--sizes", "1000", "--budget", "10"]) == 0
    out = capsys.readouterr().out
    assert "| 1000 |" in out and "not run" in out and "out of reach" in out


def heavy_loss_false(monkeypatch, confirmations: int) -> list:
    monkeypatch.setattr(hs.heartbeat_module, "CONFIRMATIONS", confirmations)
    s = sim(hs.Faults(loss=0.3), names=[f"n{i}" for i in range(10)], seed=1)
    s.run(1.0)
    start = len(s.suspicions)
    s.run(21.0)
    false = [x for x in s.suspicions[start:] if x.false]
    assert sum(n.hb.counters["suspicions"] for n in s.nodes) >= len(false)  # the class counted them too
    return false


def test_false_suspicions_under_heavy_loss_follow_the_model(monkeypatch):
    false = heavy_loss_false(monkeypatch, 1)  # the rule before: one other opinion
    model = hs.false_rate_model(10, INTERVAL, MISS, 0.3, 1) * 20.0  # about 37: a rough model, clustered events
    assert model / 2 <= len(false) <= model * 2, (len(false), model)


def test_two_confirmations_cut_the_false_suspicions_of_heavy_loss(monkeypatch):
    one = heavy_loss_false(monkeypatch, 1)
    two = heavy_loss_false(monkeypatch, 2)  # the class's rule, the same seed
    model = hs.false_rate_model(10, INTERVAL, MISS, 0.3, 2) * 20.0  # about 1
    assert len(two) <= max(3.0, 3 * model) and len(two) * 5 <= len(one), (len(one), len(two), model)
