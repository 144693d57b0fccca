"""The layer-2 side of the rule (speaker/nocloudlb/l2/disagree.py): nothing new without quorum, and the
wire as the last word, with the timing of a VIP taken back."""

from __future__ import annotations

import time

from nocloudlb.core.quorum import REASON_NO_QUORUM, REASON_YIELDED_ON_WIRE
from nocloudlb.l2 import disagree
from nocloudlb.l2.disagree import WireRule

MACS = {b"\x02\x00\x00\x00\x00\x02": "n2", b"\x02\x00\x00\x00\x00\x03": "n3"}
N2, N3 = list(MACS)
V1, V2 = "198.51.100.200", "198.51.100.201"


def rule() -> tuple[WireRule, list[int]]:
    posted: list[int] = []
    return WireRule(MACS.get, lambda: posted.append(1)), posted


def test_without_quorum_a_node_keeps_what_it_holds_and_takes_nothing_new():
    w, _posted = rule()
    out = w.hold_back("n1", False, {V1: ["eth0"], V2: ["eth0"]}, announced=[V1], candidates={}, leaders={})
    assert out == {V2: REASON_NO_QUORUM}
    assert w.hold_back("n1", True, {V1: [], V2: []}, announced=[V1], candidates={}, leaders={}) == {}


def test_a_node_without_quorum_yields_on_the_wire_and_takes_it_back_only_with_quorum(monkeypatch):
    w, posted = rule()
    w.contest(V1, N2)
    assert posted and w.pending()
    final = {V1: ["eth0"]}
    out = w.hold_back("n1", False, final, announced=[V1], candidates={V1: ["n1", "n2"]}, leaders={V1: "n1"})
    assert out == {V1: REASON_YIELDED_ON_WIRE} and w.counts["yielded"] == 1
    # later, still without quorum: still yielded, whatever time passed
    monkeypatch.setattr(disagree, "CONTEST_HOLD", 0.0)
    assert w.hold_back("n1", False, final, announced=[], candidates={V1: ["n1", "n2"]}, leaders={}) == \
        {V1: REASON_YIELDED_ON_WIRE}
    # quorum again: the election decides
    assert w.hold_back("n1", True, final, announced=[], candidates={V1: ["n1", "n2"]}, leaders={}) == {}


def test_with_quorum_a_node_keeps_against_a_member_it_holds_ineligible():
    w, _posted = rule()
    w.contest(V1, N3)
    out = w.hold_back("n1", True, {V1: []}, announced=[V1], candidates={V1: ["n1", "n2"]}, leaders={V1: "n1"})
    assert out == {} and w.counts["kept"] == 1


def test_a_vip_yielded_to_a_candidate_is_held_back_for_the_hold_time():
    w, _posted = rule()
    w.contest(V1, N2)
    cands = {V1: ["n2", "n1"]}
    # this node ranks n2 before itself for V1 only if the order says so: make n2 the leader in its view
    out = w.hold_back("n1", True, {V1: []}, announced=[V1], candidates=cands, leaders={V1: "n2"})
    assert out == {V1: REASON_YIELDED_ON_WIRE}
    assert w.next_deadline() is not None and w.next_deadline() > time.monotonic()


def test_frames_from_unknown_macs_are_counted_not_followed():
    w, posted = rule()
    w.contest(V1, b"\x02\xaa\xaa\xaa\xaa\xaa")
    assert not posted and not w.pending() and w.counts["foreign"] == 1


def test_a_flood_of_contests_is_bounded():
    w, _posted = rule()
    for _i in range(disagree.MAX_PENDING + 100):
        w.contest(V1, N2)
    assert len(w._pending) == disagree.MAX_PENDING


def test_quorum_gained_back_settles_before_anything_new_is_taken():
    """Right after a heal the view is stale (gossip still holds some members dead): a node that gained
    quorum back keeps what it holds but takes nothing new for ``settle`` seconds; at start it does not wait."""
    from nocloudlb.core.quorum import REASON_SETTLING

    w, _posted = rule()
    w.settle = 0.3
    final = {V1: [], V2: []}
    assert w.hold_back("n1", False, final, announced=[], candidates={}, leaders={})  # at start, before a view
    assert w.hold_back("n1", True, final, announced=[], candidates={}, leaders={}) == {}  # first quorum: no settling
    assert w.hold_back("n1", False, final, announced=[V1], candidates={}, leaders={}) == {V2: REASON_NO_QUORUM}
    assert w.hold_back("n1", True, final, announced=[V1], candidates={}, leaders={}) == {V2: REASON_SETTLING}
    assert w.settling()
    time.sleep(0.35)
    assert w.hold_back("n1", True, final, announced=[V1], candidates={}, leaders={}) == {}


def test_a_contest_kept_with_quorum_is_judged_again_when_quorum_goes_a_moment_later():
    """Both sides follow the same cut: the new owner's gratuitous ARP may arrive just before this node
    notices it lost quorum. The contest is remembered and judged again at the next apply, not only at
    the other side's next round (a gratuitous-ARP interval later)."""
    w, _posted = rule()
    cands = {V1: ["n1", "n2"]}
    w.contest(V1, N2)
    assert w.hold_back("n1", True, {V1: []}, announced=[V1], candidates=cands, leaders={V1: "n1"}) == {}
    assert w.counts["kept"] == 1
    out = w.hold_back("n1", False, {V1: []}, announced=[V1], candidates=cands, leaders={V1: "n1"})
    assert out == {V1: REASON_YIELDED_ON_WIRE} and w.counts["yielded"] == 1


def test_while_settling_what_a_live_member_hands_over_is_taken_at_once():
    """The old leader back after a heal: the interim owner (alive in its view) hands its VIP back; the
    settling holds back only takeovers from members it does not see alive."""
    w, _posted = rule()
    w.settle = 5.0
    final = {V1: [], V2: []}
    w.hold_back("n1", True, final, announced=[], candidates={}, leaders={})
    w.hold_back("n1", False, final, announced=[], candidates={}, leaders={})
    out = w.hold_back("n1", True, final, announced=[], candidates={}, leaders={}, handed=lambda: [V1])
    assert out == {V2: "quorumSettling"}
