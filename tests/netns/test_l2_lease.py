"""The answering lease on a real segment (one announcer, ``python -m nocloudlb.l2 serve``, no daemon).

- the responder child answers while the lease holds, falls silent by itself when it runs out
  (the child keeps running: nobody stopped it), and answers again at the next renewal;
- the announcer's own answering path (no child has the state) obeys the same lease.

Clients are scapy (who_has_many from test_l2_wire), never our frame code. The speakers' test of the
same thing (a frozen daemon, its peers taking over) is test_speaker_lease.py.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
from netns import L2Agent
from test_l2_responder import _answered_by, _wait  # the responder tests' own helpers
from test_l2_wire import VIP4, VIP6, hold_vips_on_lo

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def netns_prefix() -> str:
    return "lea"


@pytest.fixture
def lab(make_segment):
    seg = make_segment(hosts=1)
    hold_vips_on_lo(seg, seg.hosts[0].ns, [VIP4, VIP6])
    return seg


def test_the_child_answers_only_while_the_lease_holds(lab):
    seg = lab
    n1 = seg.hosts[0]
    a1 = L2Agent(seg, n1.ns, "n1")
    try:
        a1.set({VIP4: [], VIP6: []}, skip_check=[VIP4, VIP6])
        st = _wait(a1, lambda s: s["responder"]["up"])
        child = st["responder"]["pid"]
        assert st["responder"]["lease"] == {"remainingMs": None, "refused": 0}  # open until the first renewal
        assert a1.call(cmd="lease", seconds=60)["held"] == 2
        assert _answered_by(seg, [VIP4, VIP6]) == {VIP4: [n1.mac], VIP6: [n1.mac]}
        # a short lease nobody renews runs out by itself: the child, still running, falls silent
        a1.call(cmd="lease", seconds=0.5)
        time.sleep(1.0)
        assert _answered_by(seg, [VIP4, VIP6]) == {VIP4: [], VIP6: []}
        st = _wait(a1, lambda s: s["responder"]["lease"]["refused"] >= 4)  # 2 requests per address
        assert st["responder"]["pid"] == child and st["responder"]["up"] and os.path.exists(f"/proc/{child}")
        assert st["responder"]["leaseRefused"] >= 4 and st["responder"]["lease"]["remainingMs"] == 0.0
        assert st["requests_received"][VIP4] >= 4 and st["responses_sent"][VIP4] == 2  # refused ones are received
        # renewed: answering again at once, from the same child
        a1.call(cmd="lease", seconds=60)
        assert _answered_by(seg, [VIP4, VIP6]) == {VIP4: [n1.mac], VIP6: [n1.mac]}
        assert a1.stats()["responder"]["pid"] == child
    finally:
        a1.stop()


def test_the_announcers_own_answering_obeys_the_lease(lab):
    seg = lab
    n1 = seg.hosts[0]
    # a "responder" that exits at once, every time: the announcer answers itself
    a1 = L2Agent(seg, n1.ns, "n1", responder_argv=[sys.executable, "-c", "raise SystemExit(3)"])
    try:
        a1.set({VIP4: [], VIP6: []}, skip_check=[VIP4, VIP6])
        _wait(a1, lambda s: s["responder"]["restarts"] >= 1 and s["responder"]["answeringInDaemon"])
        a1.call(cmd="lease", seconds=60)
        assert _answered_by(seg, [VIP4, VIP6]) == {VIP4: [n1.mac], VIP6: [n1.mac]}
        a1.call(cmd="lease", seconds=0)
        assert _answered_by(seg, [VIP4, VIP6]) == {VIP4: [], VIP6: []}
        st = a1.stats()
        assert st["responder"]["answeringInDaemon"] and st["responder"]["lease"]["refused"] >= 4
        a1.call(cmd="lease", seconds=60)
        assert _answered_by(seg, [VIP4, VIP6]) == {VIP4: [n1.mac], VIP6: [n1.mac]}
    finally:
        a1.stop()
