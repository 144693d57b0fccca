"""Acceptance of the speaker daemon: three real ``nocloudlb speaker`` processes, each in its own
network namespace on one bridge, and a client that sees real ARP/NDP and ICMP packets.

Uses the ``fast`` profile (dead in ~0.6-0.95 s) so the whole file stays short.
"""

from __future__ import annotations

import datetime
import signal
import socket
import subprocess
import sys
import time

import pytest
from nocloudlb.core.election import DRAIN_LABEL, election_order
from nocloudlb.membership import generate_key
from speaker_harness import (
    Capture,
    HttpPoller,
    SpeakerCluster,
    pool_docs,
    service_doc,
    spread_vips,
    start_slow_http,
)

pytestmark = pytest.mark.timeout(120)
NODES = ["n1", "n2", "n3"]


@pytest.fixture
def netns_prefix() -> str:
    return "nsp"


def resources_for(vips: dict[str, str], extra: list[dict] | None = None) -> list[dict]:
    docs = pool_docs()
    for i, ip in enumerate(sorted(vips)):
        docs.append(service_doc(f"svc{i}", [ip]))
    return docs + (extra or [])


@pytest.fixture
def cluster(make_segment, tmp_path):
    def build(vips: dict[str, str], profile: str = "fast", extra: list[dict] | None = None, **kw) -> SpeakerCluster:
        seg = make_segment(hosts=3)
        return SpeakerCluster(seg, tmp_path, profile=profile, resources=resources_for(vips, extra), **kw)

    return build


@pytest.fixture
def running(cluster, tmp_path):
    """Three speakers up with VIPs spread over them, the first VIP answered, a capture on the
    segment: returns (cluster, that VIP, its leader, the next node in its order, capture)."""
    def start(profile: str = "fast") -> tuple[SpeakerCluster, str, str, str, Capture]:
        vips = spread_vips(NODES)
        c = cluster(vips, profile=profile)
        c.start_all()
        ip = next(iter(vips))
        first, second = election_order(NODES, ip)[:2]
        c.wait(lambda: c.probe(ip), 5, "first answer")
        return c, ip, first, second, Capture(c.seg, tmp_path / "cap.txt")

    return start


def test_one_answer_per_vip_from_the_elected_mac(cluster, tmp_path):
    vips = spread_vips(NODES)
    v6 = "2001:db8:1::200"
    c = cluster(vips, extra=[service_doc("v6", [v6])])
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(10)
    c.env["n1"] = {"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1000000"}
    c.start_all()
    # sd_notify: READY=1 once membership and config are in, then WATCHDOG=1 every WatchdogSec/2
    got: list[str] = []
    while not (any(g.startswith("READY=1") for g in got) and got[-2:] == ["WATCHDOG=1", "WATCHDOG=1"]):
        got.append(notify.recv(200).decode())  # times out (fails) after 10 s of silence
    notify.close()
    for ip, leader in vips.items():
        answers = c.wait(lambda ip=ip: c.probe(ip), 5, f"an ARP answer for {ip}")
        assert [a["mac"] for a in answers] == [c.mac(leader)], (ip, leader, answers)
    assert sorted(set(vips.values())) == NODES  # different VIPs spread across the nodes
    v6_leader = election_order(NODES, v6)[0]
    answers = c.wait(lambda: c.probe(v6), 5, "an NA for the IPv6 VIP")
    assert [a["mac"] for a in answers] == [c.mac(v6_leader)]
    assert c.probe("198.51.100.239") == []  # in the pool, assigned to nobody: unanswered
    # every node agrees on every leader, and holds every VIP on lo (failover moves no address)
    for n in NODES:
        st = c.status(n)
        for row in st["vips"]:
            expected = vips.get(row["ip"], v6_leader)
            assert row["leader"] == expected and row["announcing"] == (n == expected)
            assert row["reason"] == ("" if n == expected else "notOwner") and row["onLo"]
        lo = c.seg.run(c.host(n).ns, "ip -o addr show dev lo").stdout
        assert all(f" {ip}/" in lo for ip in [*vips, v6]), lo
        assert st["config"]["state"] == "ok" and st["memberlist"]["encrypted"]
    # the CLI: human and JSON status, and probe (arping-like) from the client
    ip0, leader0 = next(iter(vips.items()))
    out = subprocess.run([sys.executable, "-m", "nocloudlb.cli", "status", "--socket", c.sock(leader0)],
                         capture_output=True, text=True, timeout=30, check=False).stdout
    assert f"node {leader0}  ready yes" in out and "gossip joined" in out and "profile fast" in out, out
    row = next(line.split() for line in out.splitlines() if line.startswith(ip0 + " "))
    assert row[3] == leader0 and row[4] == "owner", out  # VIP SERVICE POOL OWNER THIS-NODE ...
    out = c.seg.run(c.seg.client.ns, [sys.executable, "-m", "nocloudlb.cli", "probe", ip0, "-i", "eth0",
                                      "--timeout", "0.5"]).stdout
    assert f"{ip0} is at {c.mac(leader0)} on eth0" in out
    # metrics mirror MetalLB's names
    leader = vips and next(iter(vips.values()))
    text = c.seg.run(c.host(leader).ns, "curl -s http://127.0.0.1:7472/metrics").stdout
    assert 'nocloudlb_memberlist_members{state="alive"} 3.0' in text
    assert "nocloudlb_config_loaded_bool 1.0" in text and "nocloudlb_config_stale_bool 0.0" in text
    assert f'nocloudlb_speaker_announced{{ip="{next(ip for ip, n in vips.items() if n == leader)}",node="{leader}"' \
           in text
    assert "nocloudlb_layer2_requests_received_total" in text


