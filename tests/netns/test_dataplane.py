"""The data plane on real nftables and real TCP/UDP traffic between namespaces (root only).

Each test builds dataplane_harness's segment: directors n1, n2 (DataplaneMode), real
servers n3, n4, client 192.0.2.10. Claims are read from client traffic, the real servers'
view of the peer address, and captures.
"""

from __future__ import annotations

import time

import pytest
from dataplane_harness import (
    CLIENT,
    HOLD_CODE,
    VIP,
    backends_of,
    directors,
    in_table,
    point_client,
    prepare,
    requests,
    resources,
    spread,
)


@pytest.fixture
def netns_prefix() -> str:
    return "ndp"


@pytest.fixture
def lab(make_segment):
    seg = make_segment(hosts=4)
    with directors(seg) as director:
        yield seg, director


def all_in(n: int):
    return lambda st: len(in_table(st)) == n


def test_nat_round_robin_spreads_and_replies_return_through_the_director(lab):
    seg, director = lab
    prepare(seg, "nat")
    d1 = director(0)
    d1.apply(resources("nat", "rr"))
    d1.wait_programmed(all_in(2))
    point_client(seg, seg.hosts[0])
    answers = requests(seg, 20)
    assert spread(answers) == {"n3": 10, "n4": 10}, answers  # numgen inc: strict alternation
    assert {a.split()[1] for a in answers} == {CLIENT}  # NAT: the server sees the client's address
    udp = requests(seg, 10, "udp")
    assert spread(udp) == {"n3": 5, "n4": 5}, udp
    st = d1.cmd("status")
    assert sorted(b["packets"] for b in backends_of(st)) == [10, 10]  # one counted first packet per connection


def test_fullnat_backend_sees_the_director(lab):
    seg, director = lab
    prepare(seg, "fullnat")  # the real servers have no route to the client at all
    d1 = director(0)
    d1.apply(resources("fullnat", "wrr", servers=[{"address": "198.51.100.13", "weight": 3},
                                                  {"address": "198.51.100.14", "weight": 1}]))
    d1.wait_programmed(all_in(2))
    point_client(seg, seg.hosts[0])
    answers = requests(seg, 20)
    assert spread(answers) == {"n3": 15, "n4": 5}, answers  # wrr 3:1
    assert {a.split()[1] for a in answers} == {seg.hosts[0].ipv4}  # full-NAT: the server sees the director


def test_dr_signature_in_a_capture(lab):
    seg, director = lab
    prepare(seg, "dr")
    d1 = director(0)
    d1.apply(resources("dr", "sh", ports=((80, "TCP"),)))
    d1.wait_programmed(all_in(2))
    point_client(seg, seg.hosts[0])
    c, n1 = seg.client, seg.hosts[0]
    cap_c = seg.popen(c.ns, ["tcpdump", "-i", "eth0", "-e", "-nn", "-l", "-Q", "in", "tcp port 80"])
    cap_d = seg.popen(n1.ns, ["tcpdump", "-i", "eth0", "-e", "-nn", "-l", f"tcp and src host {VIP}"])
    time.sleep(1.5)
    answers = requests(seg, 12)
    time.sleep(0.5)
    seg.kill(cap_c)
    seg.kill(cap_d)
    names = spread(answers)
    assert sum(names.values()) == 12 and set(names) <= {"n3", "n4"}, answers
    assert {a.split()[1] for a in answers} == {CLIENT}  # DR: the server sees the client
    macs = {seg.hosts[2].mac: "n3", seg.hosts[3].mac: "n4"}
    replies = [line for line in cap_c.stdout.read().splitlines() if f"{VIP}.80 >" in line]
    assert replies
    sources = {line.split()[1] for line in replies}
    assert sources <= set(macs) and n1.mac not in sources  # the reply's source MAC is the real server's
    assert {macs[m] for m in sources} == set(names)
    assert cap_d.stdout.read().strip() == ""  # and no reply passes the director


def test_failed_backend_gets_no_new_connections_within_fall(lab):
    seg, director = lab
    prepare(seg, "nat")
    d1 = director(0)
    d1.apply(resources("nat", "rr", health='{"type": "tcp", "interval": 0.5, "timeout": 0.4, "rise": 2, "fall": 2}'))
    d1.wait_programmed(all_in(2))
    point_client(seg, seg.hosts[0])
    assert set(spread(requests(seg, 4))) == {"n3", "n4"}
    n3 = seg.hosts[2]
    t0 = time.monotonic()
    seg.run(n3.ns, "nft add table inet blk && nft add chain inet blk in '{ type filter hook input priority 0; }' "
                   "&& nft add rule inet blk in tcp dport 80 reject with tcp reset")
    st = d1.wait_programmed(lambda st: in_table(st) == {"198.51.100.14:80"}, timeout=15)
    drained = time.monotonic() - t0
    assert drained < 0.5 * 2 + 0.4 + 3.0, drained  # fall x interval + timeout, plus a wide margin for load
    assert [b["healthy"] for b in backends_of(st)] == [False, True]
    assert spread(requests(seg, 10)) == {"n4": 10}
    seg.run(n3.ns, "nft delete table inet blk")
    d1.wait_programmed(all_in(2), timeout=15)  # rise: back in the table
    assert set(spread(requests(seg, 4))) == {"n3", "n4"}


