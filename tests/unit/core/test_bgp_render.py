# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The FRR config a node renders from a BGP decision (the lab tests apply it to real FRR)."""

from __future__ import annotations

from conftest import bfd, bgpadv, peer, pool, service
from nocloudlb.bgp.render import redact, render
from nocloudlb.core.bgp import bgp_decision
from nocloudlb.core.election import DRAIN_LABEL, NodeView
from nocloudlb.core.schema import parse_resources

POOL = pool("bgp", "203.0.113.0/26")
WEB = service("web", status_ips=["203.0.113.10"])


def text(docs, labels=None, forwarding=(True, True)):
    cfg = parse_resources(docs)
    return render("n1", bgp_decision("n1", [NodeView("n1", labels or {})], cfg), cfg, forwarding)


def test_neighbour_settings():
    r = text([POOL, bfd("fast", receiveInterval=100, transmitInterval=100, echoMode=True, passiveMode=True),
              peer("r1", myASN=64512, peerASN=64500, peerAddress="198.51.100.1", peerPort=1179, holdTime="9s",
                   keepaliveTime="3s", connectTime="2s", password="pw-1", ebgpMultiHop=True,
                   sourceAddress="198.51.100.11", routerID="198.51.100.11", bfdProfile="fast",
                   enableGracefulRestart=True), bgpadv("a"), WEB])
    lines = r.text.splitlines()
    for expected in ["router bgp 64512", " bgp router-id 198.51.100.11", " neighbor 198.51.100.1 remote-as 64500",
                     " neighbor 198.51.100.1 port 1179", " neighbor 198.51.100.1 timers 3 9",
                     " neighbor 198.51.100.1 timers connect 2", " neighbor 198.51.100.1 password pw-1",
                     " neighbor 198.51.100.1 ebgp-multihop", " neighbor 198.51.100.1 update-source 198.51.100.11",
                     " neighbor 198.51.100.1 bfd profile fast", " neighbor 198.51.100.1 graceful-restart",
                     "  receive-interval 100", "  transmit-interval 100", "  echo-mode", "  passive-mode",
                     "  network 203.0.113.10/32", "ip prefix-list nlb-r1-ipv4-0 seq 5 permit 203.0.113.10/32",
                     "route-map nlb-r1-in deny 20"]:
        assert expected in lines, expected
    assert "pw-1" not in r.redacted and "password ********" in r.redacted
    assert "  detect-multiplier 3" not in lines  # bfdd's defaults are not rendered (empty reload diffs)


def test_nothing_to_announce_renders_deny_any_and_no_network():
    r = text([POOL, peer("r1", myASN=64512, peerASN=64500), bgpadv("a"), WEB], labels={DRAIN_LABEL: ""})
    assert "ip prefix-list nlb-r1-ipv4-none seq 5 deny any" in r.text
    assert "route-map nlb-r1-out deny 10" in r.text
    assert "network" not in r.text.replace("no bgp network import-check", "")
    assert "permit" not in r.text


def test_communities_and_local_pref_toward_ibgp_only():
    r = text([POOL, peer("e", myASN=64512, peerASN=64500, peerAddress="198.51.100.1"),
              peer("i", myASN=64512, peerASN=64512, peerAddress="198.51.100.2"),
              bgpadv("a", localPref=150, communities=["64512:1", "large:1:2:3"]), WEB])
    e = r.text.split("route-map nlb-e-out permit 10\n")[1].split("exit")[0]
    i = r.text.split("route-map nlb-i-out permit 10\n")[1].split("exit")[0]
    assert "set community 64512:1" in e and "set large-community 1:2:3" in e and "local-preference" not in e
    assert "set local-preference 150" in i
    assert " neighbor 198.51.100.1 advertisement-interval 0" in r.text  # eBGP: no 30 s MRAI
    assert " neighbor 198.51.100.2 advertisement-interval 0" not in r.text


def test_dual_stack_and_ipv6_peer():
    docs = [POOL, pool("v6", "2001:db8:5::/120"), peer("r6", myASN=64512, peerASN=64500, peerAddress="2001:db8:1::1"),
            peer("r4", myASN=64512, peerASN=64500, peerAddress="198.51.100.1", dualStackAddressFamily=True),
            bgpadv("a", ipAddressPools=["bgp", "v6"]), WEB, service("v6", status_ips=["2001:db8:5::10"])]
    r = text(docs)
    v6 = r.text.split(" address-family ipv6 unicast\n")[1].split(" exit-address-family")[0]
    v4 = r.text.split(" address-family ipv4 unicast\n")[1].split(" exit-address-family")[0]
    assert "network 2001:db8:5::10/128" in v6 and "neighbor 2001:db8:1::1 activate" in v6
    assert "neighbor 198.51.100.1 activate" in v6 and "neighbor 198.51.100.1 activate" in v4
    assert "neighbor 2001:db8:1::1 activate" not in v4
    assert "ipv6 prefix-list nlb-r6-ipv6-0 seq 5 permit 2001:db8:5::10/128" in r.text


def test_vrf_gets_its_own_router_and_forwarding_kept():
    r = text([POOL, peer("r1", myASN=64512, peerASN=64500, vrf="red"), bgpadv("a"), WEB], forwarding=(False, True))
    assert "router bgp 64512 vrf red" in r.text.splitlines()
    assert "no ip forwarding" in r.text.splitlines() and "no ipv6 forwarding" not in r.text


def test_redact_known_secrets_anywhere():
    assert redact("' neighbor 198.51.100.1 password abc'\nerror near abc", {"abc"}) == (
        "' neighbor 198.51.100.1 password ********'\nerror near ********")
