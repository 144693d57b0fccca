"""The reconcile's comparison and repair schedule, and the frr.conf edits of a withdrawal (pure)."""

from __future__ import annotations

import pytest
from nocloudlb.bgp.reconcile import Diff, PeerView, Reconciler, advertised_command, advertised_prefixes, diff
from nocloudlb.bgp.render import strip_networks

VIEW = PeerView("r1", "198.51.100.1", "", 64512, "ipv4", frozenset({"203.0.113.10/32"}),
                frozenset({"203.0.113.10/32"}))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(rounds: list[set[str]], clock: Clock | None = None, step: float = 0.5) -> list[tuple[int, Diff]]:
    """Feed one advertised set per round; return the repairs made (step, difference)."""
    clock = clock or Clock()
    answers = iter(rounds)
    acts: list[tuple[int, Diff]] = []
    rec = Reconciler(lambda view: next(answers), lambda view, level, found: acts.append((level, found)),
                     clock=clock)
    for _answer in rounds:
        rec.check([VIEW])
        clock.now += step
    return acts


@pytest.mark.parametrize("rounds, steps", [
    ([{"203.0.113.10/32"}] * 4, []),  # agrees: nothing to do
    ([{"203.0.113.10/32", "203.0.113.11/32"}], []),  # seen once: maybe still on its way
    ([set(), {"203.0.113.10/32"}, set()], []),  # never twice in a row
    ([{"203.0.113.10/32", "203.0.113.11/32"}] * 2, [1]),
    ([{"203.0.113.10/32", "203.0.113.11/32"}] * 6, [1, 2, 3]),  # one step further each time it stays
    ([{"203.0.113.10/32", "203.0.113.11/32"}] * 2 + [{"203.0.113.10/32"}] + [set()] * 2, [1, 1]),  # reset
])
def test_a_difference_is_repaired_once_confirmed_and_escalates(rounds, steps):
    assert [level for level, _found in run(rounds)] == steps


def test_hard_reset_at_most_once_per_period():
    acts = run([{"203.0.113.10/32", "203.0.113.11/32"}] * 14, step=1.0)
    assert [level for level, _found in acts] == [1, 2, 3, 2, 2, 2, 2]  # 30 s between hard resets
    later = run([{"203.0.113.10/32", "203.0.113.11/32"}] * 70, step=1.0)
    assert [level for level, _found in later].count(3) == 3  # at 5 s, 35 s and 65 s


def test_diff_and_answers():
    found = diff({"203.0.113.10/32", "203.0.113.12/32"}, {"203.0.113.10/32", "203.0.113.11/32"})
    assert found.as_dict() == {"missing": ["203.0.113.12/32"], "extra": ["203.0.113.11/32"]}
    assert not diff(set(), set())
    assert advertised_prefixes({"advertisedRoutes": {"203.0.113.10/32": {}}, "totalPrefixCounter": 1}) == {
        "203.0.113.10/32"}
    assert advertised_prefixes({}) == set() and advertised_prefixes("garbage") == set()
    assert advertised_command(VIEW) == "show bgp ipv4 unicast neighbors 198.51.100.1 advertised-routes json"
    vrf = PeerView("r2", "swp1", "red", 64513, "ipv6", frozenset())
    assert advertised_command(vrf) == "show bgp vrf red ipv6 unicast neighbors swp1 advertised-routes json"


CONF = """frr defaults traditional
!
router bgp 64512
 no bgp default ipv4-unicast
 !
 address-family ipv4 unicast
  network 203.0.113.10/32
  network 203.0.113.11/32
  neighbor 198.51.100.1 activate
 exit-address-family
 !
 address-family ipv6 unicast
  network 2001:db8::10/128
 exit-address-family
exit
!
router bgp 64512 vrf red
 !
 address-family ipv4 unicast
  network 203.0.113.10/32
 exit-address-family
exit
!
ip prefix-list x seq 5 permit 203.0.113.10/32
end
"""


def test_strip_networks_removes_only_under_their_own_router_and_family():
    out = strip_networks(CONF, {("", 64512): {"ipv4": ["203.0.113.10/32"], "ipv6": ["203.0.113.11/32"]}})
    assert out == CONF.replace("  network 203.0.113.10/32\n  network 203.0.113.11/32\n",
                               "  network 203.0.113.11/32\n", 1)
    assert "router bgp 64512 vrf red\n !\n address-family ipv4 unicast\n  network 203.0.113.10/32" in out
    assert "prefix-list x seq 5 permit 203.0.113.10/32" in out
    both = strip_networks(CONF, {("red", 64512): {"ipv4": ["203.0.113.10/32"]},
                                 ("", 64512): {"ipv6": ["2001:db8::10/128"]}})
    assert "2001:db8::10/128" not in both and both.count("network 203.0.113.10/32") == 1
    assert strip_networks(CONF, {}) == CONF


def test_a_young_session_counts_only_what_should_not_be_there():
    young = PeerView("r1", "198.51.100.1", "", 64512, "ipv4", frozenset({"203.0.113.10/32"}), missing_counts=False)
    acts: list[tuple[int, Diff]] = []
    answers = iter([set(), set(), {"203.0.113.11/32"}, {"203.0.113.11/32"}])
    rec = Reconciler(lambda view: next(answers), lambda view, level, found: acts.append((level, found)))
    for _check in range(4):
        rec.check([young])
    assert acts == [(1, Diff(extra=frozenset({"203.0.113.11/32"})))]
