# -*- coding: utf-8 -*-
"""The chaos run's verdicts (tests/chaos/chaos.py): fed probe rounds, it must flag what breaks a goal."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("chaos_tool", ROOT / "tests" / "chaos" / "chaos.py")
assert spec and spec.loader
chaos = importlib.util.module_from_spec(spec)
sys.modules["chaos_tool"] = chaos
spec.loader.exec_module(chaos)

A, B = "02:00:00:00:00:0a", "02:00:00:00:00:0b"
VIP = "198.51.100.200"


def fake(answers: list[list[str]], http_ok: bool = True) -> SimpleNamespace:
    rounds = [{"t": 1000.0 + i * chaos.ROUND, "a": {VIP: macs}} for i, macs in enumerate(answers)]
    http = [{"t": 1000.0 + i, "ip": VIP, "ok": http_ok, "body": "n1"} for i in range(3)]
    return SimpleNamespace(vips=[{"ip": VIP, "service": "chaos/a"}], rounds=rounds, http=http,
                           host_of={A: "n1", B: "n2"}, macs={"n1": A, "n2": B})


def record(**kw) -> chaos.Record:
    return chaos.Record("p", "phase", start=999.0, fault=1000.0, end=1000.0 + 800 * chaos.ROUND, **kw)


def test_one_owner_throughout_meets_the_goals():
    res = chaos.analyse(fake([[A]] * 300), record())
    assert res["ok"] and res["problems"] == []
    assert res["vips"][VIP]["two_max_s"] == 0 and res["vips"][VIP]["none_max_s"] == 0
    assert res["vips"][VIP]["owners"] == ["n1"]


def test_short_gaps_and_overlaps_within_the_limits_are_tolerated_and_measured():
    answers = [[A]] * 50 + [[]] * 20 + [[B]] * 50 + [[A, B]] * 10 + [[B]] * 50
    res = chaos.analyse(fake(answers), record())
    assert res["ok"]
    item = res["vips"][VIP]
    assert abs(item["none_max_s"] - 2.0) < 1e-6 and abs(item["two_max_s"] - 1.0) < 1e-6
    assert item["owners"] == ["n1", "n2"]


def test_two_owners_beyond_the_detection_window_break_the_goal():
    n = int(chaos.LIMIT_TWO / chaos.ROUND) + 5
    res = chaos.analyse(fake([[A]] * 10 + [[A, B]] * n + [[B]] * 10), record())
    assert not res["ok"]
    assert any("two owners" in p for p in res["problems"])


def test_no_owner_beyond_detection_plus_announcement_breaks_the_goal():
    n = int(chaos.LIMIT_NONE / chaos.ROUND) + 5
    res = chaos.analyse(fake([[A]] * 10 + [[]] * n + [[B]] * 10), record())
    assert not res["ok"]
    assert any("no owner" in p for p in res["problems"])


def test_a_phase_not_promised_is_measured_but_does_not_fail_the_run():
    n = int(chaos.LIMIT_TWO / chaos.ROUND) + 50
    res = chaos.analyse(fake([[A, B]] * n), record(goals=False))
    assert res["ok"] and res["problems"]


def test_a_drained_node_that_answers_breaks_the_goal_even_once():
    answers = [[A]] * 100 + [[B]] * 99 + [[A]] + [[B]] * 100
    res = chaos.analyse(fake(answers), record(drained="n1", drained_from=1000.0 + 150 * chaos.ROUND,
                                              drained_until=1000.0 + 300 * chaos.ROUND))
    assert not res["ok"]
    assert res["vips"][VIP]["drained_answers"] == 1


def test_a_phase_that_raised_fails():
    res = chaos.analyse(fake([[A]] * 100), record(error="LabError: host did not come back"))
    assert not res["ok"] and "the phase failed" in res["problems"][0]


def test_right_after_loss_the_wider_detection_window_applies_and_only_there():
    n = int((chaos.LIMIT_NONE + 1.0) / chaos.ROUND)
    answers = [[A]] * 10 + [[]] * n + [[B]] * 10
    assert not chaos.analyse(fake(answers), record())["ok"]
    assert chaos.analyse(fake(answers), record(window="degraded"))["ok"]
    n = int((chaos.limits("degraded")[1] + 1.0) / chaos.ROUND)
    assert not chaos.analyse(fake([[A]] * 10 + [[]] * n), record(window="degraded"))["ok"]


def test_the_full_run_has_every_phase_and_the_short_run_only_known_ones():
    assert sorted(chaos.FULL) == sorted(chaos.PHASES)
    assert set(chaos.SHORT) <= set(chaos.PHASES)


def test_two_owners_interrupted_by_single_rounds_count_as_one_overlap():
    flapping = ([[A, B]] * 8 + [[A]]) * int(chaos.LIMIT_TWO / 0.9 + 2)
    res = chaos.analyse(fake([[A]] * 5 + flapping + [[A]] * 30), record())
    assert not res["ok"] and any("two owners" in p for p in res["problems"])
