"""Issue 8, defect 3 and 8 on the wire: interfaces that must never announce, VLAN-tagged requests on
the untagged parent, and the ARP sysctls checked on every reconcile.

No bonding or VLAN modules on these kernels: bridge ports stand in for every interface with a master
(bond slaves are the same rule: IFLA_MASTER), ``ip link set arp off`` for NOARP, and the tagged frames
are sent raw (the receiving kernel untags them, with or without a VLAN module).
"""

from __future__ import annotations

import json
import sys
import time

import pytest
from netns import L2Agent
from test_l2_wire import VIP4, hold_vips_on_lo, who_has

pytestmark = pytest.mark.timeout(120)

TAGGED = r"""
import json, sys, time
from scapy.all import ARP, AsyncSniffer, Dot1Q, Ether, get_if_hwaddr, sendp
mine4, ip, vlan = sys.argv[1], sys.argv[2], int(sys.argv[3])
iface = "eth0"
mac = get_if_hwaddr(iface)
started = []
sn = AsyncSniffer(iface=iface, store=True, started_callback=lambda: started.append(1),
                  # replies to us only: the speaker's gratuitous replies (target = the VIP) may still be due
                  lfilter=lambda p: ARP in p and p[ARP].op == 2 and p[ARP].psrc == ip and p[ARP].pdst == mine4)
sn.start()
while not started:
    time.sleep(0.01)
req = Ether(dst="ff:ff:ff:ff:ff:ff", src=mac)
if vlan:
    req = req / Dot1Q(vlan=vlan)
req = req / ARP(op=1, hwsrc=mac, psrc=mine4, pdst=ip)
for _ in range(3):
    sendp(req, iface=iface, verbose=False)
    time.sleep(0.05)
time.sleep(0.4)
print(json.dumps(sorted({p[Ether].src for p in sn.stop()})))
"""


@pytest.fixture
def netns_prefix() -> str:
    return "ned"


@pytest.fixture
def lab(make_segment):
    seg = make_segment(hosts=2)
    for h in seg.hosts:
        hold_vips_on_lo(seg, h.ns, [VIP4])
    return seg


def test_bridge_port_and_noarp_interfaces_never_announce(lab):
    seg = lab
    n1, n2 = seg.hosts
    # n1: eth0 becomes a port of br0 (its own MAC); the bridge is the interface that may announce.
    br_mac = "02:00:5e:00:53:b1"
    seg.run(n1.ns, f"ip link add br0 address {br_mac} type bridge && ip link set br0 type bridge stp_state 0 "
                   "forward_delay 0 && ip link set eth0 master br0 && ip link set br0 up")
    eligible = seg.python_json(n1.ns, "import json; from nocloudlb.l2 import interfaces as m; "
                                      "print(json.dumps([m.eligible_interfaces(), "
                                      "{n: i.skip for n, i in m.interfaces(False).items()}]))")
    assert eligible[0] == ["br0"] and eligible[1]["eth0"].startswith("master")
    a1 = L2Agent(seg, n1.ns, "n1", rescan_interval=0.3)
    try:
        a1.set({VIP4: ["eth0"]}, skip_check=[VIP4])  # named explicitly: still refused, it is a bridge port
        time.sleep(0.3)
        assert a1.stats()["vips"][VIP4]["interfaces"] == [] and who_has(seg, VIP4, count=2, wait=0.3) == {}
        a1.set({VIP4: []}, skip_check=[VIP4])  # every eligible interface: the bridge only
        a1.wait_state(VIP4, "announcing")
        assert a1.stats()["interfaces"] == ["br0"] and a1.stats()["vips"][VIP4]["interfaces"] == ["br0"]
        assert list(who_has(seg, VIP4, count=2, wait=0.3)) == [br_mac]
    finally:
        a1.stop()
    # n2: eth0 with NOARP never announces, named or not.
    seg.run(n2.ns, "ip link set eth0 arp off")
    a2 = L2Agent(seg, n2.ns, "n2", rescan_interval=0.3)
    try:
        a2.set({VIP4: []}, skip_check=[VIP4])
        time.sleep(0.3)
        assert a2.stats()["interfaces"] == []
        a2.set({VIP4: ["eth0"]}, skip_check=[VIP4])
        time.sleep(0.3)
        assert a2.stats()["vips"][VIP4]["interfaces"] == [] and who_has(seg, VIP4, count=2, wait=0.3) == {}
    finally:
        a2.stop()


def test_vlan_tagged_request_is_not_answered_on_the_untagged_parent(lab):
    seg = lab
    n1 = seg.hosts[0]
    a1 = L2Agent(seg, n1.ns, "n1")
    try:
        a1.set({VIP4: ["eth0"]}, skip_check=[VIP4])
        a1.wait_state(VIP4, "announcing")

        def ask(vlan: int) -> list[str]:
            c = seg.client
            out = seg.run(c.ns, [sys.executable, "-c", TAGGED, c.ipv4, VIP4, str(vlan)], timeout=60)
            return json.loads(out.stdout.strip().splitlines()[-1])

        assert ask(0) == [n1.mac]  # untagged: answered
        assert ask(100) == []  # tagged with VLAN 100: the parent is not on that VLAN
        before = a1.stats()
        assert ask(0) == [n1.mac]
        assert before["vips"][VIP4]["state"] == "announcing"
    finally:
        a1.stop()
