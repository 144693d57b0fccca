"""An address conflict as the speakers report it: real speakers, a foreign host, real packets.

A fourth namespace on the segment runs no speaker: its kernel owns one IPv4 and one IPv6 VIP
on its eth0 (arp_ignore=0, the ordinary way) before the speakers start. The elected leader's
RFC 5227 check hears that host answer, so the leader must not announce the address and must
say so: ``announcing: false``, reason ``ipConflict``, ``l2State: conflict`` in
``nocloudlb status --json``, the conflict in the top-level ``conflicts``, in the Prometheus
counter and gauge, and one ``ipConflict`` log event. The client sees only the foreign MAC.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from nocloudlb.core.election import election_order
from speaker_harness import Capture, SpeakerCluster, pool_docs, service_doc, spread_vips

pytestmark = pytest.mark.timeout(60)
NODES = ["n1", "n2", "n3"]
V6 = "2001:db8:1::201"


@pytest.fixture
def netns_prefix() -> str:
    return "ncf"


class ThreeOf:
    """The segment as the speaker cluster sees it: its first three hosts (the fourth is foreign)."""

    def __init__(self, seg: Any) -> None:
        self._seg = seg
        self.hosts = seg.hosts[:3]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._seg, name)


def cli(c: SpeakerCluster, node: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "nocloudlb.cli", "status", "--socket", c.sock(node), *args],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_leader_reports_a_foreign_owner_and_does_not_fight_it(make_segment, tmp_path):
    seg = make_segment(hosts=4)
    foreign = seg.hosts[3]
    vips = spread_vips(NODES)  # one IPv4 VIP led by each node
    taken = next(iter(vips))
    leader, v6_leader = vips[taken], election_order(NODES, V6)[0]
    # the foreign host owns the two addresses on eth0 and its kernel answers ARP/NS for them
    seg.run(foreign.ns, "sysctl -qw net.ipv4.conf.all.arp_ignore=0 net.ipv4.conf.eth0.arp_ignore=0"
                        f" && ip addr add {taken}/32 dev eth0 && ip addr add {V6}/128 dev eth0 nodad")
    resources = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
    resources.append(service_doc("v6", [V6]))
    c = SpeakerCluster(ThreeOf(seg), tmp_path, profile="fast", resources=resources)  # type: ignore[arg-type]
    cap = Capture(seg, tmp_path / "cap.txt")
    c.start_all()

    def row(node: str, ip: str) -> dict:
        return c.vip(node, ip)

    for ip, node in [(taken, leader), (V6, v6_leader)]:
        c.wait(lambda ip=ip, node=node: row(node, ip)["l2State"] == "conflict", 10, f"{node} finds {ip} taken")
    # the client sees only the foreign host's answer; the other VIPs are served by their leaders
    assert [a["mac"] for a in c.probe(taken)] == [foreign.mac]
    assert [a["mac"] for a in c.probe(V6)] == [foreign.mac]
    for ip, node in vips.items():
        if ip != taken:
            answers = c.wait(lambda ip=ip: c.probe(ip), 5, f"an answer for {ip}")
            assert [a["mac"] for a in answers] == [c.mac(node)]
            own = row(node, ip)
            assert own["announcing"] and own["l2State"] == "announcing" and own["conflict"] is None

    # `nocloudlb status --json` on the leader tells the truth
    st = json.loads(cli(c, leader, "--json"))
    mine = next(v for v in st["vips"] if v["ip"] == taken)
    assert mine["leader"] == leader and mine["announcing"] is False
    assert mine["reason"] == "ipConflict" and mine["l2State"] == "conflict"
    assert mine["conflict"]["mac"] == foreign.mac and mine["conflict"]["iface"] == "eth0"
    conflicts = {x["ip"]: x for x in st["conflicts"]}
    assert taken in conflicts and conflicts[taken]["mac"] == foreign.mac and conflicts[taken]["iface"] == "eth0"
    assert conflicts[taken]["at"].endswith("+00:00")
    assert set(conflicts) == {ip for ip, node in [(taken, leader), (V6, v6_leader)] if node == leader}
    human = cli(c, leader)
    # the status table (firsthour): role "conflict", reason ipConflict, the other MAC in the CONFLICT column
    assert any(line.startswith(taken) and line.split()[4:7] == ["conflict", "ipConflict", foreign.mac]
               and line.endswith(f"{foreign.mac} on eth0") for line in human.splitlines()), human
    assert f"CONFLICT {taken}: answered by {foreign.mac} on eth0" in human
    # the other nodes: not theirs, nothing handed to their L2 layer, no conflict
    for node in NODES:
        if node != leader:
            other = row(node, taken)
            assert other["reason"] == "notOwner" and other["l2State"] == "" and not other["announcing"]
            assert other["leader"] == leader
    # never fought: no gratuitous ARP from the leader for the taken address, but for its own VIPs
    assert cap.gratuitous(taken, c.mac(leader)) == []
    assert all(cap.gratuitous(ip, c.mac(node)) for ip, node in vips.items() if ip != taken)
    # metrics: the conflict counter and gauge; the taken address is not in speaker_announced
    text = seg.run(c.host(leader).ns, "curl -s http://127.0.0.1:7472/metrics").stdout
    assert f'nocloudlb_layer2_conflicts_total{{ip="{taken}"}} 1.0' in text, text
    assert f"nocloudlb_layer2_conflicts_current {float(len(conflicts))}" in text
    assert f'nocloudlb_speaker_announced{{ip="{taken}"' not in text
    # logs: one ipConflict per conflict (from the announcer), and no serviceAnnounced for it
    logged = [e for e in c.events(leader, "ipConflict") if e.get("ip") == taken]
    assert len(logged) == 1 and logged[0]["mac"] == foreign.mac
    assert not [e for n in NODES for e in c.events(n, "serviceAnnounced") if e.get("ip") in (taken, V6)]
    v6_row = row(v6_leader, V6)
    assert v6_row["reason"] == "ipConflict" and v6_row["conflict"]["mac"] == foreign.mac


def test_a_conflicted_vip_is_not_taken_unchecked_when_its_leader_stops(make_segment, tmp_path):
    """The leader of a VIP a foreign host answers for is frozen, then killed: the next node takes the VIP
    from a member it saw lead it, which normally skips the RFC 5227 check (failover speed). That member never
    announced it (it reported the conflict), so the taker must check and find the foreign host too: the
    client never hears a speaker's MAC for the address (CI at ed12843: a frozen leader's successor answered
    beside the foreign host)."""
    seg = make_segment(hosts=4)
    foreign = seg.hosts[3]
    vips = spread_vips(NODES)
    taken = next(iter(vips))
    leader = vips[taken]
    successor = election_order(NODES, taken)[1]
    seg.run(foreign.ns, "sysctl -qw net.ipv4.conf.all.arp_ignore=0 net.ipv4.conf.eth0.arp_ignore=0"
                        f" && ip addr add {taken}/32 dev eth0")
    resources = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
    c = SpeakerCluster(ThreeOf(seg), tmp_path, profile="fast", resources=resources)  # type: ignore[arg-type]
    cap = Capture(seg, tmp_path / "cap.txt")
    c.start_all()
    c.wait(lambda: c.vip(leader, taken)["l2State"] == "conflict", 10, f"{leader} finds {taken} taken")
    time.sleep(0.5)  # the conflict reaches the peers by gossip (a few rounds of 100 ms)
    ours = {c.mac(n) for n in NODES}

    # frozen: its peers suspect it within ~100 ms (fast) and the successor takes the VIP over, with the check
    c.send_signal(leader, signal.SIGSTOP)
    try:
        heard: list[str] = []
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            heard += [a["mac"] for a in c.probe(taken, 0.2)]
        st = c.vip(successor, taken)
    finally:
        c.send_signal(leader, signal.SIGCONT)
    assert st["leader"] == successor, st
    assert st["l2State"] == "conflict" and st["conflict"]["mac"] == foreign.mac, st
    assert set(heard) == {foreign.mac}, heard
    c.wait(lambda: c.vip(successor, taken)["leader"] == leader, 10, f"{leader} leads {taken} again")

    # killed: the same from a member that is gone
    c.stop(leader)
    c.wait(lambda: c.vip(successor, taken)["l2State"] == "conflict", 10, f"{successor} finds {taken} taken")
    for _probe in range(5):
        assert [a["mac"] for a in c.probe(taken, 0.2)] == [foreign.mac]
    assert not [f for f in cap.gratuitous(taken) if f["src"] in ours]