def _hold(seg, port):
    import subprocess
    import sys

    p = seg.popen(seg.client.ns, [sys.executable, "-u", "-c", HOLD_CODE, VIP, str(port), "3"], stdin=subprocess.PIPE)
    first = p.stdout.readline().strip()

    def again() -> str:
        p.stdin.write("x\n")
        p.stdin.flush()
        return p.stdout.readline().strip()
    return first, again


@pytest.mark.parametrize("method", ["dr", "nat", "fullnat-vip"])
def test_maglev_takeover_keeps_established_connections(lab, method):
    """Both directors programmed alike; the client's frames move from n1 to n2 (a takeover).
    DR: every packet is hashed, and Maglev's table is the same on both: the flow stays on its
    server. NAT: n2 picks the mid-stream flow up (conntrack's loose TCP pickup), the same hash
    sends it to the same server, and the servers' gateway must follow (here: re-pointed).
    Full-NAT with snatAddress = the VIP: the server sees the same address and port from either
    director, and answers the VIP, which follows the leader (here: the servers' neighbour entry)."""
    seg, director = lab
    snat = method == "fullnat-vip"
    method = "fullnat" if snat else method
    prepare(seg, method)
    d1, d2 = director(0), director(1)
    docs = resources(method, "maglev", ports=((80, "TCP"),), **({"snatAddress": VIP} if snat else {}))
    if snat:
        for s in seg.hosts[2:4]:
            seg.run(s.ns, f"ip neigh replace {VIP} lladdr {seg.hosts[0].mac} dev eth0 nud permanent")
    for d in (d1, d2):
        d.apply(docs)
        d.wait_programmed(all_in(2))
    rules1 = _maglev_tables(d1.nft())
    assert rules1 and rules1 == _maglev_tables(d2.nft())  # the same table
    point_client(seg, seg.hosts[0])
    held = [_hold(seg, 31000 + i) for i in range(8)]
    firsts = [h[0] for h in held]
    assert all(f in ("n3", "n4") for f in firsts), firsts
    point_client(seg, seg.hosts[1])  # takeover: n2 now gets the client's frames
    for s in seg.hosts[2:4]:
        if method == "nat":
            seg.run(s.ns, f"ip route replace default via {seg.hosts[1].ipv4}")
        if snat:
            seg.run(s.ns, f"ip neigh replace {VIP} lladdr {seg.hosts[1].mac} dev eth0 nud permanent")
    before2 = sum(b["packets"] for b in backends_of(d2.cmd("status")))
    after = [again() for _first, again in held]
    assert after == firsts, (firsts, after)  # every established connection still served, same server
    assert sum(b["packets"] for b in backends_of(d2.cmd("status"))) > before2  # through n2 now
    assert set(spread(requests(seg, 8))) == {"n3", "n4"}  # and new ones spread from n2


def _maglev_tables(text: str) -> list[str]:
    """The scheduler rules and every Maglev map element (slot : goto chain) of an nft listing."""
    import re

    return sorted([ln.strip() for ln in text.splitlines() if "jhash" in ln]
                  + re.findall(r"\b\d+ : goto b[0-9a-f]+", text))


def test_maglev_spreads_and_a_flow_keeps_its_server_when_another_goes_down(lab):
    """DR with maglev: new flows spread over both servers; when n4 fails its check, the table
    changes only in n4's slots (map element deltas), so connections held on n3 keep going to n3
    packet after packet (DR hashes every packet, no conntrack), and n4's counter keeps its count."""
    seg, director = lab
    prepare(seg, "dr")
    d1 = director(0)
    health = '{"type": "tcp", "interval": 0.5, "timeout": 0.4, "rise": 2, "fall": 2}'
    d1.apply(resources("dr", "maglev", health=health, ports=((80, "TCP"),)))
    d1.wait_programmed(all_in(2))
    table = _maglev_tables(d1.nft())
    assert len([x for x in table if " : goto " in x and "jhash" not in x]) == 61  # 2 servers: 61 slots
    point_client(seg, seg.hosts[0])
    assert set(spread(requests(seg, 16))) == {"n3", "n4"}
    held = [_hold(seg, 32000 + i) for i in range(12)]
    on_n3 = [again for first, again in held if first == "n3"]
    assert on_n3 and len(on_n3) < len(held), [h[0] for h in held]
    before = {b["backend"]: b["packets"] for b in backends_of(d1.cmd("status"))}
    n4 = seg.hosts[3]
    seg.run(n4.ns, "nft add table inet blk && nft add chain inet blk in '{ type filter hook input priority 0; }' "
                   "&& nft add rule inet blk in tcp dport 80 reject with tcp reset")

    def wait(want) -> dict:
        # the held connections talk all along (the server drops one idle for 5 s), and each
        # answer must come from n3: through the change of the table, not only after it
        end = time.monotonic() + 15
        while True:
            assert [again() for again in on_n3] == ["n3"] * len(on_n3)
            st = d1.cmd("status")
            if want(st):
                return st
            assert time.monotonic() < end, st
            time.sleep(0.3)

    st = wait(lambda st: in_table(st) == {"198.51.100.13:80"})
    after = {b["backend"]: b["packets"] for b in backends_of(st)}
    assert after["198.51.100.14:80"] >= before["198.51.100.14:80"] > 0  # not reset: chain and counter stay
    assert spread(requests(seg, 8)) == {"n3": 8}
    seg.run(n4.ns, "nft delete table inet blk")
    wait(all_in(2))
    assert _maglev_tables(d1.nft()) == table  # recovery: the same table as before
    assert [again() for again in on_n3] == ["n3"] * len(on_n3)


