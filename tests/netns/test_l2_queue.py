"""Re-announce storms (issue 8, defect 13), on real sockets in a namespace: frames of a superseded
gratuitous schedule never leave, and each interface's transmit queue is bounded."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(60)

SUPERSEDED = r"""
import json, logging, time
from nocloudlb.l2.announcer import L2Announcer
# 2 frames/s, no burst, one round per schedule: frames queue up behind the pacing
a = L2Announcer("n1", logging.getLogger("t"), garp_rounds=1, rate=2, burst=1, registry=None)
a.start()
try:
    a.set_announced({"198.51.100.200": []}, skip_check=["198.51.100.200"])
    time.sleep(0.05)
    for _dummy in range(3):  # three heals in a row: each replaces the schedule in progress
        a.reannounce(["198.51.100.200"])
        time.sleep(0.05)
    time.sleep(5.0)  # time enough for 10 frames at 2/s
    st = a.stats()
    print(json.dumps({"sent": st["gratuitous_sent"].get("198.51.100.200", 0), "queued": st["queued"]}))
finally:
    a.stop()
"""

BOUNDED = r"""
import json, logging, time
from nocloudlb.l2.announcer import L2Announcer
a = L2Announcer("n1", logging.getLogger("t"), garp_rounds=1, rate=1, burst=1, registry=None, max_queue=16)
a.start()
try:
    ips = [f"198.51.100.{i}" for i in range(100, 160)]
    a.set_announced({ip: [] for ip in ips}, skip_check=ips)
    time.sleep(0.5)
    st = a.stats()
    print(json.dumps({"queued": st["queued"], "announced": len(st["announced"])}))
finally:
    a.stop()
"""


def test_superseded_gratuitous_frames_are_dropped(make_segment):
    seg = make_segment(hosts=1, client=False)
    out = seg.python_json(seg.hosts[0].ns, SUPERSEDED)
    # one frame of the first schedule left at once; the last schedule's 2 frames follow. The three
    # replaced schedules' frames (6 more) must not leave.
    assert out["sent"] <= 4, out
    assert out["sent"] >= 2, out


def test_transmit_queue_is_bounded(make_segment):
    seg = make_segment(hosts=1, client=False)
    out = seg.python_json(seg.hosts[0].ns, BOUNDED)
    assert out["announced"] == 60  # every VIP is answered; only the paced announcements are capped
    assert max(out["queued"].values()) <= 16, out
