"""A frozen daemon's responder falls silent by itself: the lease (l2/lease.py) the daemon renews.

Three real speakers (``fast``: heartbeats 25 ms x 4, lease 0.3 s; ``lan``: 150 ms x 4, lease
1.2 s) and a client on one bridge. The
leader of a VIP has its *daemon* PID stopped (SIGSTOP), not its responder child, which keeps
running: the peers stop hearing the daemon's heartbeats and the next node takes the VIP. A sampler
in the client asks who has the VIP every 50 ms with a broadcast ARP request and records every MAC
that answers it (a reply to the client; gratuitous frames do not count). The test asserts:

- the frozen node's MAC stops answering within the lease and a margin, although its child runs;
- the next node in the VIP's order answers meanwhile;
- after SIGCONT, once the thaw has settled, at most one MAC answers every sample, and the VIP ends
  with its elected leader, answered by it alone.

Before the lease (the child stopped only when its stdin closed) the frozen node's child answered
for the whole freeze: two MACs for seconds.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest
from netns import Segment
from nocloudlb.core.election import election_order
from speaker_harness import ClientLines, SpeakerCluster, pool_docs, service_doc, spread_vips

pytestmark = pytest.mark.timeout(120)
NODES = ["n1", "n2", "n3"]
LEASES = {"fast": 0.3, "lan": 1.8}  # 3 heartbeat timeouts: 3 x 25 ms x 4, 3 x 150 ms x 4
MARGIN = 0.5  # a loaded 2-core machine: the child's check is exact, the scheduling of the frozen node is not
FREEZE = 4.0
PERIOD = 0.05

SAMPLER = r"""
import json, select, sys, time
from nocloudlb.l2 import arp
from nocloudlb.l2.probe import Prober
ip, period, until = sys.argv[1], float(sys.argv[2]), time.time() + float(sys.argv[3])
with Prober("eth0") as p:
    while time.time() < until:
        packed, sent = p.request(ip)
        macs, end = set(), sent / 1e9 + period * 0.8
        while (left := end - time.time()) > 0:
            if not select.select([p.sock], [], [], left)[0]:
                break
            while True:
                try:
                    data = p.sock.recv(2048)
                except BlockingIOError:
                    break
                pkt = arp.parse(data)
                # an answer to this client: a reply from the VIP, sent to our MAC (gratuitous frames go to broadcast)
                if pkt is not None and pkt.op == arp.OP_REPLY and pkt.spa == packed and pkt.eth_dst == p.mac:
                    macs.add(arp.mac_str(pkt.sha))
        print(json.dumps({"t": sent / 1e9, "m": sorted(macs)}), flush=True)
        time.sleep(max(0.0, sent / 1e9 + period - time.time()))
"""


class Sampler(ClientLines):
    """Who answers ARP for ``ip`` at the client, every ``period`` s: samples of {t, m: [mac, ...]}."""

    def __init__(self, seg: Segment, ip: str, seconds: float, period: float = PERIOD) -> None:
        super().__init__(seg, [sys.executable, "-u", "-c", SAMPLER, ip, str(period), str(seconds)])

    def between(self, t0: float, t1: float) -> list[dict]:
        return [s for s in list(self.samples) if t0 <= s["t"] < t1]


def proc_state(pid: int) -> str:
    """The one-letter state of ``pid`` (R, S, T = stopped, ...), from /proc."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def windows(samples: list[dict], pred) -> list[tuple[float, float]]:
    """Runs of consecutive samples for which ``pred(sample)`` holds: (first t, last t) each."""
    out: list[tuple[float, float]] = []
    start = last = None
    for s in samples:
        if pred(s):
            start = s["t"] if start is None else start
            last = s["t"]
        elif start is not None:
            out.append((start, last))
            start = None
    if start is not None:
        out.append((start, last))
    return out


def longest(ws: list[tuple[float, float]]) -> float:
    return max((b - a for a, b in ws), default=0.0)


@pytest.fixture
def netns_prefix() -> str:
    return "nle"


