"""Graceful stop on the wire (issue 8, defect 15): the leaving leader stops answering before its
successor announces, so a stop costs a few milliseconds of no answer and never two answers.

Three real speakers on one bridge (lan profile), a client that sends an ARP request for the VIP
every 2 ms and records every answer (MAC, time) and every gratuitous ARP. SIGTERM to the leader,
three times per variant (it is restarted and takes its VIP back in between). After the successor's first
gratuitous ARP, no answer may come from the old leader's MAC.
"""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest
from nocloudlb.core.election import election_order
from speaker_harness import SpeakerCluster, pool_docs, service_doc, spread_vips

pytestmark = pytest.mark.timeout(240)
NODES = ["n1", "n2", "n3"]
ROUNDS = 3

#: Runs in the client's namespace: ARP requests for argv[1] every 2 ms for argv[2] s; prints one JSON
#: line per answer to us ("answer") and per gratuitous ARP ("garp") with its sender MAC and time.
FLOOD = r"""
import json, select, socket, struct, sys, time
ip, seconds = sys.argv[1], float(sys.argv[2])
tpa = socket.inet_aton(ip)
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind(("eth0", 0x0806))
mac = s.getsockname()[4][:6]
spa = socket.inet_aton("198.51.100.2")
req = (b"\xff" * 6 + mac + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + spa
       + b"\x00" * 6 + tpa).ljust(60, b"\x00")
end = time.time() + seconds
nxt = time.time()
print(json.dumps({"kind": "start", "t": time.time()}), flush=True)
while time.time() < end:
    now = time.time()
    if now >= nxt:
        s.send(req)
        nxt = now + 0.002
    r, _w, _x = select.select([s], [], [], max(0.0, nxt - time.time()))
    if not r:
        continue
    data, addr = s.recvfrom(2048)
    if addr[2] == socket.PACKET_OUTGOING or len(data) < 42:
        continue
    op = struct.unpack("!H", data[20:22])[0]
    sha, sip, tip = data[22:28], data[28:32], data[38:42]
    if sip != tpa:
        continue
    t = time.time()
    if op == 2 and data[0:6] == mac:
        print(json.dumps({"kind": "answer", "t": t, "mac": sha.hex(":")}), flush=True)
    elif tip == tpa:
        print(json.dumps({"kind": "garp", "t": t, "mac": sha.hex(":")}), flush=True)
"""


@pytest.fixture
def netns_prefix() -> str:
    return "nst"


def flood(c: SpeakerCluster, ip: str, seconds: float):
    proc = c.seg.popen(c.seg.client.ns, [sys.executable, "-u", "-c", FLOOD, ip, str(seconds)])
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    assert first["kind"] == "start", first
    return proc


CUT = ("table inet nstcut {\n chain in {\n  type filter hook input priority 0; policy accept;\n"
       "  udp sport 7946 drop\n  tcp sport 7946 drop\n }\n}\n")


@pytest.mark.parametrize("slow_leave", [False, True], ids=["plain", "slow-leave"])
def test_sigterm_leader_never_two_macs_answer(make_segment, tmp_path, slow_leave):
    """``slow-leave``: the leader hears nothing from its peers once SIGTERM is sent (its gossip still
    goes out), so its leave waits for news that never comes back, as on a busy or lossy network:
    the old order (leave, then withdraw) answered for that whole wait after the successor took over."""
    vips = spread_vips(NODES)
    ip = next(iter(vips))
    leader, successor = election_order(NODES, ip)[:2]
    docs = pool_docs() + [service_doc(f"svc{i}", [v]) for i, v in enumerate(sorted(vips))]
    c = SpeakerCluster(make_segment(hosts=3), tmp_path, profile="lan", resources=docs)
    c.start_all()
    old, new = c.mac(leader), c.mac(successor)
    gaps = []
    for rnd in range(ROUNDS):
        c.wait(lambda: [a["mac"] for a in c.probe(ip)] == [old], 15, f"round {rnd}: {leader} alone answers")
        proc = flood(c, ip, 2.5)
        time.sleep(0.3)
        if slow_leave:
            c.seg.run(c.host(leader).ns, ["nft", "-f", "-"], input=CUT)
        t_term = c.send_signal(leader, signal.SIGTERM)
        assert c.procs[leader].wait(timeout=10) == 0
        if slow_leave:
            c.seg.run(c.host(leader).ns, ["nft", "delete", "table", "inet", "nstcut"])
        out, _err = proc.communicate(timeout=10)
        events = [json.loads(line) for line in out.splitlines() if line.strip()]
        garps = [e["t"] for e in events if e["kind"] == "garp" and e["mac"] == new and e["t"] >= t_term]
        assert garps, f"round {rnd}: no gratuitous ARP from {successor} after SIGTERM"
        t_garp = garps[0]
        late = [e for e in events if e["kind"] == "answer" and e["mac"] == old and e["t"] > t_garp]
        assert not late, (f"round {rnd}: {leader} ({old}) still answered {len(late)} requests up to "
                          f"{(late[-1]['t'] - t_garp) * 1000:.1f} ms after {successor}'s gratuitous ARP")
        last_old = max((e["t"] for e in events if e["kind"] == "answer" and e["mac"] == old), default=t_term)
        first_new = min((e["t"] for e in events if e["kind"] == "answer" and e["mac"] == new), default=None)
        assert first_new is not None, f"round {rnd}: {successor} never answered"
        gaps.append((first_new - last_old) * 1000)
        print(f"round {rnd}: SIGTERM -> {successor}'s gratuitous ARP {(t_garp - t_term) * 1000:.1f} ms, "
              f"no answer for {gaps[-1]:.1f} ms, no double answer")
        c.start(leader)
        c.wait(lambda: c.members_alive(successor) == set(NODES), 20, f"{leader} back")
    assert max(gaps) < 1000, gaps  # a stop costs milliseconds (lan: a crash would cost >= 1.5 s)
