"""Captures on a segment and the event reader."""

from __future__ import annotations

import json
import time
from pathlib import Path

import labctl
import pytest
from conftest import addr, labctl_cli

pytestmark = pytest.mark.timeout(120)


def mac(lab: labctl.Lab, host: str) -> str:
    return lab.state()["topology"]["hosts"][host]["interfaces"][0]["mac"]


def test_arp_and_ndp_events_with_timestamps(lab: labctl.Lab) -> None:
    n1, n1v6 = addr(lab, "n1"), addr(lab, "n1", v6=True)
    t0 = time.time()
    cap = lab.capture_start("lan", "pytest-arp")
    try:
        lab.exec("c1", ["ip", "neigh", "flush", "all"])
        lab.exec("c1", ["arping", "-c", "1", "-w", "2", "-i", "eth0", n1])
        lab.exec("n1", ["arping", "-U", "-c", "1", "-w", "1", "-i", "eth0", "-S", n1, n1], check=False)
        lab.exec("c1", ["ping", "-c", "1", "-W", "2", n1v6])
    finally:
        lab.capture_stop(cap["name"])
    t1 = time.time()
    events = labctl.read_events(cap["pcap"])
    arp = [e for e in events if e["kind"] == "arp"]
    req = next(e for e in arp if e["op"] == "request" and e["target_ip"] == n1 and e["sender_mac"] == mac(lab, "c1"))
    rep = next(e for e in arp if e["op"] == "reply" and e["sender_ip"] == n1 and e["target_mac"] == mac(lab, "c1"))
    assert rep["sender_mac"] == mac(lab, "n1")
    assert t0 <= req["t"] <= rep["t"] <= t1
    assert rep["t"] - req["t"] < 0.5
    garp = next(e for e in arp if e["gratuitous"] and e["sender_ip"] == n1)
    assert garp["sender_mac"] == mac(lab, "n1") and garp["dst_mac"] == "ff:ff:ff:ff:ff:ff"
    ndp = [e for e in events if e["kind"] == "ndp"]
    ns = next(e for e in ndp if e["type"] == "ns" and e["target"] == n1v6)
    na = next(e for e in ndp if e["type"] == "na" and e["target"] == n1v6)
    assert na["flags"]["solicited"] and na["src_mac"] == mac(lab, "n1") and ns["t"] <= na["t"]
    # the CLI reader gives the same events
    assert json.loads(labctl_cli("capture", "read", cap["pcap"]).stdout) == json.loads(json.dumps(events))


def test_capture_on_unknown_segment_names_it(lab: labctl.Lab) -> None:
    with pytest.raises(labctl.LabError, match="unknown segment 'wan'"):
        lab.capture_start("wan")


def test_bgp_events_from_a_written_pcap(tmp_path: Path) -> None:
    """The BGP part of the reader, on packets built with scapy (OPEN, UPDATE, withdraw, KEEPALIVE)."""
    from scapy.contrib.bgp import (
        BGPHeader,
        BGPKeepAlive,
        BGPNLRI_IPv4,
        BGPOpen,
        BGPPAAS4BytesPath,
        BGPPANextHop,
        BGPPAOrigin,
        BGPPathAttr,
        BGPUpdate,
    )
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    def seg(payload: bytes | None, flags: str = "PA", sport: int = 40000, dport: int = 179):
        p = Ether() / IP(src="198.51.100.11", dst="198.51.100.1") / TCP(sport=sport, dport=dport, flags=flags)
        return p / payload if payload else p

    upd = BGPHeader(type=2) / BGPUpdate(
        path_attr=[BGPPathAttr(type_flags=0x40, type_code=1, attribute=BGPPAOrigin(origin=0)),
                   BGPPathAttr(type_flags=0x40, type_code=2, attribute=BGPPAAS4BytesPath()),
                   BGPPathAttr(type_flags=0x40, type_code=3, attribute=BGPPANextHop(next_hop="198.51.100.11"))],
        nlri=[BGPNLRI_IPv4(prefix="203.0.113.10/32")])
    wd = BGPHeader(type=2) / BGPUpdate(withdrawn_routes=[BGPNLRI_IPv4(prefix="203.0.113.10/32")])
    pkts = [seg(None, "S"), seg(bytes(BGPHeader(type=1) / BGPOpen(my_as=64512, bgp_id="198.51.100.11"))),
            seg(bytes(upd) + bytes(BGPHeader(type=4) / BGPKeepAlive())), seg(bytes(wd)), seg(None, "R")]
    for i, p in enumerate(pkts):
        p.time = 1000.0 + i
    wrpcap(str(tmp_path / "bgp.pcap"), pkts)
    events = labctl.read_events(tmp_path / "bgp.pcap", kinds=["bgp"])
    got = [(e["t"], e["type"], e.get("announce"), e.get("withdraw")) for e in events]
    assert got == [
        (1000.0, "tcp-syn", None, None),
        (1001.0, "open", None, None),
        (1002.0, "update", ["203.0.113.10/32"], []),
        (1002.0, "keepalive", None, None),
        (1003.0, "update", [], ["203.0.113.10/32"]),
        (1004.0, "tcp-rst", None, None),
    ]
    assert all(e["src_ip"] == "198.51.100.11" and e["dport"] == 179 for e in events)
