"""Issue 20 part 6 with real speakers: an L2Advertisement that names an interface the node does not
have, one that is down, without carrier, or enslaved (a bridge port stands in for a bond slave: no
bonding module here, and both are IFLA_MASTER) is reported in ``nocloudlb status`` (a line per
interface, the VIP's reason ``noUsableInterface``), in the log (``interfaceUnusable``) and as the
metric ``nocloudlb_layer2_interface_unusable``; nothing is announced on it (fail closed), and the VIP
is announced as soon as the interface can carry it."""

from __future__ import annotations

import sys

import pytest
from speaker_harness import SpeakerCluster, pool_docs, service_doc, spread_vips

pytestmark = pytest.mark.timeout(150)
NODES = ["n1", "n2"]


@pytest.fixture
def netns_prefix() -> str:
    return "nif"


def _unusable(c: SpeakerCluster, node: str) -> dict[str, str]:
    st = c.try_status(node) or {}
    report = ((st.get("modes") or {}).get("l2") or {}).get("interfaces") or {}
    return {u["iface"]: u["reason"] for u in report.get("unusable", [])}


def _row(c: SpeakerCluster, node: str, ip: str) -> tuple[bool, str]:
    v = c.vip(node, ip)
    return v["announcing"], v["reason"]


def _metric(c: SpeakerCluster, node: str) -> str:
    code = ("import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:7472/metrics', timeout=5)"
            ".read().decode())")
    return c.seg.python(c.host(node).ns, code).stdout


def test_missing_down_enslaved_interfaces_are_reported_and_never_announced_on(make_segment, tmp_path):
    vips = spread_vips(NODES)
    ip1 = next(ip for ip, n in vips.items() if n == "n1")
    ip2 = next(ip for ip, n in vips.items() if n == "n2")
    docs = pool_docs()
    docs[1]["spec"]["interfaces"] = ["eth1"]  # on no node yet
    docs += [service_doc("a", [ip1]), service_doc("b", [ip2])]
    c = SpeakerCluster(make_segment(hosts=2), tmp_path, profile="fast", resources=docs)
    c.start_all()
    wait = c.wait

    # missing on both nodes: each leader says why it announces nothing, and nothing answers
    wait(lambda: _unusable(c, "n1").get("eth1") == "missing" and _unusable(c, "n2").get("eth1") == "missing",
         15, "eth1 reported missing on both nodes")
    # waited for, not read once: two fast-profile nodes on a busy host may lose quorum for a moment (noQuorum)
    for node, ip in (("n1", ip1), ("n2", ip2)):
        wait(lambda node=node, ip=ip: _row(c, node, ip) == (False, "noUsableInterface"), 5, f"{node}: noUsable")
    assert c.probe(ip1) == [] and c.probe(ip2) == []
    out = c.seg.run(c.host("n1").ns, [sys.executable, "-m", "nocloudlb.cli", "status", "--socket", c.sock("n1")],
                    check=False, timeout=30).stdout
    assert "l2: interface eth1 missing since" in out and "no such interface on this node" in out, out
    assert "noUsableInterface" in out, out
    assert 'nocloudlb_layer2_interface_unusable{iface="eth1",reason="missing"} 1.0' in _metric(c, "n1")
    logged = c.events("n1", "interfaceUnusable")
    assert any(e.get("iface") == "eth1" and e.get("reason") == "missing" for e in logged), logged

    # n1: eth1 appears, down (a veth whose peer is in the same namespace)
    n1 = c.host("n1").ns
    c.seg.run(n1, "ip link add eth1 type veth peer name eth1p")
    wait(lambda: _unusable(c, "n1").get("eth1") == "down", 15, "eth1 reported down on n1")
    wait(lambda: _row(c, "n1", ip1) == (False, "noUsableInterface"), 5, "n1: noUsableInterface")
    # up without carrier (its peer is down): a warning, announced on (frames go nowhere until the carrier)
    c.seg.run(n1, "ip link set eth1 up")
    wait(lambda: _unusable(c, "n1").get("eth1") == "noCarrier", 15, "eth1 reported without carrier on n1")
    c.seg.run(n1, "ip link set eth1p up")
    wait(lambda: "eth1" not in _unusable(c, "n1"), 15, "eth1 usable on n1")
    wait(lambda: _row(c, "n1", ip1) == (True, ""), 10, "n1 announcing its VIP on eth1")
    assert any(e.get("iface") == "eth1" for e in c.events("n1", "interfaceUsable"))
    assert 'iface="eth1"' not in _metric(c, "n1")

    # n2: eth1 a bridge port (a bond slave named instead of the bond): enslaved, never announced on
    n2 = c.host("n2").ns
    c.seg.run(n2, "ip link add br1 type bridge && ip link add eth1 type veth peer name eth1p "
                  "&& ip link set eth1 master br1 && ip link set eth1p up && ip link set eth1 up && ip link set br1 up")
    wait(lambda: _unusable(c, "n2").get("eth1") == "enslaved", 15, "eth1 reported enslaved on n2")
    detail = next(u["detail"] for u in c.status("n2")["modes"]["l2"]["interfaces"]["unusable"] if u["iface"] == "eth1")
    assert "master br1" in detail, detail
    wait(lambda: _row(c, "n2", ip2) == (False, "noUsableInterface"), 5, "n2: noUsableInterface")
    assert c.status("n2")["modes"]["l2"]["announced"] == [ip2]  # given to the announcer, announced on nothing