def test_kill9_failover_then_restarted_node_takes_its_vip_back(running):
    c, ip, first, second, cap = running()
    # the client talks to the VIP; its ARP cache now points at the leader
    c.seg.run(c.seg.client.ns, f"ping -c 2 -i 0.2 -W 1 {ip}")
    t_kill = c.stop(first, signal.SIGKILL)
    garps = c.wait(lambda: cap.gratuitous(ip, c.mac(second), t_kill), 5, f"gratuitous ARP from {second}")
    took = garps[0]["ts"] - t_kill
    print(f"kill -9 -> first gratuitous ARP from {second}: {took * 1000:.0f} ms")
    assert took < 3.0  # fast profile: dead after ~0.6-0.95 s
    assert [a["mac"] for a in c.probe(ip)] == [c.mac(second)]
    # traffic resumes, and the reply comes from the new owner's MAC
    t_ping = time.time()
    c.seg.run(c.seg.client.ns, f"ping -c 3 -i 0.2 -W 1 {ip}")
    replies = cap_wait_icmp(c, cap, ip, t_ping)
    assert {r["src"] for r in replies} == {c.mac(second)}
    st = c.status(second)
    assert st["vips"][[v["ip"] for v in st["vips"]].index(ip)]["announcing"]
    assert {m["name"]: m["state"] for m in st["members"]}[first] == "dead"
    # the node first in the order comes back and takes its VIP back (MetalLB's behaviour)
    t_restart = time.time()
    c.start(first)
    c.wait(lambda: c.announcing(first, ip), 15, f"{first} announcing {ip} again")
    c.wait(lambda: cap.gratuitous(ip, c.mac(first), t_restart), 5, f"gratuitous ARP from {first}")
    c.wait(lambda: not c.announcing(second, ip), 5, f"{second} withdrew {ip}")
    assert c.vip(second, ip)["reason"] == "notOwner" and c.vip(second, ip)["leader"] == first
    withdrawn = [e for e in c.events(second, "serviceWithdrawn") if e["ip"] == ip]
    assert withdrawn and withdrawn[-1]["reason"] == "notOwner" and withdrawn[-1]["leader"] == first
    assert any(e["ip"] == ip for e in c.events(first, "serviceAnnounced"))
    assert [a["mac"] for a in c.probe(ip)] == [c.mac(first)]


