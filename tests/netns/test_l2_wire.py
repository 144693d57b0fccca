"""Layer-2 responders on a real segment: answers, withdrawal, gratuitous schedule, conflicts, pacing.

Each test builds a bridge segment (netns.py) and runs ``python -m nocloudlb.l2 serve``
(the L2Announcer) in host namespaces. The client side uses independent tools: scapy,
arping, ndisc6 and tcpdump captures, never our own frame code.
"""

from __future__ import annotations

import ipaddress
import json
import re
import signal
import sys
import time

import pytest
from netns import L2Agent, Segment

pytestmark = pytest.mark.timeout(90)

VIP4, VIP6 = "198.51.100.200", "2001:db8:1::200"
VIP4B, VIP6B = "198.51.100.201", "2001:db8:1::201"
IDLE4, IDLE6 = "198.51.100.202", "2001:db8:1::202"  # on every node's lo, announced by nobody
ALL_VIPS = [VIP4, VIP6, VIP4B, VIP6B, IDLE4, IDLE6]

# Runs in the client namespace: send `count` ARP requests / NS for each address (scapy),
# capture until `wait` seconds after the last one and report every answering MAC per address.
WHO_HAS = r"""
import json, socket, sys, time
from scapy.all import (ARP, AsyncSniffer, Ether, ICMPv6ND_NA, ICMPv6ND_NS, ICMPv6NDOptDstLLAddr,
                       ICMPv6NDOptSrcLLAddr, IPv6, get_if_hwaddr, in6_getnsma, in6_getnsmac, inet_pton, sendp)
mine4, mine6, count, wait, ips = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5:]
iface = "eth0"
mac = get_if_hwaddr(iface)
started = []
sn = AsyncSniffer(iface=iface, filter="arp or (icmp6 and ip6[40] == 136)", store=True,
                  started_callback=lambda: started.append(1))
sn.start()
while not started:
    time.sleep(0.01)
for ip in ips:
    if ":" in ip:
        group = socket.inet_ntop(socket.AF_INET6, in6_getnsma(inet_pton(socket.AF_INET6, ip)))
        req = (Ether(src=mac, dst=in6_getnsmac(inet_pton(socket.AF_INET6, group))) / IPv6(src=mine6, dst=group)
               / ICMPv6ND_NS(tgt=ip) / ICMPv6NDOptSrcLLAddr(lladdr=mac))
    else:
        req = Ether(dst="ff:ff:ff:ff:ff:ff", src=mac) / ARP(op=1, hwsrc=mac, psrc=mine4, pdst=ip)
    for _ in range(count):
        sendp(req, iface=iface, verbose=False)
        time.sleep(0.03)
time.sleep(wait)
result = {ip: {} for ip in ips}
for p in sn.stop():
    if ICMPv6ND_NA in p and p[ICMPv6ND_NA].tgt in result and p[ICMPv6ND_NA].S:
        na = p[ICMPv6ND_NA]
        ll = p[ICMPv6NDOptDstLLAddr].lladdr if ICMPv6NDOptDstLLAddr in p else None
        a = result[na.tgt].setdefault(p[Ether].src, {"count": 0})
        a.update(count=a["count"] + 1, S=int(na.S), O=int(na.O), R=int(na.R), tlla=ll, hlim=p[IPv6].hlim,
                 dst=p[IPv6].dst, eth_dst=p[Ether].dst)
    elif ARP in p and p[ARP].op == 2 and p[ARP].psrc in result and p[ARP].pdst == mine4:
        a = result[p[ARP].psrc].setdefault(p[ARP].hwsrc, {"count": 0})
        a.update(count=a["count"] + 1, eth_src=p[Ether].src, eth_dst=p[Ether].dst, pdst=p[ARP].pdst,
                 hwdst=p[ARP].hwdst, length=len(p))
print(json.dumps(result))
"""


