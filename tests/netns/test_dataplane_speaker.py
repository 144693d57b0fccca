"""The data plane inside real speakers: two ``nocloudlb speaker`` processes (directors n1, n2)
with a Backends object, two DR real servers, a client that finds the VIP by ARP (root only).

The speaker elects the VIP's leader and answers ARP; both speakers program the same
forwarding. When the leader's speaker is killed, the other takes the VIP over and the client's
established connections go on, to the same real servers (Maglev over DR).
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from dataplane_harness import CLIENT, HOLD_CODE, VIP, backends_of, prepare, requests, resources, spread
from speaker_harness import SpeakerCluster

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def netns_prefix() -> str:
    return "nds"


def test_speakers_forward_dr_maglev_and_a_takeover_keeps_connections(make_segment, tmp_path):
    seg = make_segment(hosts=2)
    docs = resources("dr", "maglev", ports=((80, "TCP"),))
    # two nodes: the client votes in the quorum as witness, so the survivor of a kill -9 takes over
    cluster = SpeakerCluster(seg, tmp_path, resources=docs, memberlist_extra={"witness": seg.client.ipv4})
    seg.attach("n3", ["198.51.100.13/24"])
    seg.attach("n4", ["198.51.100.14/24"])
    prepare(seg, "dr")
    cluster.start_all()
    leader = next(n for n in cluster.names if cluster.announcing(n, VIP))
    other = next(n for n in cluster.names if n != leader)

    def programmed(name: str) -> bool:
        st = cluster.try_status(name) or {}
        dp = st.get("modes", {}).get("dataplane", {})
        return len([b for b in backends_of(dp) if b["inTable"]]) == 2

    for n in cluster.names:  # every eligible node is programmed, not only the leader
        cluster.wait(lambda n=n: programmed(n), 20, f"{n} programs the data plane")
    answers = requests(seg, 12)
    assert set(spread(answers)) == {"n3", "n4"}, answers
    assert {a.split()[1] for a in answers} == {CLIENT}
    held = []
    for i in range(6):
        p = seg.popen(seg.client.ns, [sys.executable, "-u", "-c", HOLD_CODE, VIP, str(32000 + i), "5"],
                      stdin=subprocess.PIPE)
        held.append((p, p.stdout.readline().strip()))
    assert all(first in ("n3", "n4") for _p, first in held), held
    cluster.stop(leader, signal.SIGKILL)
    cluster.wait(lambda: cluster.announcing(other, VIP), 20, f"{other} takes {VIP} over")
    after = []
    for p, _first in held:
        p.stdin.write("x\n")
        p.stdin.flush()
        after.append(p.stdout.readline().strip())
    # same real server for every established connection: Maglev gives the survivor the same choice,
    # and while the killed speaker is only suspected (heartbeats stopped) its packets may also go on
    # through the handover forwarding toward the old owner, whose kernel still forwards them
    assert after == [first for _p, first in held]
    assert set(spread(requests(seg, 8))) == {"n3", "n4"}
    st = cluster.status(other)["modes"]["dataplane"]
    assert sum(b["packets"] for b in backends_of(st)) > 0  # new connections: the survivor forwards them
