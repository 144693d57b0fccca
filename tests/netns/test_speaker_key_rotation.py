"""Key rotation with real speakers, in the order of playbooks/rotate_key.yml, with a crash in the middle.

Three ``fast`` speakers, two VIPs each. The rotation is the role's (roles/speaker/tasks/rotate_key.yml):
every node gets the new key beside the old (``old, new``) and a SIGHUP, and every node is checked before
the next step; then the new key becomes primary (``new, old``); then the old one is dropped (``new``).
One node is killed with SIGKILL and started again between two steps (its key file is what the step
wrote), as a crash-restart by systemd would. Throughout, the client asks for every VIP over ARP every
100 ms (tests/chaos/prober.py) and records every MAC that answers.

Asserted: no sample with two MACs for a VIP; no VIP without an answer for more than 1.5 s (the crash's
failover and hand-back included); heartbeats never refused for their HMAC during or after the
rotation (every node verifies what every other one signs at every step, the restarted one included);
after the last step a heartbeat signed with the retired key, sent from the client with a peer's name
and a suspicion of the node, is refused (``rejectedAuth`` grows) and changes nothing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nocloudlb.membership import generate_key
from speaker_harness import ClientLines, SpeakerCluster, pool_docs, service_doc, spread_vips

pytestmark = pytest.mark.timeout(240)
NODES = ["n1", "n2", "n3"]
PROBER = Path(__file__).resolve().parents[1] / "chaos" / "prober.py"
HB_PORT = 7947  # gossip 7946 + the profiles' heartbeatPortOffset 1


@pytest.fixture
def netns_prefix() -> str:
    return "nky"


class Sampler(ClientLines):
    """tests/chaos/prober.py in the client: every MAC answering each VIP, every 100 ms (its HTTP side
    fetches the discard port and is ignored)."""

    def __init__(self, c: SpeakerCluster, vips: list[str], seconds: float = 200) -> None:
        self.stop_file = c.dir / "prober.stop"
        args = [sys.executable, "-u", str(PROBER), "eth0", "0.1", str(time.time() + seconds), str(self.stop_file),
                *[f"{ip}=9" for ip in vips]]
        super().__init__(c.seg, args, keep=lambda rec: rec.get("k") == "arp", stderr=subprocess.DEVNULL)
        self.rounds = self.samples

    def stop(self) -> list[dict]:  # type: ignore[override]  # the prober ends at its stop file, not by a kill
        self.stop_file.write_text("")
        self.proc.wait(timeout=10)
        self.thread.join(timeout=5)
        return self.rounds

    def since(self, t: float) -> list[dict]:
        return [r for r in list(self.rounds) if r["t"] >= t]


def no_owner_windows(rounds: list[dict], ip: str) -> list[float]:
    """Lengths (s) of the runs of rounds in which nobody answered ``ip``, first to last silent round + 0.1."""
    out, start, last = [], None, None
    for r in rounds:
        if r["a"].get(ip):
            if start is not None:
                out.append(last - start + 0.1)
                start = None
        else:
            start = r["t"] if start is None else start
            last = r["t"]
    if start is not None:
        out.append(last - start + 0.1)
    return out


def hb_counter(c: SpeakerCluster, name: str, key: str = "rejectedAuth") -> int:
    return c.status(name)["heartbeat"]["counters"][key]


def step_done(c: SpeakerCluster, keys: list[str], first_ids: dict[str, str] | None) -> bool:
    """The role's check after a step, on every node: the key count of the step, the primary changed at
    step 2, full membership."""
    for n in NODES:
        st = c.try_status(n)
        if not st or not st.get("ready"):
            return False
        ids = st["memberlist"]["keyIds"]
        if len(ids) != len(keys) or (first_ids is not None and len(keys) == 2 and keys[0] != c.keys[0]
                                     and ids[0] == first_ids[n]):
            return False
        if {m["name"] for m in st["members"] if m["state"] == "alive"} != set(NODES):
            return False
    return True


FORGE = r"""
import socket, sys, time
from nocloudlb.heartbeat import Packet, derive_keys, encode
key, sender, recipient, host, port, count = sys.argv[1:7]
k = derive_keys([key])[0]
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    for i in range(int(count)):
        # a peer's name, a boot far ahead (no replay check stops it), "I suspect you" (flag 1)
        pkt = Packet(sender, recipient, time.time_ns() + 10**18, i + 1, 99, 0, True, None, ())
        s.sendto(encode(pkt, k), (host, int(port)))
        time.sleep(0.05)
