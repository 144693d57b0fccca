"""BGP events from a real FRR session between n1 and the router, read from a capture."""

from __future__ import annotations

import time
from collections.abc import Iterator

import labctl
import pytest

pytestmark = pytest.mark.timeout(150)

N1_FRR = """frr defaults traditional
hostname n1
router bgp 64512
 bgp router-id 198.51.100.11
 no bgp ebgp-requires-policy
 neighbor 198.51.100.1 remote-as 64500
 neighbor 198.51.100.1 timers connect 2
 address-family ipv4 unicast
  network 203.0.113.10/32
 exit-address-family
"""
R1_CONF = ["router bgp 64500", "bgp router-id 198.51.100.1", "no bgp ebgp-requires-policy",
           "neighbor 198.51.100.11 remote-as 64512", "neighbor 198.51.100.11 timers connect 2"]


def vtysh(lab: labctl.Lab, host: str, *lines: str, check: bool = True) -> str:
    args = ["vtysh"]
    for ln in lines:
        args += ["-c", ln]
    return lab.exec(host, args, check=check, timeout=30).stdout


@pytest.fixture
def bgp_lab(lab: labctl.Lab) -> Iterator[labctl.Lab]:
    lab.exec("n1", ["ip", "addr", "add", "203.0.113.10/32", "dev", "lo"])
    lab.exec("n1", ["sed", "-i", "s/^bgpd=no/bgpd=yes/", "/etc/frr/daemons"])
    lab.exec("n1", ["sh", "-c", "cat > /etc/frr/frr.conf"], input=N1_FRR)
    vtysh(lab, "r1", "configure terminal", *R1_CONF)
    try:
        yield lab
    finally:
        lab.exec("n1", ["systemctl", "stop", "frr"], check=False)
        lab.exec("n1", ["ip", "addr", "del", "203.0.113.10/32", "dev", "lo"], check=False)
        vtysh(lab, "r1", "configure terminal", "no router bgp 64500", check=False)


def test_bgp_session_and_updates_in_capture(bgp_lab: labctl.Lab) -> None:
    lab = bgp_lab
    cap = lab.capture_start("lan", "pytest-bgp", bpf="tcp port 179")
    try:
        t_start = time.time()
        lab.exec("n1", ["systemctl", "start", "frr"])
        for _attempt in range(150):
            if "203.0.113.10/32" in vtysh(lab, "r1", "show ip bgp"):
                break
            time.sleep(0.2)
        else:
            pytest.fail("r1 never learned 203.0.113.10/32: " + vtysh(lab, "r1", "show bgp summary"))
        t_learned = time.time()
        vtysh(lab, "n1", "configure terminal", "router bgp 64512", "address-family ipv4 unicast",
              "no network 203.0.113.10/32")
        for _attempt in range(100):
            if "203.0.113.10/32" not in vtysh(lab, "r1", "show ip bgp"):
                break
            time.sleep(0.2)
        else:
            pytest.fail("r1 kept 203.0.113.10/32 after the withdraw")
        time.sleep(0.2)
    finally:
        lab.capture_stop(cap["name"])
    events = labctl.read_events(cap["pcap"], kinds=["bgp"])
    types = [(e["src_ip"], e["type"]) for e in events]
    assert ("198.51.100.11", "open") in types and ("198.51.100.1", "open") in types, types
    announce = next(e for e in events if e["type"] == "update" and "203.0.113.10/32" in e["announce"])
    withdraw = next(e for e in events if e["type"] == "update" and "203.0.113.10/32" in e["withdraw"])
    assert announce["src_ip"] == withdraw["src_ip"] == "198.51.100.11"
    assert t_start <= announce["t"] <= t_learned + 0.5 < withdraw["t"] + 0.5
    assert any(e["type"] == "keepalive" for e in events)
    assert any(e["type"] == "tcp-syn" for e in events)