@pytest.mark.parametrize("profile", ["fast", "lan"])
def test_frozen_daemons_responder_stops_answering_within_the_lease(make_segment, tmp_path, profile):
    lease = LEASES[profile]
    vips = spread_vips(NODES)
    docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
    c = SpeakerCluster(make_segment(hosts=3), tmp_path, profile=profile, resources=docs)
    c.start_all()
    ip = next(ip for ip, leader in vips.items() if leader == "n1")
    first, second = election_order(NODES, ip)[:2]
    mac1, mac2 = c.mac(first), c.mac(second)
    child = c.status(first)["modes"]["l2"]["responder"]["pid"]
    daemon = c.procs[first].pid
    assert child and child != daemon

    sampler = Sampler(c.seg, ip, 60.0)
    try:
        c.wait(lambda: len([s for s in sampler.samples if s["m"] == [mac1]]) >= 10, 15, f"{first} answering {ip}")
        t_stop = c.send_signal(first, signal.SIGSTOP)
        time.sleep(0.5)
        assert proc_state(daemon) == "T" and proc_state(child) in "RS", (proc_state(daemon), proc_state(child))
        time.sleep(FREEZE - 0.5)
        assert proc_state(child) in "RS"  # the child ran through the freeze: only the lease silenced it
        t_cont = c.send_signal(first, signal.SIGCONT)
        # the thaw settles: the VIP back with its elected leader, answered by it alone
        c.wait(lambda: all(c.members_alive(n) == set(NODES) for n in NODES), 20, "membership whole again")
        c.wait(lambda: c.vip(first, ip)["announcing"] and not c.announcing(second, ip), 15,
               f"{ip} back at {first} only (status)")
        c.wait(lambda: [s["m"] for s in sampler.samples[-3:]] == [[mac1]] * 3, 10, f"{ip} answered by {first} alone")
        t_settled = sampler.samples[-3]["t"]
        time.sleep(2.0)
        t_end = time.time()
    finally:
        sampler.stop()

    frozen = sampler.between(t_stop, t_cont)
    assert len(frozen) > FREEZE / PERIOD / 2, f"too few samples during the freeze: {len(frozen)}"
    last1 = max((s["t"] for s in frozen if mac1 in s["m"]), default=t_stop)
    first2 = min((s["t"] for s in frozen if mac2 in s["m"]), default=None)
    two = windows(frozen, lambda s: len(s["m"]) > 1)
    none = windows(frozen, lambda s: not s["m"])
    thawed = sampler.between(t_cont, t_end)
    two_after = windows(thawed, lambda s: len(s["m"]) > 1)
    none_after = windows(thawed, lambda s: not s["m"])
    report = {"frozenAnsweredMs": round((last1 - t_stop) * 1000), "profile": profile, "leaseMs": lease * 1000,
              "takeoverMs": None if first2 is None else round((first2 - t_stop) * 1000),
              "twoOwnersMs": round(longest(two) * 1000), "noOwnerMs": round(longest(none) * 1000),
              "afterThaw": {"twoOwnersMs": round(longest(two_after) * 1000), "twoOwnerSamples":
                            sum(1 for s in thawed if len(s["m"]) > 1), "noOwnerMs": round(longest(none_after) * 1000),
                            "settledAfterMs": round((t_settled - t_cont) * 1000)},
              "samples": len(sampler.samples)}
    print("lease window:", json.dumps(report))
    (tmp_path / "samples.json").write_text(json.dumps(sampler.samples))
    assert last1 - t_stop <= lease + MARGIN, report  # the frozen node fell silent within the lease
    assert first2 is not None and any(s["m"] == [mac2] for s in frozen), report  # the next node answered
    assert all(s["m"] == [mac2] for s in frozen if s["t"] > t_stop + lease + MARGIN), report
    # after the thaw has settled, at most one MAC at every sample, and it is the elected leader's
    settled = sampler.between(t_settled, t_end)
    assert settled and all(s["m"] == [mac1] for s in settled), report
    assert longest(two_after) <= 1.0, report
    stalls = list(c.events(first, "l2LeaseStalled"))
    renewed = list(c.events(first, "l2LeaseRenewed"))
    assert stalls and renewed, (stalls, renewed)
    assert os.path.exists(f"/proc/{child}")