print(count)
"""


# (step after which the node crashes, profile, seconds from the kill to the restart). With ``fast`` gossip
# declares the killed node dead before it is back; with ``lan`` and systemd's RestartSec=1s (the role's unit)
# it is back first, so its peers still count the heartbeats they heard from it before the crash.
CASES = [(1, "fast", 1.5), (2, "fast", 1.5), (3, "fast", 1.5), (3, "lan", 1.0)]


@pytest.mark.parametrize(("crash_after", "profile", "down"), CASES,
                         ids=[f"crash-after-step-{s}-{p}" for s, p, _d in CASES])
def test_rotation_in_the_roles_order_with_a_crash_restart_keeps_one_owner(make_segment, tmp_path, crash_after,
                                                                          profile, down):
    vips = spread_vips(NODES, per_node=2)
    docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
    c = SpeakerCluster(make_segment(hosts=3), tmp_path, profile=profile, resources=docs)
    c.start_all()
    c.wait(lambda: all(any(v["announcing"] for v in c.status(n)["vips"]) for n in NODES), 10,
           "every node announcing its VIPs")
    old, new = c.keys[0], generate_key()
    victim = vips[sorted(vips)[0]]  # the leader of a VIP: its crash moves VIPs both ways
    first_ids = {n: c.status(n)["memberlist"]["keyIds"][0] for n in NODES}
    sampler = Sampler(c, sorted(vips))
    c.wait(lambda: len(sampler.rounds) >= 10, 10, "the prober sampling")
    t_start = time.time()
    steps = [[old, new], [new, old], [new]]
    for i, keys in enumerate(steps, 1):
        for n in NODES:
            c.set_key_file(n, keys)
            c.send_signal(n, signal.SIGHUP)
        c.wait(lambda keys=keys: step_done(c, keys, first_ids), 20, f"every node through step {i}")
        time.sleep(1.0)  # heartbeats and gossip under this step's keys
        if i == crash_after:
            c.stop(victim, signal.SIGKILL)  # its key file holds this step's keys, as on a real node
            time.sleep(down)  # the others take its VIPs on heartbeat suspicion
            c.start(victim)
            c.wait(lambda keys=keys: step_done(c, keys, first_ids), 30, f"{victim} back after step {i}")
            c.wait(lambda: c.settled() and all(c.announcing(ld, ip) for ip, ld in vips.items()), 20,
                   f"{victim} leads its VIPs again")
            time.sleep(1.0)
    time.sleep(2.0)
    refused = {n: hb_counter(c, n) for n in NODES}
    received = {n: hb_counter(c, n, "received") for n in NODES}
    time.sleep(2.0)
    refused_later = {n: hb_counter(c, n) for n in NODES}
    received_later = {n: hb_counter(c, n, "received") for n in NODES}

    # a heartbeat signed with the retired key: refused, and it changes nothing
    target = next(n for n in NODES if n != victim)
    sender = next(n for n in NODES if n != target)
    before = hb_counter(c, target)
    led = sorted(ip for ip, ld in vips.items() if ld == target)
    forged = c.seg.run(c.seg.client.ns, [sys.executable, "-c", FORGE, old, sender, target, c.host(target).ipv4,
                                         str(HB_PORT), "20"])
    assert forged.stdout.strip() == "20", forged
    time.sleep(1.0)
    st = c.status(target)
    forged_refused = st["heartbeat"]["counters"]["rejectedAuth"] - before
    rounds = sampler.stop()
    during = [r for r in rounds if r["t"] >= t_start]
    two = [(r["t"], ip, macs) for r in during for ip, macs in r["a"].items() if len(macs) > 1]
    gaps = {ip: round(max(no_owner_windows(during, ip), default=0.0), 2) for ip in vips}
    print(f"\ncrash after step {crash_after} ({victim}, {profile}, down {down} s): {len(during)} samples x "
          f"{len(vips)} VIPs, two-MAC samples "
          f"{len(two)}, longest no-owner window {max(gaps.values()):.2f} s {gaps}; rejectedAuth at the end "
          f"{refused} (2 s later {refused_later}); forged heartbeats with the retired key refused {forged_refused}/20")

    assert len(during) > 100, len(during)
    assert two == [], two[:10]
    assert max(gaps.values()) <= 1.5, gaps
    # heartbeats flow and none was ever refused for its HMAC: every node verified every other one at every
    # step (the restarted one's counters started with it; its peers' counters span the whole rotation)
    assert refused == dict.fromkeys(NODES, 0), refused
    assert refused_later == refused, refused_later
    assert all(received_later[n] > received[n] + 10 for n in NODES), (received, received_later)
    # the retired key's datagrams: every one refused, no suspicion taken from them, the VIPs kept
    assert forged_refused == 20, forged_refused
    assert st["heartbeat"]["suspecters"] == [] and not st["heartbeat"]["cutOff"], st["heartbeat"]
    assert all(c.announcing(target, ip) for ip in led)
    # every VIP answered by its leader alone at the end
    last = during[-1]["a"]
    assert {ip: last[ip] for ip in vips} == {ip: [c.mac(ld)] for ip, ld in vips.items()}, last
