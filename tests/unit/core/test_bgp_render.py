# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The FRR config a node renders from a BGP decision (the lab tests apply it to real FRR)."""

from __future__ import annotations

import ipaddress
import random

from conftest import bfd, bgpadv, peer, pool, service
from nocloudlb.bgp.render import redact, render
from nocloudlb.core.bgp import bgp_decision
from nocloudlb.core.election import DRAIN_LABEL, NodeView
from nocloudlb.core.errors import ConfigError
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
                     "  network 203.0.113.10/32",
                     "ip prefix-list nlb-r1-ipv4-0 seq 5 permit 203.0.113.0/26 ge 32 le 32",
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
    e = r.text.split("route-map nlb-e-out permit 11\n")[1].split("exit")[0]
    i = r.text.split("route-map nlb-i-out permit 11\n")[1].split("exit")[0]
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
    assert "ipv6 prefix-list nlb-r6-ipv6-0 seq 5 permit 2001:db8:5::/120 ge 128 le 128" in r.text


def test_vrf_gets_its_own_router_and_forwarding_kept():
    r = text([POOL, peer("r1", myASN=64512, peerASN=64500, vrf="red"), bgpadv("a"), WEB], forwarding=(False, True))
    assert "router bgp 64512 vrf red" in r.text.splitlines()
    assert "no ip forwarding" in r.text.splitlines() and "no ipv6 forwarding" not in r.text


def test_redact_known_secrets_anywhere():
    assert redact("' neighbor 198.51.100.1 password abc'\nerror near abc", {"abc"}) == (
        "' neighbor 198.51.100.1 password ********'\nerror near ********")


# -- what FRR would send: the rendered route-maps and prefix lists, read with FRR's semantics --------
# (the lab test tests/lab/test_bgp_frr.py and the bgp scenario apply the same text to real FRR)

def _frr_policy(text: str):
    """prefix lists (name -> [(action, network, le)]) and out route-maps (name -> [(seq, action, list, sets)])."""
    lists: dict[str, list] = {}
    maps: dict[str, list] = {}
    current = None
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 6 and words[1] == "prefix-list" and words[3] == "seq":
            action, rest = words[5], words[6:]
            if rest == ["any"]:
                lists.setdefault(words[2], []).append((action, None, None, None))
            else:
                net = ipaddress.ip_network(rest[0])
                ge = int(rest[rest.index("ge") + 1]) if "ge" in rest else net.prefixlen
                default_le = net.max_prefixlen if "ge" in rest else net.prefixlen
                le = int(rest[rest.index("le") + 1]) if "le" in rest else default_le
                lists.setdefault(words[2], []).append((action, net, ge, le))
        elif line.startswith("route-map ") and words[1].endswith("-out"):
            current = [int(words[3]), words[2], None, []]
            maps.setdefault(words[1], []).append(current)
        elif current is not None and line.startswith(" match "):
            current[2] = words[-1]
        elif current is not None and line.startswith(" set "):
            current[3].append(line.strip())
        elif line == "exit":
            current = None
    return lists, maps


def _sends(text: str, rm: str, prefix: str):
    """None when route-map ``rm`` denies ``prefix``, else its set lines."""
    lists, maps = _frr_policy(text)
    p = ipaddress.ip_network(prefix)

    def listed(name):
        for action, net, ge, le in lists.get(name, []):
            if net is None or (net.version == p.version and p.subnet_of(net) and ge <= p.prefixlen <= le):
                return action == "permit"
        return False

    for _seq, action, pl, sets in sorted(maps[rm]):
        if listed(pl):
            return sets if action == "permit" else None
    return None


def _vips(n: int, first: int = 1) -> list[dict]:
    return [service(f"s{i}", status_ips=[f"2001:db8:5::{i:x}"]) for i in range(first, first + n)]


def test_one_pool_many_vips_renders_the_pool_not_one_line_per_vip():
    """FRR's cost of a prefix-list entry grows with the list (1,000 entries: ~30 s of vtysh); the
    common case (every VIP of the pools with the same attributes) needs one line per pool CIDR."""
    cfg = [pool("v6", "2001:db8:5::/116"), pool("v6b", "2001:db8:6::10-2001:db8:6::1f"),
           peer("r6", myASN=64512, peerASN=64500, peerAddress="2001:db8:1::1"), bgpadv("a", communities=["64512:7"])]
    r = text(cfg + _vips(1000) + [service("b", status_ips=["2001:db8:6::12"])])
    assert r.text.count("  network ") == 1001
    assert [ln for ln in r.text.splitlines() if "prefix-list" in ln and " seq " in ln] == [
        "ipv6 prefix-list nlb-r6-ipv6-0 seq 5 permit 2001:db8:5::/116 ge 128 le 128",
        "ipv6 prefix-list nlb-r6-ipv6-0 seq 10 permit 2001:db8:6::10/124 ge 128 le 128"]
    assert _sends(r.text, "nlb-r6-out", "2001:db8:5::3e8/128") == ["set community 64512:7"]
    assert _sends(r.text, "nlb-r6-out", "2001:db8:6::12/128") == ["set community 64512:7"]
    for outside in ("2001:db8:5::1000/128", "2001:db8:6::f/128", "2001:db8:6::20/128", "2001:db8:5::/116",
                    "2001:db8::/32", "::/0"):
        assert _sends(r.text, "nlb-r6-out", outside) is None, outside


