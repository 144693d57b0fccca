"""Request by request: who answers ARP for a VIP while two real announcers hand it back and forth.

Two L2 agents (``python -m nocloudlb.l2 serve``: the announcer and its responder child, as in the
daemon) on one segment. The VIP moves as the daemon moves it in a planned move: the giver hands it off
(answers until another MAC announces it), then the taker gains it, either as a *take* (``take``: its
announcement leaves from the responder child, then it answers, l2/responder.py ``T``) or answering at
once and announcing from its paced queue a moment later (``take`` off: what 0.2.0 did). Meanwhile the
client sends an ARP request every ``interval`` seconds, each from its own sender address, so a reply
names the request it answers; every request is counted by how many MACs answered it.

Used by tests/netns/test_l2_take.py and benchmarks/take_race.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from netns import L2Agent, Segment

VIP = "198.51.100.200"
OPTIONS = {"check_probes": 0, "garp_rounds": 1}

# the client: one request per interval, the sender address rotating over 508 documentation addresses,
# replies matched by their target (our sender address) to the newest request from it
BLASTER = r"""
import json, select, signal, socket, struct, sys, time
iface, vip, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
sock.bind((iface, 0x0806))
sock.setblocking(False)
mac = sock.getsockname()[4]
senders = [bytes([192, 0, 2, i]) for i in range(1, 255)] + [bytes([203, 0, 113, i]) for i in range(1, 255)]
tpa = socket.inet_aton(vip)
reqs = []  # [send time, {mac}]
newest = {}
def drain():
    while True:
        try:
            data = sock.recv(128)
        except BlockingIOError:
            return
        if len(data) < 42 or data[0:6] != mac or data[20:22] != b"\x00\x02" or data[28:32] != tpa:
            continue
        i = newest.get(data[38:42])
        if i is not None:
            reqs[i][1].add(data[22:28].hex())
print(json.dumps({"ready": True}), flush=True)
nxt = time.monotonic()
while not stop:
    spa = senders[len(reqs) % len(senders)]
    newest[spa] = len(reqs)
    reqs.append([time.monotonic(), set()])
    sock.send(b"\xff" * 6 + mac + b"\x08\x06" + struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, spa,
                                                             b"\x00" * 6, tpa))
    nxt += interval
    while True:
        drain()
        left = nxt - time.monotonic()
        if left <= 0:
            break
        select.select([sock], [], [], left)
    if nxt < time.monotonic() - 0.01:
        nxt = time.monotonic()
end = time.monotonic() + 0.05
while time.monotonic() < end:
    drain()
    select.select([sock], [], [], 0.005)
print(json.dumps([[round(t, 6), len(m)] for t, m in reqs]), flush=True)
"""


def blast(seg: Segment, interval: float) -> subprocess.Popen:
    """Start the client's requests for VIP, one every ``interval`` s (returns once the first is sent)."""
    client = seg.popen(seg.client.ns, [sys.executable, "-u", "-c", BLASTER, seg.client.iface, VIP, str(interval)])
    assert client.stdout is not None
    json.loads(client.stdout.readline())
    return client


def collect(client: subprocess.Popen) -> list[tuple[float, int]]:
    """Stop the client: every request's (send time on CLOCK_MONOTONIC, MACs that answered it)."""
    client.send_signal(signal.SIGTERM)
    out, _err = client.communicate(timeout=30)
    return [(float(t), int(n)) for t, n in json.loads(out.strip().splitlines()[-1])]


@dataclass
class Race:
    take: bool
    moves: int
    requests: int  # sent from the first move to the last
    two: int  # answered by two MACs
    none: int  # answered by nobody

    def line(self) -> str:
        how = "take (announce, then answer)" if self.take else "answer first, announce after"
        return (f"{how}: {self.moves} moves, {self.requests} requests: answered by two {self.two}, "
                f"by none {self.none}")


def race(seg: Segment, moves: int, take: bool, interval: float = 0.0002, gap: float = 0.05) -> Race:
    """Move the VIP ``moves`` times between hosts 0 and 1 (see the module docstring); the counts."""
    a, b = seg.hosts[0], seg.hosts[1]
    agents = [L2Agent(seg, a.ns, "n1", member_macs=[b.mac], **OPTIONS),
              L2Agent(seg, b.ns, "n2", member_macs=[a.mac], **OPTIONS)]
    macs = [a.mac, b.mac]
    client = None
    try:
        agents[0].set({VIP: []}, skip_check=[VIP])
        time.sleep(0.3)
        client = blast(seg, interval)
        time.sleep(0.1)
        t0 = time.monotonic()
        holder = 0
        for _i in range(moves):
            giver, taker = agents[holder], agents[1 - holder]
            giver.set({}, hand_off={VIP: [macs[1 - holder]]})
            taker.set({VIP: []}, skip_check=[VIP], take=[VIP] if take else [])
            holder = 1 - holder
            time.sleep(gap)
        t1 = time.monotonic()
        time.sleep(0.05)
        reqs = collect(client)
        ended = [agent.stats().get("handing_off") for agent in agents]
        assert not any(ended), f"hand-offs still running at the end: {ended}"
        during = [n for t, n in reqs if t0 <= t <= t1]
        return Race(take, moves, len(during), sum(1 for n in during if n > 1), sum(1 for n in during if n == 0))
    finally:
        if client is not None and client.poll() is None:
            Segment.kill(client)
        for agent in agents:
            agent.stop()
