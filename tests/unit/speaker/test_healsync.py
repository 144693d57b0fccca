"""healsync.heal_sync: which members exchange full state with one that came back (table tests)."""

from __future__ import annotations

import math

import pytest
from nocloudlb.healsync import HEAL_SYNC_K, first, heal_sync


def names(n: int) -> list[str]:
    return [f"node-{i:03d}" for i in range(n)]


@pytest.mark.parametrize(("me", "member", "alive", "expected"), [
    ("a", "a", ["a", "b"], False),          # never with itself
    ("a", "b", ["a"], True),                # alone in its view: the first member back is a partner
    ("a", "b", [], True),                   # names come from the pair itself too
    ("a", "b", ["a", "b", "c"], True),      # three members: everyone pairs (k = 2)
    ("c", "b", ["a", "b", "c"], True),
])
def test_small_views(me, member, alive, expected):
    assert heal_sync(me, member, alive) is expected


def test_symmetric_and_the_same_on_every_node():
    members = names(40)
    for a in members[:10]:
        for b in members:
            assert heal_sync(a, b, members) == heal_sync(b, a, members)
    assert first("node-007", members) == first("node-007", list(reversed(members)))
    assert "node-007" not in first("node-007", members, 40) and len(first("node-007", members, 40)) == 39


@pytest.mark.parametrize("n", [10, 40, 300])
def test_a_return_costs_about_2k_exchanges_whatever_n(n):
    """Per member coming back, the members that exchange with it: about 2k on average, a small bound
    at worst, never one per member (the storm)."""
    members = names(n)
    returning = members[:: max(1, n // 10)]  # 10 of them: the distribution, at a unit test's cost
    counts = [sum(heal_sync(me, m, members) for me in members) for m in returning]
    assert all(c >= HEAL_SYNC_K for c in counts)  # its own first k always exchange with it
    assert sum(counts) / len(counts) <= 2 * HEAL_SYNC_K + 0.5, counts
    assert max(counts) <= 5 * HEAL_SYNC_K, counts


def test_a_node_that_held_everyone_dead_exchanges_as_they_come_back():
    """The one-sided merge: the isolated node sees its peers come back one by one; the first one back
    is always among its partners, so it hears the rumour of its own death within a round trip."""
    members = names(40)
    me, seen = members[0], [members[0]]
    partners = []
    for m in members[1:]:
        seen.append(m)
        if heal_sync(me, m, seen):
            partners.append(m)
    # and not with every one of them: each newcomer pairs with it with probability about 2k / (members seen),
    # about 2k ln N in all (here 16 of 39)
    assert partners[0] == members[1] and len(partners) <= 3 * HEAL_SYNC_K * math.log(len(members)), partners
