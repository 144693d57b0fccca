# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rule for disagreement (nocloudlb.core.quorum): quorum, and who yields on the wire. Table tests."""

from __future__ import annotations

import pytest
from nocloudlb.core.quorum import contest_yields, has_quorum, quorum_total


@pytest.mark.parametrize(("connected", "configured", "known", "witness", "witness_up", "expected"), [
    (0, 1, 1, False, False, True),     # a cluster of one
    (2, 3, 3, False, False, True),     # everyone
    (1, 3, 3, False, False, True),     # two of three: the majority after a crash
    (0, 3, 3, False, False, False),    # alone of three: cut off, or the last survivor
    (0, 3, 1, False, False, False),    # an isolated boot: gossip knows only itself, the join list says three
    (1, 4, 4, False, False, False),    # two of four: an even split has no majority
    (2, 4, 4, False, False, True),     # three of four
    (1, 2, 2, False, False, True),     # both nodes of two
    (0, 2, 2, False, False, False),    # one of two, no witness: takes nothing
    (0, 2, 2, True, True, True),       # one of two and the witness: two votes of three
    (0, 2, 2, True, False, False),     # one of two, the witness silent
    (1, 3, 5, False, False, False),    # the cluster grew past its join lists: five votes count
    (-3, 3, 3, False, False, False),   # nonsense in: no quorum out
])
def test_quorum(connected, configured, known, witness, witness_up, expected):
    assert has_quorum(connected, configured, known, witness, witness_up) is expected


def test_total_counts_the_witness_and_never_less_than_one():
    assert quorum_total(0, 0, False) == 1
    assert quorum_total(2, 2, True) == 3
    assert quorum_total(3, 5, False) == 5


ORDER = ["a", "b", "c"]  # the VIP's election order as this node computes it


@pytest.mark.parametrize(("me", "other", "quorum", "candidates", "expected"), [
    ("a", "b", False, ["a", "b", "c"], True),   # no quorum: yield, whoever announces
    ("b", "c", False, [], True),
    ("a", "b", True, ["a", "b", "c"], False),   # with quorum, to a candidate ranked after it: keep
    ("b", "a", True, ["a", "b", "c"], True),    # to a candidate ranked before it: yield (the election agrees)
    ("b", "a", True, ["b", "c"], False),        # to a member it holds ineligible (no quorum, unreachable): keep
    ("c", "x", True, ["c"], False),             # to a member it does not know: keep
])
def test_who_yields_on_the_wire(me, other, quorum, candidates, expected):
    assert contest_yields(me, other, quorum, ORDER, candidates) is expected


def test_the_two_sides_of_a_contest_never_both_keep_when_both_have_quorum_and_agree():
    for x in ORDER:
        for y in ORDER:
            if x != y:
                keeps = [not contest_yields(me, other, True, ORDER, ORDER) for me, other in ((x, y), (y, x))]
                assert keeps.count(True) == 1, (x, y)
