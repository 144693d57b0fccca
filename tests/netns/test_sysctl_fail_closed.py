"""Defect 8's last step (issue 8): an ARP sysctl that is lowered and cannot be set back fails closed.

With ``arp_ignore=0`` the kernel answers ARP for every address on lo, so a node holding every VIP
there answers for VIPs other nodes lead: two owners. The daemon re-sets a lowered value every
reconcile (test_edges_speaker.py); when that write fails, the layer-2 mode now withdraws every IPv4
VIP from ARP and from lo, publishes the node as excluded (peers take its VIPs) and alarms
(``arpSysctls.failClosed``, event ``arpSysctlFailClosed``); it serves again once the sysctl is right.

The write is made to fail for real: n1's speaker runs in a mount namespace of its own where
/proc/sys/net/ipv4/conf/all is a read-only bind mount; the test lowers the value from outside it.
Before the fix (main at 8b916d6) this test fails: n1's kernel answered for n2's VIP beside n2.
"""

from __future__ import annotations

import time

import pytest
from nocloudlb.core.election import election_order
from speaker_harness import SpeakerCluster, pool_docs, service_doc

pytestmark = pytest.mark.timeout(300)

CONF = "/proc/sys/net/ipv4/conf/all"
RO_SYSCTLS = ["unshare", "-m", "sh", "-c",
              f'mount --bind {CONF} {CONF} && mount -o remount,bind,ro {CONF} && exec "$@"', "sh"]


def lo_v4(c: SpeakerCluster, name: str) -> set[str]:
    out = c.seg.run(c.host(name).ns, "ip -4 -o addr show dev lo").stdout
    return {line.split()[3].split("/")[0] for line in out.splitlines()} - {"127.0.0.1"}


def test_unrestorable_arp_sysctl_withdraws_from_lo_and_arp_and_excludes_the_node(make_segment, tmp_path):
    seg = make_segment(hosts=2, client=True, prefix="rel")
    nodes = ["n1", "n2"]
    pool = [f"198.51.100.{i}" for i in range(200, 240)]
    v1 = next(ip for ip in pool if election_order(nodes, ip)[0] == "n1")
    v2 = next(ip for ip in pool if election_order(nodes, ip)[0] == "n2")
    c = SpeakerCluster(seg, tmp_path, resources=pool_docs() + [service_doc("a", [v1]), service_doc("b", [v2])])
    for h in seg.hosts:  # set beforehand (as the role does): n1's speaker cannot write them
        seg.run(h.ns, "sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2")
    c.wrap["n1"] = RO_SYSCTLS
    c.start_all(timeout=60)
    m1, m2 = c.mac("n1"), c.mac("n2")
    c.wait(lambda: [a["mac"] for a in c.probe(v1)] == [m1], 10, "n1 answering its VIP")
    assert [a["mac"] for a in c.probe(v2)] == [m2]
    assert {v1, v2} <= lo_v4(c, "n1")

    seg.run(c.host("n1").ns, "sysctl -qw net.ipv4.conf.all.arp_ignore=0")  # outside n1's read-only view
    t0, seen = time.monotonic(), {}
    while time.monotonic() - t0 < 45:  # on the wire: n2 alone answers both VIPs (wide: a loaded machine)
        seen = {ip: sorted(a["mac"] for a in c.probe(ip)) for ip in (v1, v2)}
        if seen == {v1: [m2], v2: [m2]}:
            break
    took = time.monotonic() - t0
    assert seen == {v1: [m2], v2: [m2]}, f"after 45 s: {seen} (n1 {m1}, n2 {m2})"
    assert not lo_v4(c, "n1")
    assert seg.run(c.host("n1").ns, "sysctl -n net.ipv4.conf.all.arp_ignore").stdout.strip() == "0"
    st = c.status("n1")
    assert "cannot be set" in st["arpSysctls"]["error"] and st["arpSysctls"]["ok"] is False
    assert not any(v["announcing"] for v in st["vips"])
    assert c.events("n1", "arpSysctlFailClosed")
    peer = {m["name"]: m for m in c.status("n2")["members"]}["n1"]
    assert "node.kubernetes.io/exclude-from-external-load-balancers" in peer["labels"], peer
    print(f"n1 failed closed and n2 answered its VIP {took:.2f} s after arp_ignore=0")

    seg.run(c.host("n1").ns, "sysctl -qw net.ipv4.conf.all.arp_ignore=1")  # fixed from outside
    c.wait(lambda: [a["mac"] for a in c.probe(v1)] == [m1], 15, "n1 serving its VIP again")
    assert {v1, v2} <= lo_v4(c, "n1") and not c.status("n1")["arpSysctls"]["failClosed"]
    assert [a["mac"] for a in c.probe(v2)] == [m2]
    assert c.events("n1", "arpSysctlSafeAgain")