def test_a_minority_with_other_attributes_is_listed_per_vip_before_the_pool_entry():
    cfg = [pool("v6", "2001:db8:5::/116"), peer("r6", myASN=64512, peerASN=64500, peerAddress="2001:db8:1::1"),
           bgpadv("all", ipAddressPools=["v6"]),
           bgpadv("gold", ipAddressPools=["v6"], communities=["64512:9"],
                  serviceSelectors=[{"matchLabels": {"tier": "gold"}}])]
    gold = [service("g1", labels={"tier": "gold"}, status_ips=["2001:db8:5::a01"]),
            service("g2", labels={"tier": "gold"}, status_ips=["2001:db8:5::a02"])]
    r = text(cfg + _vips(20) + gold)
    assert _sends(r.text, "nlb-r6-out", "2001:db8:5::a01/128") == ["set community 64512:9"]
    assert _sends(r.text, "nlb-r6-out", "2001:db8:5::a02/128") == ["set community 64512:9"]
    assert _sends(r.text, "nlb-r6-out", "2001:db8:5::5/128") == []
    assert " permit 2001:db8:5::a01/128" in r.text and " permit 2001:db8:5::5/128" not in r.text


def test_prefixes_of_another_peer_are_denied_before_the_pool_entry():
    cfg = [pool("a", "203.0.113.0/26"), pool("b", "203.0.113.64/26"),
           peer("ra", myASN=64512, peerASN=64500, peerAddress="198.51.100.1"),
           peer("rb", myASN=64512, peerASN=64500, peerAddress="198.51.100.2"),
           bgpadv("to-a", ipAddressPools=["a", "b"], peers=["ra"]), bgpadv("to-b", ipAddressPools=["b"], peers=["rb"])]
    svcs = [service("x", status_ips=["203.0.113.10"]), service("y", status_ips=["203.0.113.70"])]
    r = text(cfg + svcs)
    assert _sends(r.text, "nlb-ra-out", "203.0.113.10/32") == []
    assert _sends(r.text, "nlb-ra-out", "203.0.113.70/32") == []
    assert _sends(r.text, "nlb-rb-out", "203.0.113.70/32") == []
    assert _sends(r.text, "nlb-rb-out", "203.0.113.10/32") is None  # pool a goes to ra only
    assert "route-map nlb-rb-out deny 10" in r.text


def test_an_aggregate_wider_than_the_range_is_listed_exactly():
    cfg = [pool("r", "203.0.113.10-203.0.113.20"), peer("r1", myASN=64512, peerASN=64500),
           bgpadv("agg", aggregationLength=30), service("x", status_ips=["203.0.113.10"])]
    r = text(cfg)
    assert "  network 203.0.113.8/30" in r.text
    assert _sends(r.text, "nlb-r1-out", "203.0.113.8/30") == []
    assert _sends(r.text, "nlb-r1-out", "203.0.113.8/29") is None
    assert _sends(r.text, "nlb-r1-out", "203.0.113.9/32") is None


def test_random_configs_send_exactly_the_decision_and_nothing_outside_the_pools():
    rng = random.Random(9)
    checked = 0
    for _round in range(80):
        pools = [pool("a", "203.0.113.0/27"), pool("b", "203.0.113.32-203.0.113.50"), pool("c", "2001:db8:5::/120")]
        peers = [peer("p1", myASN=64512, peerASN=64500, peerAddress="198.51.100.1", dualStackAddressFamily=True),
                 peer("p2", myASN=64512, peerASN=64512, peerAddress="198.51.100.2"),
                 peer("p3", myASN=64512, peerASN=64501, peerAddress="2001:db8:1::1")]
        advs = []
        for i in range(rng.randint(1, 4)):
            spec: dict = {"ipAddressPools": rng.sample(["a", "b", "c"], rng.randint(1, 3))}
            if rng.random() < 0.5:
                spec["peers"] = rng.sample(["p1", "p2", "p3"], rng.randint(1, 3))
            if rng.random() < 0.5:
                spec["communities"] = [f"64512:{rng.randint(1, 3)}"]
            if rng.random() < 0.3:
                spec["localPref"] = rng.choice([100, 200])
            if rng.random() < 0.4:
                spec["serviceSelectors"] = [{"matchLabels": {"tier": rng.choice(["x", "y"])}}]
            advs.append(bgpadv(f"adv{i}", **spec))
        svcs = []
        for i, ip in enumerate(rng.sample([f"203.0.113.{n}" for n in range(1, 51)]
                                          + [f"2001:db8:5::{n:x}" for n in range(1, 200)], rng.randint(0, 25))):
            svcs.append(service(f"s{i}", labels={"tier": rng.choice(["x", "y"])}, status_ips=[ip]))
        try:
            cfg = parse_resources(pools + peers + advs + svcs)
        except ConfigError:
            continue  # e.g. two localPref values for one pool: refused by MetalLB's rules
        checked += 1
        decision = bgp_decision("n1", [NodeView("n1", {})], cfg)
        r = render("n1", decision, cfg)
        nets = {p for fams in r.networks.values() for ps in fams.values() for p in ps}
        for p in decision.peers:
            want = {rt.prefix: rt for rt in decision.routes.get(p.name, [])}
            for prefix in nets | {"203.0.113.51/32", "203.0.113.64/32", "2001:db8:5::100/128", "198.51.100.0/24"}:
                got = _sends(r.text, f"nlb-{p.name}-out", prefix)
                fam_ok = (":" in prefix) == (":" in (p.address or "")) or p.dual_stack_address_family
                if prefix in want and fam_ok:
                    rt = want[prefix]
                    sets = set(got) if got is not None else {"<denied>"}
                    expect = set()
                    if rt.communities:
                        expect.add("set community " + " ".join(rt.communities))
                    if rt.local_pref:
                        expect.add(f"set local-preference {rt.local_pref}")
                    assert got is not None and sets == expect, (p.name, prefix, got, expect)
                else:
                    assert got is None, (p.name, prefix, got)
    assert checked >= 30
