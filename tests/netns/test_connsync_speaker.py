"""Connection sync inside real speakers: held connections survive a kill -9 of the owner (root only).

Two ``nocloudlb speaker`` processes (directors n1, n2) with a full-NAT Backends object (round robin,
real servers n3, n4) and ``connectionSync`` enabled; conntrackd in FTFW between them over a second
veth pair (conn_survival.Sync). A client holds 20 TCP connections through the VIP, a line every
100 ms each. The owner fails as in conn_survival.move (kill -9 of its speaker and of its conntrackd,
then its IP forwarding off); the survivor's speaker takes the VIP over and, before its first
gratuitous ARP, commits what its conntrackd received (``conntrackd -c``).

Round robin is the scheduler that needs the state: without it a mid-stream packet goes to whichever
server comes next, which resets it (test_conn_survival's control case: about half are lost).

The replies must follow the VIP as well. Full-NAT's ``snatAddress`` is the VIP itself here: the real
servers answer the VIP, which they find by ARP on the segment, so the new owner's gratuitous ARP moves
their replies along with the client's traffic, and no floating gateway is needed (NAT's real servers
would need one that moves with the VIP, which the speaker does not hold).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conn_survival import LOAD_CODE, Sync
from dataplane_harness import VIP, backends_of, prepare, resources
from nocloudlb.dataplane.connsync import SKIP_AFTER
from speaker_harness import Capture, SpeakerCluster

pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(not (shutil.which("conntrackd") and shutil.which("conntrack")),
                                 reason="conntrackd and conntrack (conntrack-tools) are not installed")]

HELD = 20


@pytest.fixture
def netns_prefix() -> str:
    return "ncy"


@pytest.mark.parametrize(("enabled", "hung"), [(True, False), (False, False), (True, "now"), (True, "before")],
                         ids=["sync", "control", "hung", "hung-seen"])
def test_a_killed_owner_loses_no_held_connection_with_connection_sync(make_segment, tmp_path, enabled, hung):
    """``control``: conntrackd runs and syncs as well, but the speaker does not commit: the held connections
    that round robin sends to the other server are reset (about half typically; how many is chance).
    ``hung``: the survivor's conntrackd is stopped (SIGSTOP) as the owner dies: the commit is killed at
    its timeout and the takeover goes on without the state, late by that timeout only. ``hung-seen``:
    stopped long enough before for the survivor's health checks to miss it twice: the commit is not
    tried (``skipped``) and the takeover is not late at all."""
    seg = make_segment(hosts=2)
    docs = resources("fullnat", "rr", ports=((80, "TCP"),), snatAddress=VIP)
    cluster = SpeakerCluster(seg, tmp_path, resources=docs, memberlist_extra={"witness": seg.client.ipv4})
    sync = Sync(seg, str(tmp_path))  # n1 ~ n2 over sync0
    sync.last_cpu = {}
    for i, name in enumerate(cluster.names):  # before the servers are attached: they are no members
        cluster.write_config(name, cluster.config(name, connectionSync={
            "enabled": enabled, "socket": f"{sync.root}/d{i}.ctl", "binary": shutil.which("conntrackd"),
            "commitTimeout": 0.3}))
    seg.attach("n3", ["198.51.100.13/24"])
    seg.attach("n4", ["198.51.100.14/24"])
    prepare(seg, "fullnat")
    try:
        cluster.start_all()
        leader = next(n for n in cluster.names if cluster.announcing(n, VIP))
        other = next(n for n in cluster.names if n != leader)
        li, oi = cluster.names.index(leader), cluster.names.index(other)

        def programmed(name: str) -> bool:
            dp = (cluster.try_status(name) or {}).get("modes", {}).get("dataplane", {})
            return len([b for b in backends_of(dp) if b["inTable"]]) == 2

        for n in cluster.names:
            cluster.wait(lambda n=n: programmed(n), 20, f"{n} programs the data plane")
        if enabled:
            cluster.wait(lambda: (cluster.status(other)["connectionSync"]).get("peer") == "up", 15,
                         f"{other} sees its sync peer up")
            before = cluster.status(other)["connectionSync"]["commits"]

        load = seg.popen(seg.client.ns, [sys.executable, "-u", "-c", LOAD_CODE, VIP, str(HELD), "8", "5", "5"],
                         stdin=subprocess.DEVNULL)
        assert load.stdout is not None
        ready = load.stdout.readline().split()
        assert ready == ["ready", str(HELD)], (ready, load.stderr.read() if load.stderr else "")
        cluster.wait(lambda: sync.external(oi) >= HELD, 10, f"{other}'s conntrackd holds the {HELD} flows")
        cap = Capture(seg, tmp_path / "arp.txt", "arp")
        time.sleep(1.0)

        if hung:
            sync.procs[oi].send_signal(signal.SIGSTOP)  # the conntrackd we started, by its PID
        if hung == "before":
            cluster.wait(lambda: cluster.status(other)["connectionSync"]["missedChecks"] >= SKIP_AFTER, 15,
                         f"{other}'s health checks missing its conntrackd {SKIP_AFTER} times")
        killed = cluster.stop(leader, signal.SIGKILL)
        sync.kill(li)
        seg.run(cluster.host(leader).ns, "sysctl -qw net.ipv4.ip_forward=0")  # a dead node forwards nothing
        try:
            cluster.wait(lambda: cluster.announcing(other, VIP), 20, f"{other} takes {VIP} over")
        except AssertionError:  # what held it back
            print(json.dumps(cluster.vip(other, VIP)), cluster.logs[other].read_text()[-4000:])
            raise

        out, err = load.communicate(timeout=40)
        result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err}
        st = cluster.status(other)["connectionSync"]
        garps = cap.gratuitous(VIP, cluster.mac(other), after=killed)
        seg.kill(cap.proc)
        assert result.get("established") == HELD, result
        if not enabled:
            assert st == {"enabled": False}, st
            # how many is chance: the new director's round robin sends each mid-stream packet to the next
            # server in the order they come; about half typically, 0-16 of 20 seen (0 in one CI run)
            assert result["broken"] <= 17 and set(result["why"]) <= {"ConnectionResetError"}, result
            print(f"\ncontrol: {result['broken']} of {HELD} held connections reset")
            return

        last = st["lastCommit"]
        if hung == "before":
            sync.procs[oi].send_signal(signal.SIGCONT)
            assert st["commits"]["skipped"] == before["skipped"] + 1 and st["commits"]["timeout"] == 0, st
            assert last["result"] == "skipped" and last["seconds"] < 0.05, st
            assert garps and last["at"] <= garps[0]["ts"], (last, garps)
            print(f"\nconntrackd seen hung: commit skipped in {last['seconds']} s, takeover "
                  f"{garps[0]['ts'] - killed:.3f} s after the kill, {result['broken']} of {HELD} reset")
            return
        if hung:
            sync.procs[oi].send_signal(signal.SIGCONT)
            assert st["commits"]["timeout"] == before["timeout"] + 1, st
            assert last["result"] == "timeout" and 0.3 <= last["seconds"] < 0.6, st
            assert garps and last["at"] <= garps[0]["ts"], (last, garps)
            assert garps[0]["ts"] - killed < 3.0, (garps[0]["ts"] - killed)
            print(f"\nhung conntrackd: commit killed after {last['seconds']} s, takeover "
                  f"{garps[0]['ts'] - killed:.3f} s after the kill, {result['broken']} of {HELD} reset")
            return
        assert st["commits"]["ok"] == before["ok"] + 1, st
        assert last["result"] == "ok" and VIP in last["vips"] and last["seconds"] < 0.3, st
        assert garps, cap.lines()[-20:]
        # the commit ended before the first gratuitous ARP of the takeover left
        assert last["at"] <= garps[0]["ts"], (last, garps[0])
        assert result["broken"] == 0 and result["stalled"] == 0, result
        assert result["switched"] == 0, result  # each connection stayed on its real server
        events = cluster.events(other, "connSyncCommitted")
        assert events and events[-1]["result"] == "ok", events
        print(f"\ncommit {last['seconds']} s, first GARP {garps[0]['ts'] - last['at']:.4f} s after it, "
              f"takeover {garps[0]['ts'] - killed:.3f} s after the kill, stallMax {result['stallMax']:.3f} s")
    finally:
        sync.close()