def test_nothing_stale_after_crash_restart_and_stop(lab):
    seg, director = lab
    prepare(seg, "nat")
    d1 = director(0)
    d1.apply(resources("nat", "maglev"))
    d1.wait_programmed(all_in(2))
    seg.kill(d1.proc, sig=9)  # a crash: the tables stay behind
    assert "table inet nocloudlb_dp" in d1.nft()
    d1 = director(0)  # restart: start() replaces them; a smaller config leaves nothing of the old one
    d1.apply(resources("nat", "rr", servers=["198.51.100.14"]))
    d1.wait_programmed(all_in(1))
    text = d1.nft()
    assert text.count("table inet nocloudlb_dp ") == 1 and "198.51.100.13" not in text and "jhash" not in text
    point_client(seg, seg.hosts[0])
    assert spread(requests(seg, 4)) == {"n4": 4}
    d1.close()
    assert "nocloudlb_dp" not in d1.nft()  # stop removes both tables


def _listing(seg, ns: str) -> str:
    """The tables as nft prints them, counters' values and chain order aside."""
    import re

    text = seg.run(ns, ["nft", "list", "ruleset"]).stdout
    text = re.sub(r"packets \d+ bytes \d+", "", text)
    out = []
    for table in re.split(r"\n(?=table )", text.strip()):
        head, _nl, body = table.partition("\n")
        blocks = re.split(r"\n(?=\t(?:chain|counter|map) )", body.rstrip().rstrip("}"))
        out.append(head + "\n" + "\n".join(sorted(b.strip() for b in blocks)))
    return "\n".join(sorted(out))


def test_incremental_updates_equal_a_full_rewrite(make_segment):
    """A random walk of configs and health applied change by change leaves the tables exactly as
    one full write of the last state does (and each change is one nft -f transaction)."""
    import random

    from nocloudlb.core.backends import dataplane_plan
    from nocloudlb.core.schema import parse_resources
    from nocloudlb.dataplane import nft

    seg = make_segment(hosts=2, client=False)
    inc, full = seg.hosts[0].ns, seg.hosts[1].ns
    ifaces = {"eth0": (2, ["198.51.100.11/24"])}
    rng = random.Random(12)
    seg.run(inc, ["nft", "-f", "-"], input=nft.base_script())
    old = None
    servers = [f"198.51.100.{30 + i}" for i in range(5)]
    for _step in range(25):
        docs = []
        for k in range(3):
            method = rng.choice(["nat", "fullnat", "dr"])
            sched = rng.choice(["sh", "maglev"] if method == "dr" else ["rr", "wrr", "sh", "maglev"])
            extra = {"snatAddress": rng.choice(["198.51.100.9", "198.51.100.8"])} if method == "fullnat" and \
                rng.random() < 0.5 else {}
            picked = rng.sample(servers, rng.randint(1, 4))
            docs += resources(method, sched, servers=[{"address": a, "weight": rng.randint(1, 3)} for a in picked],
                              ports=((80, "TCP"),), **extra)
            docs[-2]["metadata"]["name"] = docs[-1]["metadata"]["name"] = f"web{k}"
            docs[-2]["status"]["loadBalancer"]["ingress"] = [{"ip": f"198.51.100.{200 + k}"}]
            if k:
                docs = [d for i, d in enumerate(docs) if i not in (len(docs) - 4, len(docs) - 3)]
        parsed = parse_resources(docs)
        healthy = {f"prod/web{k} {s}:80" for k in range(3) for s in servers if rng.random() < 0.8}
        rules = dataplane_plan(parsed, healthy)
        if rng.random() < 0.2:
            rules = rules[1:]  # a service goes away
        old = nft.render(rules, ifaces, old)
        if old.script:
            seg.run(inc, ["nft", "-f", "-"], input=old.script)
    seg.run(full, ["nft", "-f", "-"], input=nft.base_script())
    seg.run(full, ["nft", "-f", "-"], input=nft.render(rules, ifaces, None).script)
    assert _listing(seg, inc) == _listing(seg, full)