def who_has_many(seg: Segment, ips: list[str], count: int = 3, wait: float = 0.4) -> dict[str, dict[str, dict]]:
    """ip -> {answering MAC -> details}, from one scapy run in the client namespace."""
    c = seg.client
    out = seg.run(c.ns, [sys.executable, "-c", WHO_HAS, c.ipv4, c.ipv6, str(count), str(wait), *ips], timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def who_has(seg: Segment, ip: str, count: int = 3, wait: float = 0.4) -> dict[str, dict]:
    return who_has_many(seg, [ip], count, wait)[ip]


def hold_vips_on_lo(seg: Segment, ns: str, ips: list[str]) -> None:
    """The delivery side (LVS-DR recipe, see test_l2_delivery.py): VIPs on lo, the kernel answers no ARP for them."""
    cmds = ["sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2"]
    cmds += [f"ip addr add {ip}/{128 if ':' in ip else 32} dev lo" for ip in ips]
    seg.run(ns, " && ".join(cmds))


@pytest.fixture
def lab(make_segment):
    seg = make_segment(hosts=3)
    for h in seg.hosts:
        hold_vips_on_lo(seg, h.ns, ALL_VIPS)
    return seg


def test_each_vip_answered_once_by_its_announcer(lab):
    seg = lab
    n1, n2, n3 = seg.hosts
    a1 = L2Agent(seg, n1.ns, "n1")
    a2 = L2Agent(seg, n2.ns, "n2")
    L2Agent(seg, n3.ns, "n3")  # runs, announces nothing: must stay silent
    a1.set({VIP4: [], VIP6: []})
    a2.set({VIP4B: ["eth0"], VIP6B: []})
    for agent, ips in ((a1, (VIP4, VIP6)), (a2, (VIP4B, VIP6B))):
        for ip in ips:
            agent.wait_state(ip, "announcing")

    seen = who_has_many(seg, [VIP4, VIP4B, VIP6, VIP6B, IDLE4, IDLE6])
    for ip, host in ((VIP4, n1), (VIP4B, n2)):
        answers = seen[ip]
        assert list(answers) == [host.mac], f"{ip}: expected only {host.mac}, got {answers}"
        a = answers[host.mac]
        assert a["count"] == 3
        assert a["eth_dst"] == seg.client.mac and a["pdst"] == seg.client.ipv4 and a["hwdst"] == seg.client.mac
        assert a["length"] == 60, "ARP reply not padded to the Ethernet minimum"
    for ip, host in ((VIP6, n1), (VIP6B, n2)):
        answers = seen[ip]
        assert list(answers) == [host.mac], f"{ip}: expected only {host.mac}, got {answers}"
        a = answers[host.mac]
        assert a["count"] == 3 and a["tlla"] == host.mac
        assert (a["S"], a["O"], a["R"]) == (1, 1, 0)
        assert a["hlim"] == 255 and a["dst"] == seg.client.ipv6 and a["eth_dst"] == seg.client.mac
    # Held on every node's lo but announced by nobody: no answer from anyone, kernel included.
    assert seen[IDLE4] == {} and seen[IDLE6] == {}
    # Independent clients agree, and traffic to the VIP is delivered (VIP on lo).
    out = seg.run(seg.client.ns, ["arping", "-c", "2", "-i", "eth0", VIP4B]).stdout
    assert re.findall(r"from ([0-9a-f:]{17})", out) == [n2.mac, n2.mac]
    out = seg.run(seg.client.ns, ["ndisc6", "-n", "-r", "2", VIP6, "eth0"]).stdout
    assert re.search(r"Target link-layer address: ([0-9A-F:]{17})", out).group(1).lower() == n1.mac
    seg.run(seg.client.ns, ["ping", "-c", "1", "-W", "2", VIP4])
    seg.run(seg.client.ns, ["ping", "-6", "-c", "1", "-W", "2", VIP6B])
    st = a1.stats()
    assert st["requests_received"][VIP4] >= 3 and st["responses_sent"][VIP4] == st["requests_received"][VIP4]
    assert st["announced"] == {VIP4: ["eth0"], VIP6: ["eth0"]}


def _maddrs(seg: Segment, ns: str) -> str:
    return seg.run(ns, ["ip", "-6", "maddr", "show", "dev", "eth0"]).stdout


def test_withdraw_stops_answers_at_once(lab):
    seg = lab
    n1 = seg.hosts[0]
    a1 = L2Agent(seg, n1.ns, "n1")
    a1.set({VIP4: [], VIP6: []}, skip_check=[VIP4, VIP6])
    assert a1.stats()["announced"] == {VIP4: ["eth0"], VIP6: ["eth0"]}
    assert list(who_has(seg, VIP4, count=1, wait=0.2)) == [n1.mac]
    # Solicited-node group joined (with MLD, through the socket API) while announced.
    assert "ff02::1:ff00:200" in _maddrs(seg, n1.ns)
    a1.set({VIP6: []})
    seen = who_has_many(seg, [VIP4, VIP6], count=2, wait=0.3)
    assert seen[VIP4] == {} and list(seen[VIP6]) == [n1.mac]
    a1.set({})
    assert who_has(seg, VIP6, count=2, wait=0.3) == {}
    assert "ff02::1:ff00:200" not in _maddrs(seg, n1.ns)
    assert a1.stats()["vips"] == {}
    # stop() (the daemon's shutdown) also silences it, VIPs still set or not.
    a1.set({VIP4: []}, skip_check=[VIP4])
    a1.stop()
    assert who_has(seg, VIP4, count=2, wait=0.3) == {}


def _read_pcap(seg: Segment, path: str):
    from scapy.all import rdpcap

    return list(rdpcap(path))


def _capture(seg: Segment, ns: str, path: str, flt: str, count: int | None = None, direction_out: bool = False):
    """tcpdump into ``path``; with ``count`` it exits by itself after that many frames (see _finish)."""
    extra = (["-c", str(count)] if count else []) + (["-Q", "out"] if direction_out else [])
    proc = seg.popen(ns, ["tcpdump", "-i", "eth0", "-n", "-U", "-B", "16384", *extra, "-w", path, flt])
    deadline = time.monotonic() + 10
    line = ""
    while "listening" not in line:  # tcpdump says so on stderr once the capture runs
        assert time.monotonic() < deadline, "tcpdump did not start"
        line = proc.stderr.readline()
    return proc


def _finish(cap, timeout: float) -> str:
    """Wait for a counted capture to end by itself (all frames read), else stop it; returns its stderr."""
    try:
        cap.wait(timeout=timeout)
    except Exception:  # noqa: BLE001 - fewer frames than expected: stop, the assertions will tell
        Segment.kill(cap, signal.SIGINT)
    return cap.stderr.read()


def test_gratuitous_schedule_probe_and_override(lab, tmp_path):
    from scapy.all import ARP, Ether, ICMPv6ND_NA, ICMPv6ND_NS, ICMPv6NDOptDstLLAddr, IPv6

    seg = lab
    n1 = seg.hosts[0]
    a1 = L2Agent(seg, n1.ns, "n1")
    pcap = str(tmp_path / "garp.pcap")
    # 2 ARP probes + 2 DAD NS + 5 x (ARP request + reply) + 5 NA = 19 frames from n1.
    # (n1's kernel does DAD for its own link-local address at about this time: NS for other targets
    # are left out of the capture; ip6[60:4] is the last word of the NS/NA target.)
    cap = _capture(seg, seg.client.ns, pcap, f"ether src {n1.mac} and (arp or (icmp6 and "
                   "(ip6[40] == 135 or ip6[40] == 136) and ip6[60:4] == 0x00000200))", count=19)
    t0 = time.time()
    a1.set({VIP4: [], VIP6: []})
    _finish(cap, timeout=8)  # 0.3 s check + 5 rounds 1.1 s apart
    pkts = [p for p in _read_pcap(seg, pcap) if p[Ether].src == n1.mac]

    probes = [p for p in pkts if ARP in p and p[ARP].op == 1 and p[ARP].psrc == "0.0.0.0"]
    assert [p[ARP].pdst for p in probes] == [VIP4, VIP4], "expected 2 RFC 5227 probes"
    assert all(p[Ether].dst == "ff:ff:ff:ff:ff:ff" and p[ARP].hwdst == "00:00:00:00:00:00" for p in probes)
    assert 0.08 <= float(probes[1].time - probes[0].time) <= 0.6  # check_interval 0.1 s, wide margin for a busy host
    dad = [p for p in pkts if ICMPv6ND_NS in p]
    assert len(dad) == 2 and all(p[IPv6].src == "::" and p[IPv6].dst == "ff02::1:ff00:200"
                                 and p[ICMPv6ND_NS].tgt == VIP6 for p in dad)

    garp = [p for p in pkts if ARP in p and p[ARP].psrc == VIP4]
    assert len(garp) == 10, f"expected 5 rounds x (request + reply), got {len(garp)}"
    for p in garp:
        assert p[ARP].pdst == VIP4 and p[ARP].hwsrc == n1.mac and p[Ether].dst == "ff:ff:ff:ff:ff:ff"
        assert len(p) == 60
    assert [p[ARP].op for p in garp] == [1, 2] * 5
    rounds = [float(p.time) for p in garp[::2]]
    first_after_check = rounds[0] - float(probes[-1].time)
    assert first_after_check < 1.0, f"first gratuitous ARP {first_after_check:.3f}s after the last probe"
    assert rounds[0] - t0 < 2.0
    gaps = [b - a for a, b in zip(rounds, rounds[1:], strict=False)]
    assert all(0.95 <= g <= 2.0 for g in gaps), f"round gaps {gaps}"  # 1.1 s; never under the 1 s locktime
    assert rounds[-1] - rounds[0] > 1.0 * 4, "schedule must outlast the 1 s ARP locktime several times"

    nas = [p for p in pkts if ICMPv6ND_NA in p]
    assert len(nas) == 5
    for p in nas:
        na = p[ICMPv6ND_NA]
        assert (na.R, na.S, na.O) == (0, 0, 1), "unsolicited NA must carry only the override flag"
        assert na.tgt == VIP6 and p[IPv6].dst == "ff02::1" and p[Ether].dst == "33:33:00:00:00:01"
        assert p[IPv6].hlim == 255 and p[ICMPv6NDOptDstLLAddr].lladdr == n1.mac
    st = a1.stats()
    assert st["gratuitous_sent"] == {VIP4: 10, VIP6: 5}


def test_gratuitous_updates_client_cache_on_takeover(lab):
    """Failover as clients see it: n2 takes VIP4 over and the client's cached MAC moves at once."""
    seg = lab
    n1, n2 = seg.hosts[0], seg.hosts[1]
    a1 = L2Agent(seg, n1.ns, "n1")
    a2 = L2Agent(seg, n2.ns, "n2")
    a1.set({VIP4: []}, skip_check=[VIP4])
    seg.run(seg.client.ns, ["ping", "-c", "1", "-W", "2", VIP4])
    assert n1.mac in seg.run(seg.client.ns, ["ip", "neigh", "show", VIP4]).stdout
    time.sleep(1.1)  # past the client's 1 s locktime for this entry
    a1.set({})
    a2.set({VIP4: []}, skip_check=[VIP4])
    deadline = time.monotonic() + 2
    while n2.mac not in seg.run(seg.client.ns, ["ip", "neigh", "show", VIP4]).stdout:
        assert time.monotonic() < deadline, "client's neighbour entry did not move to n2"
        time.sleep(0.05)
    seg.run(seg.client.ns, ["ping", "-c", "1", "-W", "2", VIP4])


def test_conflict_detected_reported_not_fought(lab):
    seg = lab
    n1, n2 = seg.hosts[0], seg.hosts[1]
    # n2 owns the addresses the ordinary way: on its eth0, answered by its kernel.
    seg.run(n2.ns, f"ip addr add {VIP4B}/32 dev eth0 && ip addr add {VIP6B}/128 dev eth0 nodad")
    a1 = L2Agent(seg, n1.ns, "n1", conflict_retry=1.5)
    a1.set({VIP4B: [], VIP6B: []})
    a1.wait_state(VIP4B, "conflict")
    a1.wait_state(VIP6B, "conflict")
    conflicts = {c["ip"]: c for c in a1.conflicts()}
    assert set(conflicts) == {VIP4B, VIP6B}
    for c in conflicts.values():
        assert c["mac"] == n2.mac and c["iface"] == "eth0" and c["at"].endswith("+00:00")
    assert a1.stats()["announced"] == {}
    # Not fought: only n2 answers.
    seen = who_has_many(seg, [VIP4B, VIP6B], count=2, wait=0.3)
    assert list(seen[VIP4B]) == [n2.mac] and list(seen[VIP6B]) == [n2.mac]
    # probe() from n1 (like arping) shows who holds it.
    found = seg.python_json(n1.ns, f"import json; from nocloudlb.l2 import probe; "
                                   f"print(json.dumps(probe({VIP4B!r}, 'eth0', 0.3)))")
    assert [f["mac"] for f in found] == [n2.mac]
    # The other host gives the addresses up: the periodic re-check finds silence and announces.
    seg.run(n2.ns, f"ip addr del {VIP4B}/32 dev eth0 && ip addr del {VIP6B}/128 dev eth0")
    a1.wait_state(VIP4B, "announcing", timeout=5)
    a1.wait_state(VIP6B, "announcing", timeout=5)
    assert a1.conflicts() == []
    assert list(who_has(seg, VIP4B, count=1, wait=0.2)) == [n1.mac]
    log = a1.stop()
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    conflict_logs = [e for e in events if e.get("event") == "ipConflict"]
    assert {e["ip"] for e in conflict_logs} == {VIP4B, VIP6B} and all(e["mac"] == n2.mac for e in conflict_logs)


def test_skip_check_announces_immediately(lab):
    """Handover from a live member (drain): the old owner still answers, yet the new one announces at once."""
    seg = lab
    n1, n2 = seg.hosts[0], seg.hosts[1]
    old = L2Agent(seg, n2.ns, "n2")
    old.set({VIP4: []}, skip_check=[VIP4])
    new = L2Agent(seg, n1.ns, "n1")
    new.set({VIP4: []}, skip_check=[VIP4])
    assert new.stats()["vips"][VIP4]["state"] == "announcing"
    assert new.conflicts() == []
    old.set({})
    assert list(who_has(seg, VIP4, count=2, wait=0.3)) == [n1.mac]


def _wait_handed(agent: L2Agent, ips: set[str], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while set(agent.stats()["handing_off"]) & ips:
        assert time.monotonic() < deadline, agent.stats()["handing_off"]
        time.sleep(0.02)


def test_hand_off_answers_until_the_taker_announces(lab):
    """A planned move makes before it breaks (l2/handoff.py): the node giving an address up keeps answering
    it (IPv4 and IPv6) until the taker's MAC announces it, then stops on that frame; another MAC's
    announcement stops it too; without one it answers until the bound; given back meanwhile it is
    answered and announced again; ``end_handoffs`` (the daemon failing closed) silences every hand-off
    at once."""
    seg = lab
    n1, n2, n3 = seg.hosts
    old = L2Agent(seg, n2.ns, "n2")
    old.set({VIP4: [], VIP6: [], VIP4B: [], VIP6B: []}, skip_check=[VIP4, VIP6, VIP4B, VIP6B])
    old.set({}, hand_off={VIP4: [n1.mac], VIP6: [n1.mac], VIP4B: [n3.mac], VIP6B: [n3.mac]}, hand_off_seconds=30)
    st = old.stats()
    assert st["announced"] == {} and st["handing_off"] == sorted([VIP4, VIP6, VIP4B, VIP6B]), st
    seen = who_has_many(seg, [VIP4, VIP6, VIP4B], count=2, wait=0.3)
    assert {ip: list(m) for ip, m in seen.items()} == {VIP4: [n2.mac], VIP6: [n2.mac], VIP4B: [n2.mac]}, seen
    # the taker announces (gratuitous ARP, unsolicited NA): the giver stops, only the taker answers
    new = L2Agent(seg, n1.ns, "n1")
    new.set({VIP4: [], VIP6: []}, skip_check=[VIP4, VIP6])
    _wait_handed(old, {VIP4, VIP6})
    seen = who_has_many(seg, [VIP4, VIP6], count=2, wait=0.3)
    assert list(seen[VIP4]) == [n1.mac] and list(seen[VIP6]) == [n1.mac], seen
    assert old.stats()["handing_off"] == sorted([VIP4B, VIP6B])
    # given back while handed off (its taker never came): answered as before, no check, announced again
    before = old.stats()["gratuitous_sent"].get(VIP4B, 0)
    old.set({VIP4B: []})
    st = old.wait_state(VIP4B, "announcing", timeout=1)
    assert VIP4B not in st["handing_off"] and list(who_has(seg, VIP4B, count=2, wait=0.3)) == [n2.mac]
    deadline = time.monotonic() + 2
    while old.stats()["gratuitous_sent"].get(VIP4B, 0) <= before:
        assert time.monotonic() < deadline, "no gratuitous ARP after the address was given back"
        time.sleep(0.05)
    # no announcement from the taker: answered until the bound, then silent (a scapy client takes about a
    # second to start on a loaded machine: the answer during the hand-off is the part above)
    t0 = time.monotonic()
    old.set({}, hand_off={VIP4B: [n3.mac]}, hand_off_seconds=1.0)
    assert VIP4B in old.stats()["handing_off"]
    _wait_handed(old, {VIP4B}, timeout=6.0)
    assert 0.9 <= time.monotonic() - t0 < 5.0, time.monotonic() - t0
    assert who_has(seg, VIP4B, count=2, wait=0.3) == {}
    # another MAC than the taker's announces it (the taker died meanwhile, a third node took over): stopped too
    old.set({VIP4B: []}, skip_check=[VIP4B])
    old.wait_state(VIP4B, "announcing", timeout=1)
    old.set({}, hand_off={VIP4B: [n3.mac]}, hand_off_seconds=30)
    new.set({VIP4: [], VIP6: [], VIP4B: []}, skip_check=[VIP4B])
    _wait_handed(old, {VIP4B})
    assert list(who_has(seg, VIP4B, count=2, wait=0.3)) == [n1.mac]
    # failing closed ends every hand-off at once
    assert old.stats()["handing_off"] == [VIP6B]
    old.call(cmd="end_handoffs")
    assert old.stats()["handing_off"] == [] and who_has(seg, VIP6B, count=2, wait=0.3) == {}
    assert old.conflicts() == [] and new.conflicts() == []


def test_check_waits_for_a_member_still_answering_then_announces_at_its_silence(lab):
    """Take-back from a member that holds the address now (a restarted node preempting, a VIP taken back
    after a false suspicion): the member's answers are a handover, not a conflict, and the new owner
    announces only once the member is silent, so the two never answer at once. A member that never
    stops is outwaited after ``member_wait`` seconds (the daemon's wire rule decides then)."""
    seg = lab
    n1, n2 = seg.hosts[0], seg.hosts[1]
    old = L2Agent(seg, n2.ns, "n2")
    old.set({VIP4: [], VIP6: []}, skip_check=[VIP4, VIP6])
    new = L2Agent(seg, n1.ns, "n1", member_macs=[n2.mac], member_wait=30.0)
    new.set({VIP4: [], VIP6: []})
    time.sleep(1.2)  # four check rounds: the member answered each one
    st = new.stats()
    assert {ip: st["vips"][ip]["state"] for ip in (VIP4, VIP6)} == {VIP4: "checking", VIP6: "checking"}, st["vips"]
    assert st["member_waits"] >= 4 and new.conflicts() == [], st
    seen = who_has_many(seg, [VIP4, VIP6], count=2, wait=0.3)
    assert list(seen[VIP4]) == [n2.mac] and list(seen[VIP6]) == [n2.mac], seen
    t0 = time.monotonic()
    old.set({})  # the member hands over
    new.wait_state(VIP4, "announcing", timeout=3)
    new.wait_state(VIP6, "announcing", timeout=3)
    took = time.monotonic() - t0
    assert took < 2.0, took  # the next check round after its silence (0.3 s on an idle machine)
    assert list(who_has(seg, VIP4, count=2, wait=0.3)) == [n1.mac]
    assert new.conflicts() == []
    new.stop()

    # a member that keeps answering: announced anyway after member_wait, no conflict recorded
    new = L2Agent(seg, n1.ns, "n1", member_macs=[n2.mac], member_wait=1.0)
    old.set({VIP4B: []}, skip_check=[VIP4B])
    t0 = time.monotonic()
    new.set({VIP4B: []})
    new.wait_state(VIP4B, "announcing", timeout=5)
    assert 0.9 <= time.monotonic() - t0 < 4.0, time.monotonic() - t0
    assert new.conflicts() == [] and new.stats()["member_waits"] >= 2


def test_probe_reports_every_mac_with_latency(lab):
    seg = lab
    n1, n2 = seg.hosts[0], seg.hosts[1]
    a1 = L2Agent(seg, n1.ns, "n1")
    a1.set({VIP4: [], VIP6: []}, skip_check=[VIP4, VIP6])
    # A second owner: n2's kernel answers for the same addresses (arp_ignore allows: on eth0).
    seg.run(n2.ns, f"ip addr add {VIP4}/32 dev eth0 && ip addr add {VIP6}/128 dev eth0 nodad")
    for ip in (VIP4, VIP6):
        found = seg.python_json(seg.client.ns, f"import json; from nocloudlb.l2 import probe; "
                                               f"print(json.dumps(probe({ip!r}, None, 0.5)))")
        assert sorted(f["mac"] for f in found) == sorted([n1.mac, n2.mac]), found
        for f in found:
            assert f["ip"] == ip and f["iface"] == "eth0" and 0 < f["latency_ms"] < 200
    out = seg.run(seg.client.ns, [sys.executable, "-m", "nocloudlb.l2", "probe", IDLE4, "--timeout", "0.2"],
                  check=False)
    assert out.returncode == 1 and json.loads(out.stdout) == []


def test_pacing_bounds_rate_per_interface(make_segment, tmp_path):
    """2,000 VIPs gained at once: gratuitous frames leave at <= rate/s (+ burst), answers are not delayed.

    The 1,500 multicast joins (the kernel packs their records into a few MLD reports) take
    MCAST_COST (1/32) of a token each from the same bucket, so the takeover lasts about
    (1,500 / 32 + 2,500) / rate = 2.5 s here.
    """
    seg = make_segment(hosts=1)
    n1 = seg.hosts[0]
    rate, burst = 1000, 50
    v4 = [str(ipaddress.IPv4Address("203.0.113.0") + i) for i in range(256)]
    v4 += [str(ipaddress.IPv4Address("192.0.2.0") + i) for i in range(244)]
    v6 = [str(ipaddress.IPv6Address("2001:db8:2::") + i) for i in range(1500)]
    vips = v4 + v6
    assert len(vips) == 2000
    a1 = L2Agent(seg, n1.ns, "n1", rate=rate, burst=burst, garp_rounds=1)
    pcap = str(tmp_path / "pace.pcap")
    # Captured where the frames leave (n1's eth0, outbound), so timestamps are the sender's pace,
    # not the receiver's scheduling jitter. Only gratuitous ARP (spa == tpa) and NA.
    flt = "(arp and arp[14:4] = arp[24:4]) or (icmp6 and ip6[40] == 136)"
    cap = _capture(seg, n1.ns, pcap, flt, count=2500, direction_out=True)
    t_set = time.time()
    a1.set({ip: [] for ip in vips}, skip_check=vips)
    set_took = time.time() - t_set
    time.sleep(0.5)
    # Answers bypass the pacing: arping in the middle of the burst is answered promptly.
    out = seg.run(seg.client.ns, ["arping", "-c", "3", "-W", "0.3", "-i", "eth0", "203.0.113.77"]).stdout
    rtts = [float(x) * (1 if unit == "msec" else 0.001)
            for x, unit in re.findall(r"time=([0-9.]+) (usec|msec)", out)]
    capture_log = _finish(cap, timeout=30)
    sent = a1.stats()["frames_sent"]["eth0"]
    from scapy.all import ARP, ICMPv6ND_NA

    pkts = _read_pcap(seg, pcap)
    times = sorted(float(p.time) for p in pkts
                   if (ARP in p and p[ARP].psrc == p[ARP].pdst) or ICMPv6ND_NA in p and not p[ICMPv6ND_NA].S)
    assert sent == {"gratuitous": 2500, "mcast": 1500}  # 1,500 solicited-node joins paced too
    assert len(times) == 2 * len(v4) + len(v6) == 2500, capture_log
    worst, j = 0, 0
    for i, t in enumerate(times):  # most frames in any 1 s window
        while times[j] < t - 1.0:
            j += 1
        worst = max(worst, i - j + 1)
    # + 10 % of the rate: a frame is counted when its send is scheduled, and a thread delayed mid-pass on a
    # loaded machine sends late, into the next window (1,058 seen once against a bound of 1,055 on an idle
    # machine; 1,076 with both cores busy with other labs); unpaced, all 2,500 would leave within a fraction
    # of a second, and the span check below holds the average pace to the rate
    assert worst <= rate + burst + rate // 10, f"{worst} frames in one second, bound {rate} + burst {burst}"
    span = times[-1] - times[0]
    assert span >= (len(times) - burst) / rate * 0.9, f"2,500 frames in {span:.2f}s: not paced"
    print(f"pacing: {worst} frames in the busiest second, 2,500 frames over {span:.2f}s, arping rtt {rtts} ms")
    assert set_took < 1.0, f"set_announced blocked {set_took:.2f}s"
    # queued behind the paced burst they would wait seconds; 200 ms is a wide margin over ~1 ms
    assert len(rtts) == 3 and max(rtts) < 200, f"ARP answers delayed by the burst: {rtts} ms"
    assert "ff02::1:ff00:5db" in _maddrs(seg, n1.ns)  # last v6 VIP's group: 1,500 groups joined


def test_interfaces_selection_exclusions_and_hotplug(lab):
    """[] = every eligible interface (MetalLB's exclusions apply), a list = only those; new links are picked up."""
    seg = lab
    n1 = seg.hosts[0]
    seg.run(n1.ns, "ip link add docker0 type veth peer name veth0 && ip link set docker0 up && ip link set veth0 up")
    eligible = seg.python_json(n1.ns, "import json; from nocloudlb.l2 import eligible_interfaces; "
                                      "print(json.dumps(eligible_interfaces()))")
    assert eligible == ["eth0"]
    a1 = L2Agent(seg, n1.ns, "n1", rescan_interval=0.3)
    a1.set({VIP4: [], VIP4B: ["data1"]}, skip_check=[VIP4, VIP4B])
    assert a1.stats()["interfaces"] == ["eth0"]
    seen = who_has_many(seg, [VIP4, VIP4B], count=1, wait=0.2)
    assert list(seen[VIP4]) == [n1.mac] and seen[VIP4B] == {}  # data1 does not exist yet
    # A second link of n1 on the same segment appears: picked up by the rescan.
    data1 = seg.add_link(n1.ns, "data1")
    deadline = time.monotonic() + 5
    while a1.stats()["vips"][VIP4B]["interfaces"] != ["data1"]:
        assert time.monotonic() < deadline, a1.stats()
        time.sleep(0.1)
    assert a1.stats()["interfaces"] == ["data1", "eth0"]
    seen = who_has_many(seg, [VIP4, VIP4B], count=1, wait=0.2)
    # VIP4 on every eligible interface: both of n1's links answer (MetalLB does the same on a
    # multi-homed node; restrict with the L2Advertisement's interfaces). VIP4B only on data1.
    assert sorted(seen[VIP4]) == sorted([n1.mac, data1]) and list(seen[VIP4B]) == [data1]
    a1.set({VIP4: ["eth0"], VIP4B: ["data1"]})
    seen = who_has_many(seg, [VIP4, VIP4B], count=1, wait=0.2)
    assert list(seen[VIP4]) == [n1.mac] and list(seen[VIP4B]) == [data1]
    # The link goes away: the responder closes its socket and keeps serving the rest.
    seg.run(n1.ns, ["ip", "link", "del", "data1"])
    deadline = time.monotonic() + 5
    while "data1" in a1.stats()["interfaces"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert list(who_has(seg, VIP4, count=1, wait=0.2)) == [n1.mac]


def test_set_announced_rejects_bad_input_naming_it():
    import logging

    from nocloudlb.l2 import L2Announcer

    a = L2Announcer("n1", logging.getLogger("test"), registry=None)
    with pytest.raises(ValueError, match="'198.51.100.300' is not an IP address"):
        a.set_announced({"198.51.100.300": []})
    with pytest.raises(ValueError, match="interfaces of 198.51.100.1 must be a list of names, got 'eth0'"):
        a.set_announced({"198.51.100.1": "eth0"})
    with pytest.raises(ValueError, match="skip_check entry 'x' is not an IP address"):
        a.set_announced({}, skip_check=["x"])
    with pytest.raises(ValueError, match="rate must be >= 1, got 0"):
        L2Announcer("n1", logging.getLogger("test"), rate=0, registry=None)