def cap_wait_icmp(c: SpeakerCluster, cap: Capture, ip: str, after: float) -> list[dict]:
    return c.wait(lambda: cap.icmp_replies(ip, after), 3, f"echo replies from {ip}")


def test_sigterm_hands_over_without_waiting_for_failure_detection(running):
    # lan profile: a crash takes ~1.5-2.5 s to detect; a graceful leave must be far faster
    c, ip, first, second, cap = running("lan")
    t_term = c.send_signal(first, signal.SIGTERM)
    garps = c.wait(lambda: cap.gratuitous(ip, c.mac(second), t_term), 5, "gratuitous ARP after SIGTERM")
    took = garps[0]["ts"] - t_term
    print(f"SIGTERM -> first gratuitous ARP from {second}: {took * 1000:.0f} ms")
    assert took < 1.0, took  # measured ~5 ms; lan's failure detection takes >= 1.5 s
    assert c.procs[first].wait(timeout=10) == 0
    st = c.status(second)
    assert {m["name"]: m["state"] for m in st["members"]}[first] == "left"
    assert [a["mac"] for a in c.probe(ip)] == [c.mac(second)]


def test_drain_label_moves_vip_without_losing_a_ping_and_persists(running):
    c, ip, first, second, cap = running()
    ping = c.seg.popen(c.seg.client.ns, ["ping", "-n", "-i", "0.01", "-c", "400", "-W", "1", ip])
    time.sleep(1.0)
    t_drain = time.time()
    out = subprocess.run([sys.executable, "-m", "nocloudlb.cli", "label", "--socket", c.sock(first), "set",
                          f"{DRAIN_LABEL}=true"], capture_output=True, text=True, timeout=10, check=False)
    assert out.returncode == 0, out.stderr
    c.wait(lambda: cap.gratuitous(ip, c.mac(second), t_drain), 5, "the new owner's gratuitous ARP")
    assert c.procs[first].poll() is None  # the old owner is still up
    assert c.vip(first, ip)["reason"] == "drained"
    stdout, dummy = ping.communicate(timeout=30)
    assert " 400 received" in stdout and " 0% packet loss" in stdout, stdout
    # the label is gossiped, persisted, and a restart keeps the node drained
    assert DRAIN_LABEL in {m["name"]: m["labels"] for m in c.status(second)["members"]}[first]
    c.stop(first, signal.SIGTERM)
    c.start(first)
    c.wait(lambda: c.members_alive(first) == set(NODES), 15, "restarted node back in the cluster")
    time.sleep(0.5)
    assert c.vip(first, ip)["reason"] == "drained" and c.status(first)["labels"][DRAIN_LABEL] == "true"
    assert [a["mac"] for a in c.probe(ip)] == [c.mac(second)]
    # undrain: the VIP goes back to the first node in the order
    assert c.status(first) and subprocess.run(
        [sys.executable, "-m", "nocloudlb.cli", "label", "--socket", c.sock(first), "unset", DRAIN_LABEL],
        capture_output=True, timeout=10, check=False).returncode == 0
    c.wait(lambda: c.announcing(first, ip), 5, "undrained node announcing again")


