"""The drain a stop set to hand its VIPs over (stophandoff.py) is removed after the next start, once that
speaker decided with it, and only that one: real label files in a temporary state directory. The hand-off
itself runs on real speakers in tests/netns/test_stop_handoff.py."""

from __future__ import annotations

import json
import time

import nocloudlb.stophandoff as sh
from nocloudlb.core.election import DRAIN_LABEL
from nocloudlb.state import LabelStore


def test_the_drain_of_a_stop_goes_after_the_start_gate_was_open_a_while(tmp_path, monkeypatch):
    monkeypatch.setattr(sh, "RELEASE_AFTER", 0.2)
    LabelStore(tmp_path).update({DRAIN_LABEL: "true", "rack": "r1"}, ["zone"])
    (tmp_path / sh.MARKER).write_text("{}\n")
    posted: list[float] = []
    labels = LabelStore(tmp_path)
    rel = sh.Release(labels, str(tmp_path), lambda: posted.append(time.monotonic()))
    assert rel.pending
    assert not rel.after_reconcile("notReady") and not rel.after_reconcile("settling")
    assert not rel.after_reconcile("")  # the gate just opened: decide with the drain a while first
    assert not rel.after_reconcile("")
    assert labels.set[DRAIN_LABEL] == "true" and (tmp_path / sh.MARKER).exists()
    time.sleep(0.25)
    assert posted, "no wake-up asked for when the wait ends"
    assert rel.after_reconcile("") and not rel.pending
    assert not (tmp_path / sh.MARKER).exists()
    on_disk = json.loads((tmp_path / "labels.json").read_text())
    assert on_disk == {"set": {"rack": "r1"}, "unset": ["zone"]}  # dropped, not unset: a static drain shows
    assert LabelStore(tmp_path).apply({DRAIN_LABEL: "static"})[DRAIN_LABEL] == "static"
    assert not rel.after_reconcile("")  # once


def test_without_a_marker_an_operators_drain_stays(tmp_path):
    LabelStore(tmp_path).update({DRAIN_LABEL: "true"})
    rel = sh.Release(LabelStore(tmp_path), str(tmp_path), lambda: None)
    assert not rel.pending and not rel.after_reconcile("")
    assert LabelStore(tmp_path).set == {DRAIN_LABEL: "true"}
