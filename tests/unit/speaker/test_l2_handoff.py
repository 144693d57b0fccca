"""Which lost VIPs the layer-2 mode hands off (l2/handoff.py): only a planned move to a member seen alive,
with quorum and that member's MACs known; everything else is withdrawn at once (fail closed)."""

from __future__ import annotations

import pytest
from nocloudlb.core.quorum import REASON_YIELDED_ON_WIRE
from nocloudlb.l2.handoff import HANDOFF_MAX, handoffs
from nocloudlb.l2.rows import VipRow

MAC2, MAC3 = b"\x02\x00\x00\x00\x00\x02", b"\x02\x00\x00\x00\x00\x03"
MACS = {"n2": (MAC2,), "n3": (MAC3,)}
STATES = {"n1": "alive", "n2": "alive", "n3": "alive"}


def row(ip: str, leader: str | None, reason: str = "notOwner", service: str = "ns/a") -> VipRow:
    return VipRow(ip, service, "default", leader, False, reason, [], True)


@pytest.mark.parametrize(("case", "rows", "states", "macs", "quorum", "want"), [
    ("drained: the next node takes it", [row("ip1", "n2", "drained")], STATES, MACS, True, {"ip1": (MAC2,)}),
    ("the leader is back (undrain, restart)", [row("ip1", "n3")], STATES, MACS, True, {"ip1": (MAC3,)}),
    ("the taker is only suspected", [row("ip1", "n2")], {**STATES, "n2": "unreachable"}, MACS, True, {}),
    ("the taker is dead", [row("ip1", "n2")], {**STATES, "n2": "dead"}, MACS, True, {}),
    ("the taker publishes no MAC", [row("ip1", "n2")], STATES, {"n3": (MAC3,)}, True, {}),
    ("nobody leads it", [row("ip1", None, "noEligibleNode")], STATES, MACS, True, {}),
    ("still this node's, failing closed", [row("ip1", "n1", "notReady")], STATES, MACS, True, {}),
    ("the wire rule made it yield", [row("ip1", "n2", REASON_YIELDED_ON_WIRE)], STATES, MACS, True, {}),
    ("no quorum", [row("ip1", "n2")], STATES, MACS, False, {}),
    ("a shared VIP whose rows agree", [row("ip1", "n2"), row("ip1", "n2", service="ns/b")], STATES, MACS, True,
     {"ip1": (MAC2,)}),
    ("a shared VIP one of whose rows fails closed", [row("ip1", "n2"), row("ip1", "n1", "notReady", "ns/b"),
                                                     row("ip1", "n2", service="ns/c")], STATES, MACS, True, {}),
    ("a VIP not lost is not looked at", [row("ip9", "n2")], STATES, MACS, True, {}),
])
def test_handoffs(case, rows, states, macs, quorum, want):
    assert handoffs(["ip1"], rows, "n1", states, macs, quorum) == want, case


def test_the_bound_outlasts_the_takers_longest_wait():
    from nocloudlb.l2.forwarding import HANDOVER_WAIT
    from nocloudlb.l2.handoff import MEMBER_WAIT
    assert HANDOFF_MAX > HANDOVER_WAIT and HANDOFF_MAX > MEMBER_WAIT
