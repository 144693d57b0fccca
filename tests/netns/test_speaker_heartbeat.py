"""Direct heartbeats (speaker/nocloudlb/heartbeat.py) between three real speakers in namespaces.

- a leader wrongly suspected (only its heartbeat port blocked, gossip fine) loses its VIP to the next
  node, which forwards toward it: a TCP connection held through the VIP goes on; when heartbeats
  return the leader takes the VIP back, one MAC answering at every probe;
- the packets a node sends per second do not grow with the VIPs it leads (1 vs 500);
- kill -9 of a leader: the next node takes over on the heartbeat's suspicion, before gossip
  declares the leader dead.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import yaml
from nocloudlb.core.election import election_order
from speaker_harness import Capture, SpeakerCluster, pool_docs, service_doc, spread_vips

pytestmark = pytest.mark.timeout(150)
NODES = ["n1", "n2", "n3"]
HB_PORT = 7947  # gossip 7946 + the profiles' heartbeatPortOffset 1


@pytest.fixture
def netns_prefix() -> str:
    return "nhb"


def resources_for(vips) -> list[dict]:
    return pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]


# a TCP server on every node answering each line with the node's name
ECHO = r"""
import socket, socketserver, sys
class H(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            self.wfile.write((sys.argv[1] + "\n").encode())
class S(socketserver.ThreadingTCPServer):
    address_family = socket.AF_INET6
    allow_reuse_address = True
    daemon_threads = True
S(("::", 8091), H).serve_forever()
"""

# a client holding one connection: one line out and one answer back per line on stdin
HOLD = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], 8091), timeout=3)
f = s.makefile("rw")
for line in sys.stdin:
    try:
        f.write("x\n"); f.flush()
        print(f.readline().strip() or "closed", flush=True)
    except OSError as exc:
        print("error " + type(exc).__name__, flush=True)
"""


def ask(proc: subprocess.Popen) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def block_heartbeats(c: SpeakerCluster, name: str, on: bool) -> None:
    ns = c.host(name).ns
    if on:
        c.seg.run(ns, ["nft", "-f", "-"], input=(
            "table inet hbblock {\n"
            f"  chain in {{\n    type filter hook input priority -10;\n    udp dport {HB_PORT} drop\n  }}\n"
            f"  chain out {{\n    type filter hook output priority -10;\n    udp dport {HB_PORT} drop\n  }}\n"
            "}\n"))
    else:
        c.seg.run(ns, ["nft", "delete", "table", "inet", "hbblock"])


def started_cluster(make_segment, tmp_path) -> tuple[SpeakerCluster, str, str, str]:
    """Three `fast` speakers started, a VIP each; one VIP with its leader and the next node in its order."""
    vips = spread_vips(NODES)
    ip = next(iter(vips))
    first, second = election_order(NODES, ip)[:2]
    c = SpeakerCluster(make_segment(hosts=3), tmp_path, profile="fast", resources=resources_for(vips))
    c.start_all()
    return c, ip, first, second


def test_wrongly_suspected_leader_keeps_its_connection_and_takes_the_vip_back(make_segment, tmp_path):
    c, ip, first, second = started_cluster(make_segment, tmp_path)
    for n in NODES:
        c.seg.popen(c.host(n).ns, [sys.executable, "-u", "-c", ECHO, n])
    cap = Capture(c.seg, tmp_path / "cap.txt", expr="arp")
    hold = c.seg.popen(c.seg.client.ns, [sys.executable, "-u", "-c", HOLD, ip], stdin=subprocess.PIPE)
    c.wait(lambda: ask(hold) == first, 10, f"the held connection served by {first}")

    t = time.time()
    block_heartbeats(c, first, True)
    c.wait(lambda: cap.gratuitous(ip, c.mac(second), t), 10, f"{second}'s gratuitous ARP")
    # only suspected: gossip still holds the leader alive, and it yielded (one owner)
    assert {m["name"]: m["state"] for m in c.status(second)["members"]}[first] in ("alive", "suspect")
    assert first in c.status(second)["heartbeat"]["suspected"]
    # cut off (it hears no heartbeat): no quorum, it kept the VIP, and yielded it when the new owner's
    # gratuitous ARP reached it (the wire is the last word)
    c.wait(lambda: c.vip(first, ip)["reason"] in ("suspectedByPeer", "yieldedOnWire"), 5, f"{first} yielded {ip}")
    assert c.status(first)["heartbeat"]["cutOff"]
    assert not c.status(first)["heartbeat"]["quorum"]["has"]
    c.wait(lambda: [a["mac"] for a in c.probe(ip)] == [c.mac(second)], 5, f"only {second} answers")
    fwd = c.seg.run(c.host(second).ns, ["nft", "list", "map", "netdev", "nocloudlb_handover", "prev4"]).stdout
    assert ip in fwd and c.mac(first) in fwd, fwd
    # the client's ARP entry now points at the new owner; the connection still reaches the old one
    for _i in range(3):
        assert ask(hold) == first
        time.sleep(0.2)

    t = time.time()
    block_heartbeats(c, first, False)
    c.wait(lambda: cap.gratuitous(ip, c.mac(first), t), 10, f"{first} takes {ip} back")
    c.wait(lambda: c.announcing(first, ip) and not c.announcing(second, ip), 5, "one owner again")
    for _i in range(3):
        macs = [a["mac"] for a in c.probe(ip)]
        if macs != [c.mac(first)]:
            import json
            print({n: c.mac(n) for n in NODES})
            for n in NODES:
                st = c.status(n)
                print(n, c.vip(n, ip), json.dumps(st["heartbeat"]), st["modes"]["l2"]["announced"])
        assert macs == [c.mac(first)]
    assert ask(hold) == first  # never reset
    assert not c.status(second)["heartbeat"]["suspected"]
    Segment_kill(hold)


def Segment_kill(proc: subprocess.Popen) -> None:  # noqa: N802
    from netns import Segment

    Segment.kill(proc)


def out_udp_packets(c: SpeakerCluster, name: str) -> int:
    out = c.seg.run(c.host(name).ns, ["nft", "list", "chain", "inet", "hbcount", "out"]).stdout
    return int(out.split("packets ")[1].split()[0])


def test_packets_sent_per_node_do_not_grow_with_the_vips_it_leads(make_segment, tmp_path):
    """n1 alone may announce (nodeSelector rack: n1): it leads 1 VIP, then 500 after a reload; the UDP
    packets it sends (gossip and heartbeats) per second stay the same."""
    adv = {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "default"},
           "spec": {"ipAddressPools": ["default"], "nodeSelectors": [{"matchLabels": {"rack": "n1"}}]}}
    pool = {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "default"},
            "spec": {"addresses": ["2001:db8:5::1-2001:db8:5::1f4"]}}

    def docs(n: int) -> list[dict]:
        return [pool, adv] + [service_doc(f"s{i}", [f"2001:db8:5::{i + 1:x}"]) for i in range(n)]

    c = SpeakerCluster(make_segment(hosts=3), tmp_path, profile="fast", resources=docs(1))
    c.seg.run(c.host("n1").ns, ["nft", "-f", "-"], input=(
        "table inet hbcount {\n  chain out {\n    type filter hook output priority 0;\n"
        "    meta l4proto udp counter\n  }\n}\n"))
    c.start_all()

    def rate(seconds: float = 4.0) -> float:
        a, t = out_udp_packets(c, "n1"), time.monotonic()
        time.sleep(seconds)
        return (out_udp_packets(c, "n1") - a) / (time.monotonic() - t)

    c.wait(lambda: sum(v["announcing"] for v in c.status("n1")["vips"]) == 1, 10, "n1 leads 1 VIP")
    time.sleep(1.0)
    one = rate()
    for n in NODES:
        c.config_path(n).write_text(yaml.safe_dump(c.config(n, resources=docs(500))))
        c.send_signal(n, signal.SIGHUP)
    c.wait(lambda: sum(v["announcing"] for v in c.status("n1")["vips"]) == 500, 60, "n1 leads 500 VIPs")
    time.sleep(3.0)  # past the gratuitous announcements' schedule (they are per VIP, once per gain)
    many = rate()
    print(f"UDP packets/s sent by n1: {one:.0f} leading 1 VIP, {many:.0f} leading 500")
    # heartbeats alone: 2 peers / 25 ms = 80/s; the same order with 500 VIPs (wide margin for load)
    assert one > 20, one
    assert many < one * 1.5 + 20, (one, many)


def test_kill9_leader_is_replaced_on_heartbeat_suspicion_before_gossip_declares_it_dead(make_segment, tmp_path):
    c, ip, first, second = started_cluster(make_segment, tmp_path)
    cap = Capture(c.seg, tmp_path / "cap.txt", expr="arp")
    time.sleep(0.5)
    t = c.stop(first, signal.SIGKILL)
    g = c.wait(lambda: cap.gratuitous(ip, c.mac(second), t), 10, f"{second}'s gratuitous ARP")
    took = g[0]["ts"] - t
    print(f"kill -9 -> first gratuitous ARP from {second}: {took * 1000:.0f} ms")
    assert took < 1.5, took  # loose: the fast profile suspects after 100 ms
    c.wait(lambda: {m["name"]: m["state"] for m in c.status(second)["members"]}[first] == "dead", 10,
           "gossip declares it dead")
    wanted = ("nodeUnreachable", "nodeFailed")
    evs = [e for e in c.events(second) if e.get("node") == first and e.get("event") in wanted]
    assert [e["event"] for e in evs][:1] == ["nodeUnreachable"], evs  # the heartbeat suspected it first