def test_drain_and_undrain_keep_connections_in_flight(running):
    """Each planned move flips the client's ARP entry while a 50 ms request is in flight to the old
    owner; the new owner passes that connection on (l2/handover.py) instead of resetting it."""
    c, ip, first, second, dummy_cap = running()
    start_slow_http(c)
    c.wait(lambda: c.seg.run(c.seg.client.ns, ["curl", "-s", "-m", "2", f"http://{ip}:8090/"],
                             check=False).stdout.strip() == first, 10, "slow HTTP served by the leader")
    poll = HttpPoller(c.seg, f"http://{ip}:8090/", 60)
    cli = [sys.executable, "-m", "nocloudlb.cli", "label", "--socket", c.sock(first)]
    for _dummy_round in range(2):
        t = time.time()
        assert subprocess.run([*cli, "set", f"{DRAIN_LABEL}=true"], capture_output=True, timeout=10,
                              check=False).returncode == 0
        c.wait(lambda t=t: poll.served_by(second, t), 10, f"{second} serving after the drain")
        forwarded = c.seg.run(c.host(second).ns, ["nft", "list", "map", "netdev", "nocloudlb_handover", "prev4"]).stdout
        assert ip in forwarded and c.mac(first) in forwarded, forwarded
        time.sleep(1.5)
        t = time.time()
        assert subprocess.run([*cli, "unset", DRAIN_LABEL], capture_output=True, timeout=10,
                              check=False).returncode == 0
        c.wait(lambda t=t: poll.served_by(first, t), 10, f"{first} serving again after the undrain")
        time.sleep(1.5)
    poll.stop()
    print(f"{len(poll.samples)} slow requests, {poll.moves} owner changes, {len(poll.failed)} failed")
    assert poll.moves >= 4 and not poll.failed, poll.failed[:5]


def test_wrong_gossip_key_cannot_join_and_says_why(cluster):
    vips = spread_vips(NODES)
    c = cluster(vips)
    c.set_key_file("n3", [generate_key()])
    for n in ("n1", "n2"):
        c.start(n)
    c.wait(lambda: c.members_alive("n1") == {"n1", "n2"}, 15, "n1 and n2 joined")
    c.start("n3")
    # it does not fight the cluster: nothing announced in any status read, and once the reconcile after the
    # failed join has run (the rows lag the memberlist state by that pass: "notReady" until then), the reason
    announced: list[dict] = []
    last: dict = {}

    def refused() -> dict | None:
        s = c.try_status("n3")
        if not s:
            return None
        last.update(memberlist=s["memberlist"].get("state"), reasons=sorted({v["reason"] for v in s["vips"]}))
        announced.extend(v for v in s["vips"] if v["announcing"])
        joined_failed = s["memberlist"]["state"] == "joinFailed"
        return s if joined_failed and all(v["reason"] == "joinRefused" for v in s["vips"]) else None

    try:
        st = c.wait(refused, 15, "n3 reports a failed join and joinRefused for every VIP")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status read: {last}") from None
    assert not announced, announced
    assert "gossip key" in st["memberlist"]["error"]
    assert {m["name"] for m in st["members"] if m["state"] == "alive"} == {"n3"}
    assert any("gossip key" in e.get("msg", "") for e in c.events("n3", "memberlistJoinFailed"))
    c.wait(lambda: c.events("n1", "memberlistDecryptFailures") or c.events("n2", "memberlistDecryptFailures"), 15,
           "the cluster's side logs undecryptable packets")
    assert c.members_alive("n1") == {"n1", "n2"}
    for ip in vips:
        assert len(c.probe(ip)) == 1


def test_bad_config_on_sighup_is_refused_and_old_config_served(cluster):
    vips = spread_vips(NODES)
    c = cluster(vips)
    c.start_all()
    ip = next(iter(vips))
    leader = vips[ip]
    before = c.status(leader)
    bad = c.config(leader)
    bad["resources"] = [*bad["resources"], {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                                            "metadata": {"name": "broken"}, "spec": {"addresses": ["10.0.0.300/32"]}}]
    c.write_config(leader, bad)
    out = subprocess.run([sys.executable, "-m", "nocloudlb.cli", "validate", str(c.config_path(leader))],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 1 and "10.0.0.300/32" in out.stderr and 'IPAddressPool "broken"' in out.stderr
    c.send_signal(leader, signal.SIGHUP)
    st = c.wait(lambda: (s := c.status(leader))["config"]["state"] == "error" and s, 5, "config state error")
    assert any("10.0.0.300/32" in e for e in st["config"]["errors"])
    assert st["config"]["lastGoodAt"] == before["config"]["lastGoodAt"]
    assert c.vip(leader, ip)["announcing"] and [a["mac"] for a in c.probe(ip)] == [c.mac(leader)]
    stale = c.events(leader, "configStale")
    assert stale and any("10.0.0.300/32" in e for e in stale[-1]["errors"])
    text = c.seg.run(c.host(leader).ns, "curl -s http://127.0.0.1:7472/metrics").stdout
    assert "nocloudlb_config_stale_bool 1.0" in text
    # a good config with a new service is taken on the next reload
    new_ip = "198.51.100.238"
    good = c.config(leader, resources=[*c.resources, service_doc("late", [new_ip])])
    for n in NODES:
        c.write_config(n, good if n == leader else c.config(n, resources=good["resources"]))
        c.send_signal(n, signal.SIGHUP)
    c.wait(lambda: c.status(leader)["config"]["state"] == "ok", 5, "config ok again")
    new_leader = election_order(NODES, new_ip)[0]
    answers = c.wait(lambda: c.probe(new_ip), 5, "the new VIP answered")
    assert [a["mac"] for a in answers] == [c.mac(new_leader)]


def test_key_rotation_via_reload_keeps_membership(cluster):
    vips = spread_vips(NODES)
    c = cluster(vips)
    old, new = c.keys[0], generate_key()
    c.start_all()
    time.sleep(0.5)
    since = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    for step in ([old, new], [new, old], [new]):
        for n in NODES:
            c.set_key_file(n, step)
            c.send_signal(n, signal.SIGHUP)
        c.wait(lambda step=step: all(len(c.status(n)["memberlist"]["keyIds"]) == len(step) for n in NODES), 5,
               f"every node on keys step {len(step)}")
        time.sleep(0.6)  # a few probe rounds under the new key set
        assert all(c.members_alive(n) == set(NODES) for n in NODES)
    time.sleep(1.5)
    assert all(c.members_alive(n) == set(NODES) for n in NODES)
    for n in NODES:
        during = [e for e in c.events(n) if e["ts"] >= since]
        assert not [e for e in during if e["event"] in ("nodeFailed", "nodeSuspect", "serviceWithdrawn")], during
        assert len([e for e in during if e["event"] == "memberlistKeysChanged"]) == 3
        assert c.status(n)["config"]["state"] == "ok"


def test_local_policy_follows_gossiped_health(cluster):
    ip = next(x for x in (f"198.51.100.{i}" for i in range(200, 240)) if election_order(NODES, x)[0] == "n1")
    order = election_order(NODES, ip)
    check = {"nocloud.io/health-check": '{"type": "http", "port": 18080, "path": "/", "interval": 0.2, '
                                        '"timeout": 0.2, "rise": 1, "fall": 2}'}
    c = cluster({}, extra=[service_doc("local", [ip], policy="Local", annotations=check)])
    servers = {}
    for n in order[1:]:  # a backend on every node but the first in the order
        servers[n] = c.seg.popen(c.host(n).ns, [sys.executable, "-m", "http.server", "18080", "--bind", "127.0.0.1"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c.start_all()
    second, third = order[1], order[2]
    c.wait(lambda: c.announcing(second, ip), 10, f"{second} announcing (first node has no backend)")
    row = c.vip(order[0], ip)
    assert row["reason"] == "noHealthyBackend" and row["leader"] == second
    assert [a["mac"] for a in c.probe(ip)] == [c.mac(second)]
    # health is gossiped: every node sees the same leader
    assert all(c.vip(n, ip)["leader"] == second for n in NODES)
    c.seg.kill(servers[second], signal.SIGKILL)
    c.wait(lambda: c.announcing(third, ip), 10, f"{third} takes over when {second}'s backend dies")
    assert c.vip(second, ip)["reason"] == "noHealthyBackend"
    assert c.status(second)["health"]["test/local"]["healthy"] is False
    assert any(e["service"] == "test/local" and e["reason"] == "noHealthyBackend"
               for e in c.events(second, "serviceWithdrawn"))
    assert [a["mac"] for a in c.probe(ip)] == [c.mac(third)]
