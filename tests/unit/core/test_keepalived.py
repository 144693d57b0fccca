# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""keepalived plan and rendering: table tests, bad input, and `keepalived -t` on every config rendered here."""

from __future__ import annotations

import ipaddress
import re

import pytest
from conftest import l2adv, pool, service
from nocloudlb.core import keepalived as k
from nocloudlb.core.election import election_order
from nocloudlb.core.errors import ConfigError
from test_keepalived_check import assert_keepalived_accepts

NODES3 = [{"name": f"n{i}", "addresses": [f"198.51.100.1{i}", f"2001:db8:1::1{i}"], "interfaces": ["lo", "eth0"]}
          for i in (1, 2, 3)]


def base_docs(*services, interfaces=("eth0",)) -> list[dict]:
    return [pool("web4", "198.51.100.200-198.51.100.220"), pool("web6", "2001:db8:1::200-2001:db8:1::2ff"),
            l2adv("lan", interfaces=list(interfaces)), *services]


def svc(name, ip, **kw):
    return service(name, status_ips=[ip], **kw)


def backends(name, namespace="prod", **spec):
    return {"apiVersion": "nocloud.io/v1alpha1", "kind": "Backends", "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def render_all(p) -> dict[str, str]:
    """Every node's config, each checked by the real keepalived -t."""
    out = {}
    for node in p.nodes:
        text = k.render(p, node)
        assert_keepalived_accepts(text)
        out[node] = text
    return out


def blocks(text: str, kind: str) -> dict[str, str]:
    """NAME -> body of each top-level `kind NAME {...}` block."""
    found = {}
    for m in re.finditer(rf"^{kind} (\S+)(?: \d+)? \{{\n(.*?)^\}}", text, re.S | re.M):
        found[m.group(1)] = m.group(2)
    return found


def field(body: str, name: str) -> str:
    m = re.search(rf"^\s+{name} (.+)$", body, re.M)
    assert m, f"{name} not in {body}"
    return m.group(1)


# --------------------------------------------------------------------------- priorities and masters


def test_priorities_follow_our_election_order_and_master_is_our_leader():
    ips = [f"198.51.100.{200 + i}" for i in range(8)]
    docs = base_docs(*(svc(f"s{i}", ip) for i, ip in enumerate(ips)))
    p = k.plan(docs, NODES3)
    confs = render_all(p)
    for ip in ips:
        order = election_order(["n1", "n2", "n3"], ip)
        name = f"vip_{ip.replace('.', '_')}_eth0"
        prios = {n: int(field(blocks(confs[n], "vrrp_instance")[name], "priority")) for n in confs}
        assert sorted(prios, key=lambda n: -prios[n]) == order
        assert prios[order[0]] == 254 and prios[order[1]] == 128 and prios[order[2]] == 2  # spread (default step)
        assert field(blocks(confs[order[0]], "vrrp_instance")[name], "state") == "MASTER"
        assert field(blocks(confs[order[1]], "vrrp_instance")[name], "state") == "BACKUP"
        assert p.masters()[ip] == order[0]
    # the eight VIPs do not all land on one node (the hash spreads them)
    assert len(set(p.masters().values())) > 1
    for text in confs.values():
        assert "nopreempt" not in text  # we preempt: the first in order takes the VIP back


def test_priority_step_and_base():
    p = k.plan(base_docs(svc("a", "198.51.100.200")), NODES3, {"priority_base": 200, "priority_step": 50})
    assert sorted(m.priority for m in p.instances[0].members) == [100, 150, 200]
    render_all(p)


def test_default_step_spreads_the_candidates_so_backups_never_fire_together():
    # a backup takes over a master that gave up (priority 0) after (256 - priority) / 256 x advert_int:
    # at step 1 two backups fire 0.4 ms apart (0.1 s adverts) and both become master
    p = k.plan(base_docs(svc("a", "198.51.100.200")), NODES3, {"profile": "fast"})
    prios = [m.priority for m in p.instances[0].members]
    assert prios == [254, 128, 2]
    skews = [(256 - x) / 256 * p.advert_int for x in prios]
    assert min(b - a for a, b in zip(skews, skews[1:], strict=False)) > 0.045
    nodes = [{"name": f"m{i:02d}", "interfaces": ["eth0"]} for i in range(12)]
    many = k.plan(base_docs(svc("a", "198.51.100.200")), nodes)
    assert [m.priority for m in many.instances[0].members] == [254 - 23 * i for i in range(12)]
    assert k.spread_step(254, 254) == 1 and k.spread_step(254, 1) == 1


def test_preferred_node_selectors_come_first_as_in_the_speaker():
    adv = l2adv("lan", interfaces=["eth0"], preferredNodeSelectors=[
        {"weight": 10, "preference": {"matchLabels": {"zone": "b"}}}])
    nodes = [dict(n, labels={"zone": "b" if n["name"] == "n3" else "a"}) for n in NODES3]
    services = [svc(f"s{i}", f"198.51.100.{200 + i}") for i in range(5)]
    docs = [pool("web4", "198.51.100.200-198.51.100.220"), adv, *services]
    p = k.plan(docs, nodes)
    assert set(p.masters().values()) == {"n3"}


def test_node_selectors_leave_unselected_nodes_out():
    adv = l2adv("lan", interfaces=["eth0"], nodeSelectors=[{"matchLabels": {"lb": "yes"}}])
    nodes = [dict(n, labels={"lb": "yes"} if n["name"] != "n2" else {}) for n in NODES3]
    docs = [pool("web4", "198.51.100.200-198.51.100.220"), adv, svc("a", "198.51.100.200")]
    p = k.plan(docs, nodes)
    confs = render_all(p)
    assert "vrrp_instance" not in confs["n2"]
    assert {m.node for m in p.instances[0].members} == {"n1", "n3"}


def test_drain_label_does_not_change_the_config_but_the_track_file_does_the_move():
    nodes = [dict(n, labels={"node.kubernetes.io/exclude-from-external-load-balancers": ""}) if n["name"] == "n1"
             else n for n in NODES3]
    a = k.plan(base_docs(svc("a", "198.51.100.200")), NODES3)
    b = k.plan(base_docs(svc("a", "198.51.100.200")), nodes)
    assert k.render(a, "n1") == k.render(b, "n1")
    text = render_all(b)["n1"]
    assert 'file "/etc/keepalived/nocloudlb-drain"' in text
    inst = blocks(text, "vrrp_instance")["vip_198_51_100_200_eth0"]
    assert "nocloudlb_drain" in inst
    assert field(blocks(text, "track_file")["nocloudlb_drain"], "weight") == "0"  # 0: non-zero file = FAULT


# --------------------------------------------------------------------------- VRRP versions, timers, options


@pytest.mark.parametrize("version,profile,advert", [(3, "lan", "1"), (3, "fast", "0.1"), (2, "lan", "1")])
def test_version_and_profiles(version, profile, advert):
    p = k.plan(base_docs(svc("a", "198.51.100.200")), NODES3, {"version": version, "profile": profile})
    text = render_all(p)["n1"]
    assert f"vrrp_version {version}" in text
    assert field(blocks(text, "vrrp_instance")["vip_198_51_100_200_eth0"], "advert_int") == advert


def test_ipv6_instances_have_their_own_vrid_space():
    p = k.plan(base_docs(svc("a", "198.51.100.200"), svc("b", "2001:db8:1::200")), NODES3)
    fams = {i.family for i in p.instances}
    assert fams == {4, 6}
    text = render_all(p)["n1"]
    assert "2001:db8:1::200/128" in text and "198.51.100.200/32" in text


def test_unicast_peers_are_the_other_members():
    p = k.plan(base_docs(svc("a", "198.51.100.200"), svc("b", "2001:db8:1::200")), NODES3, {"unicast": True})
    confs = render_all(p)
    body = blocks(confs["n2"], "vrrp_instance")["vip_198_51_100_200_eth0"]
    assert field(body, "unicast_src_ip") == "198.51.100.12"
    assert re.search(r"unicast_peer \{\s+198.51.100.1[13]\s+198.51.100.1[13]\s+\}", body)
    body6 = blocks(confs["n2"], "vrrp_instance")["vip_2001_db8_1__200_eth0"]
    assert field(body6, "unicast_src_ip") == "2001:db8:1::12"


def test_authentication_only_with_vrrpv2():
    p = k.plan(base_docs(svc("a", "198.51.100.200")), NODES3, {"version": 2, "auth_pass": "s3cret"})
    body = blocks(render_all(p)["n1"], "vrrp_instance")["vip_198_51_100_200_eth0"]
    assert "auth_type PASS" in body and "auth_pass s3cret" in body
    with pytest.raises(ConfigError, match="VRRPv3 .* has no authentication"):
        k.plan(base_docs(svc("a", "198.51.100.200")), NODES3, {"version": 3, "auth_pass": "s3cret"})
    with pytest.raises(ConfigError, match="auth_pass: must be 1-8"):
        k.plan(base_docs(svc("a", "198.51.100.200")), NODES3, {"version": 2, "auth_pass": "muchtoolong"})


@pytest.mark.parametrize("options,message", [
    ({"version": 2, "profile": "fast"}, r"advert_int 0.1s \(profile fast\) needs VRRPv3"),
    ({"version": 4}, "version: must be 2 or 3"),
    ({"profile": "slow"}, "profile: \"slow\" is not one of lan, fast"),
    ({"group_by": "node"}, "group_by"),
    ({"priority_base": 255}, "255 is reserved"),
    ({"advert_int": 50}, "outside VRRPv3's range"),
    ({"bogus": 1}, "unknown option \"bogus\""),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ConfigError, match=message):
        k.plan(base_docs(svc("a", "198.51.100.200")), NODES3, options)


def test_vrrpv2_refuses_ipv6_naming_the_service():
    with pytest.raises(ConfigError, match=r'service "default/b": VIP 2001:db8:1::200 is IPv6'):
        k.plan(base_docs(svc("b", "2001:db8:1::200", namespace="default")), NODES3, {"version": 2})


def test_shared_ip_is_one_instance_serving_both_services():
    ann = {"metallb.io/allow-shared-ip": "k"}
    docs = base_docs(svc("a", "198.51.100.200", annotations=ann),
                     svc("b", "198.51.100.200", annotations=ann, ports=[{"port": 80, "protocol": "TCP"}]))
    p = k.plan(docs, NODES3)
    assert len(p.instances) == 1 and p.instances[0].services == ["prod/a", "prod/b"]
    render_all(p)


def test_group_by_pool_puts_a_pools_vips_in_one_instance_per_family():
    docs = base_docs(*(svc(f"s{i}", f"198.51.100.{200 + i}") for i in range(4)), svc("v6", "2001:db8:1::200"))
    p = k.plan(docs, NODES3, {"group_by": "pool"})
    assert sorted(i.name for i in p.instances) == ["pool_web4_v4_eth0", "pool_web6_v6_eth0"]
    v4 = next(i for i in p.instances if i.family == 4)
    assert v4.vips == [f"198.51.100.{200 + i}" for i in range(4)]
    assert v4.master == election_order(["n1", "n2", "n3"], "198.51.100.200")[0]  # the pool's first VIP decides
    render_all(p)


def test_every_listed_interface_gets_its_own_instance():
    p = k.plan(base_docs(svc("a", "198.51.100.200"), interfaces=("eth0", "eth1")),
               [dict(n, interfaces=["eth0", "eth1"]) for n in NODES3])
    assert sorted(i.name for i in p.instances) == ["vip_198_51_100_200_eth0", "vip_198_51_100_200_eth1"]
    # no interface in the advertisement: the node's own default interface
    p2 = k.plan(base_docs(svc("a", "198.51.100.200"), interfaces=()),
                [dict(n, interface="ens3", interfaces=["ens3"]) if n["name"] == "n3" else n for n in NODES3],
                {"interface": "eth0"})
    assert {m.node: m.interface for m in p2.instances[0].members} == {"n1": "eth0", "n2": "eth0", "n3": "ens3"}


# --------------------------------------------------------------------------- Local policy: vrrp_script


@pytest.mark.parametrize("check,script", [
    ("http://127.0.0.1:8082/ready", '"/usr/bin/curl -fsS -o /dev/null -k --max-time 1 http://127.0.0.1:8082/ready"'),
    ("tcp://127.0.0.1:8083", '"/bin/bash -c </dev/tcp/127.0.0.1/8083"'),
    ("exec:/usr/local/bin/ready --quick", '"/usr/local/bin/ready --quick"'),
    ('{"type": "http", "port": 8082, "path": "/", "interval": 0.5, "timeout": 0.4, "rise": 1, "fall": 2}',
     '"/usr/bin/curl -fsS -o /dev/null -k --max-time 0.4 http://127.0.0.1:8082/"'),
])
def test_local_policy_tracks_the_same_health_check(check, script):
    s = svc("local", "198.51.100.201", externalTrafficPolicy="Local",
            annotations={"nocloud.io/health-check": check})
    p = k.plan(base_docs(s, svc("web", "198.51.100.200")), NODES3)
    text = render_all(p)["n1"]
    body = blocks(text, "vrrp_script")["chk_prod_local"]
    assert field(body, "script") == script
    assert field(body, "weight") == "0"   # a failing check -> FAULT -> the VIP moves
    hc = s and p.scripts["chk_prod_local"]["check"]
    assert field(body, "rise") == str(hc["rise"]) and field(body, "fall") == str(hc["fall"])
    assert int(field(body, "interval")) >= 1   # keepalived takes whole seconds
    inst = blocks(text, "vrrp_instance")
    assert "chk_prod_local" in inst["vip_198_51_100_201_eth0"]
    assert "track_script" not in inst["vip_198_51_100_200_eth0"]  # Cluster policy: no check


def test_local_policy_without_health_check_is_refused():
    s = svc("local", "198.51.100.201", externalTrafficPolicy="Local")
    with pytest.raises(ConfigError, match='service "prod/local": externalTrafficPolicy Local needs'):
        k.plan(base_docs(s), NODES3)


# --------------------------------------------------------------------------- virtual_server from Backends


@pytest.mark.parametrize("method,kind", [("nat", "NAT"), ("dr", "DR"), ("tun", "TUN")])
@pytest.mark.parametrize("scheduler,algo", [("rr", "rr"), ("wrr", "wrr"), ("sh", "sh"), ("maglev", "mh")])
def test_virtual_server_methods_and_schedulers(method, kind, scheduler, algo):
    b = backends("web", method=method, scheduler=scheduler, healthCheck="http://127.0.0.1/health",
                 servers=[{"address": "198.51.100.31", "weight": 2}, {"address": "198.51.100.32"}])
    p = k.plan(base_docs(svc("web", "198.51.100.200"), b), NODES3)
    text = render_all(p)["n1"]
    vs = blocks(text, "virtual_server")
    assert list(vs) == ["198.51.100.200"]
    body = vs["198.51.100.200"]
    assert field(body, "lb_kind") == kind and field(body, "lb_algo") == algo and field(body, "protocol") == "TCP"
    assert "real_server 198.51.100.31 443 {" in body and "weight 2" in body
    assert "HTTP_GET" in body and "connect_port 443" in body  # the check's port defaults to the server's


def test_virtual_server_nat_with_own_port_and_tcp_check():
    b = backends("web", method="nat", healthCheck={"type": "tcp", "port": 9100, "fall": 4},
                 servers=[{"address": "198.51.100.31", "port": 8080}])
    text = render_all(k.plan(base_docs(svc("web", "198.51.100.200"), b), NODES3))["n2"]
    body = blocks(text, "virtual_server")["198.51.100.200"]
    assert "real_server 198.51.100.31 8080 {" in body and "TCP_CHECK" in body
    assert "connect_port 9100" in body and "retry 3" in body


def test_fullnat_is_refused_with_a_reason():
    b = backends("web", method="fullnat", servers=[{"address": "198.51.100.31"}])
    with pytest.raises(ConfigError, match=r'Backends "prod/web": spec.method: fullnat cannot be expressed in '
                                          r"keepalived: LVS has no full-NAT"):
        k.plan(base_docs(svc("web", "198.51.100.200"), b), NODES3)


@pytest.mark.parametrize("spec,message", [
    ({"method": "dr", "servers": [{"address": "198.51.100.31", "port": 8080}]}, r"servers\[0\].port: 8080 differs"),
    ({"method": "nat", "servers": [{"address": "nope"}]}, r"servers\[0\].address"),
    ({"method": "nat", "servers": [{"address": "198.51.100.31", "weight": 0}]}, r"weight: 0 is outside 1-256"),
    ({"method": "nat", "scheduler": "lc", "servers": [{"address": "198.51.100.31"}]}, "scheduler: \"lc\""),
    ({"method": "nat", "servers": []}, "at least one server"),
])
def test_bad_backends_are_named(spec, message):
    with pytest.raises(ConfigError, match=message):
        k.plan(base_docs(svc("web", "198.51.100.200"), backends("web", **spec)), NODES3)


# --------------------------------------------------------------------------- VRIDs


def test_vrids_are_stable_when_services_come_and_go():
    ips = [f"198.51.100.{200 + i}" for i in range(12)]
    first = k.plan(base_docs(*(svc(f"s{i}", ip) for i, ip in enumerate(ips))), NODES3).vrids()
    assert len(set(first.values())) == len(first)
    # drop three services, add two: everyone else keeps its VRID (with the last run's IDs as previous)
    later_ips = ips[3:] + ["198.51.100.215", "198.51.100.216"]
    later = k.plan(base_docs(*(svc(f"t{i}", ip) for i, ip in enumerate(later_ips))), NODES3,
                   {"previous": first}).vrids()
    for name, vrid in first.items():
        if name in later:
            assert later[name] == vrid
    assert len(set(later.values())) == len(later)
    # and without previous, the same input gives the same IDs (deterministic)
    again = k.plan(base_docs(*(svc(f"s{i}", ip) for i, ip in reversed(list(enumerate(ips))))), NODES3).vrids()
    assert again == first


def test_taken_vrids_are_avoided_and_a_previous_one_now_taken_moves():
    p = k.plan(base_docs(svc("a", "198.51.100.200")), NODES3)
    vrid = p.instances[0].vrid
    q = k.plan(base_docs(svc("a", "198.51.100.200")), NODES3,
               {"previous": p.vrids(), "taken_vrids": [{"interface": "eth0", "family": "IPv4", "vrids": [vrid]}]})
    assert q.instances[0].vrid != vrid
    # the same ID on IPv6 is another space: not taken for IPv4
    r = k.plan(base_docs(svc("a", "198.51.100.200")), NODES3,
               {"previous": p.vrids(), "taken_vrids": [{"interface": "eth0", "family": "IPv6", "vrids": [vrid]}]})
    assert r.instances[0].vrid == vrid


def test_pinned_vrid_collisions_are_refused_naming_the_service():
    docs = base_docs(svc("a", "198.51.100.200"), svc("b", "198.51.100.201"))
    p = k.plan(docs, NODES3, {"vrids": {"198.51.100.200": 7}})
    assert p.instances[0].vrid == 7
    render_all(p)
    with pytest.raises(ConfigError, match=r'service "prod/a" .*pinned VRID 7 collides with a VRID taken by another '
                                          r"VRRP user on eth0 IPv4"):
        k.plan(docs, NODES3, {"vrids": {"198.51.100.200": 7},
                              "taken_vrids": [{"interface": "eth0", "family": "IPv4", "vrids": [7]}]})
    with pytest.raises(ConfigError, match=r'service "prod/b" .*pinned VRID 7 collides with vip_198_51_100_200_eth0'):
        k.plan(docs, NODES3, {"vrids": {"198.51.100.200": 7, "198.51.100.201": 7}})


def many(n: int, family: int = 4) -> list[dict]:
    net = ipaddress.ip_network("198.51.100.0/24" if family == 4 else "2001:db8:1::/112")
    hosts = list(net.hosts())[:n] if family == 4 or n < 300 else None
    assert hosts is not None and len(hosts) >= n
    pools = [pool("big", str(net))]
    return pools + [l2adv("lan", interfaces=["eth0"])] + [svc(f"s{i}", str(ip)) for i, ip in enumerate(hosts)]


def test_255_instances_render_and_keepalived_accepts_them():
    p = k.plan(many(253), NODES3)  # 198.51.100.1-253: 253 VIPs
    assert len(p.instances) == 253
    # 255: two more from an IPv4 pool on the same interface
    docs = many(253) + [pool("more", "203.0.113.0/30"), svc("m1", "203.0.113.1"), svc("m2", "203.0.113.2")]
    p255 = k.plan(docs, NODES3)
    assert len(p255.instances) == 255
    assert sorted(i.vrid for i in p255.instances) == list(range(1, 256))
    text = k.render(p255, "n1")
    assert text.count("vrrp_instance ") == 255
    assert_keepalived_accepts(text)


def test_more_vips_than_vrids_is_refused_naming_the_limit():
    docs = many(253) + [pool("more", "203.0.113.0/29")] + [svc(f"m{i}", f"203.0.113.{i}") for i in range(1, 4)]
    with pytest.raises(ConfigError, match=r"interface eth0 IPv4: 256 VRRP instances need 256 virtual router IDs, but "
                                          r"VRRP has 255 per interface and family"):
        k.plan(docs, NODES3)
    # taken IDs lower the limit, and the message says how many are free
    with pytest.raises(ConfigError, match=r"and 10 are taken \(245 free\)"):
        k.plan(many(250), NODES3, {"taken_vrids": [{"interface": "eth0", "family": "IPv4",
                                                    "vrids": list(range(1, 11))}]})


# --------------------------------------------------------------------------- other bad input


def test_interface_missing_on_a_node_is_refused_naming_service_node_interface():
    nodes = [dict(n, interfaces=["lo", "ens3"]) if n["name"] == "n2" else n for n in NODES3]
    with pytest.raises(ConfigError, match=r'service "prod/a" \(VIP 198.51.100.200\): node "n2" has no interface '
                                          r'"eth0" \(it has: lo, ens3\)'):
        k.plan(base_docs(svc("a", "198.51.100.200")), nodes)


def test_priority_tie_is_refused():
    with pytest.raises(ConfigError, match=r'service "prod/a" \(VIP 198.51.100.200\): nodes "n\d" and "n\d" tie at '
                                          r"priority 254"):
        k.plan(base_docs(svc("a", "198.51.100.200")), NODES3, {"priority_step": 0})


def test_too_many_candidates_for_the_priority_range_names_the_limit():
    with pytest.raises(ConfigError, match=r"would get priority -46, below VRRP's minimum 1: 3 candidates need "
                                          r"priority_base - 2 x priority_step >= 1"):
        k.plan(base_docs(svc("a", "198.51.100.200")), NODES3, {"priority_base": 54, "priority_step": 50})


def test_unicast_needs_an_address_of_the_family():
    nodes = [dict(n, addresses=[n["addresses"][0]]) for n in NODES3]
    with pytest.raises(ConfigError, match=r'node "n\d" has no IPv6 address for unicast'):
        k.plan(base_docs(svc("b", "2001:db8:1::200")), nodes, {"unicast": True})


def test_bad_resources_are_refused_with_metallbs_messages():
    with pytest.raises(ConfigError, match="IPAddressPool"):
        k.plan([pool("bad", "198.51.100.300/24")], NODES3)


def test_render_unknown_node():
    p = k.plan(base_docs(svc("a", "198.51.100.200")), NODES3)
    with pytest.raises(ConfigError, match='node "n9" is not in the plan'):
        k.render(p, "n9")


def test_services_option_keeps_only_the_services_keepalived_owns():
    ann = {"metallb.io/allow-shared-ip": "k"}
    docs = base_docs(svc("a", "198.51.100.200"), svc("b", "198.51.100.201"),
                     svc("c", "198.51.100.202", annotations=ann),
                     svc("d", "198.51.100.202", annotations=ann, ports=[{"port": 80, "protocol": "TCP"}]))
    p = k.plan(docs, NODES3, {"services": ["prod/b"]})
    assert [i.vips for i in p.instances] == [["198.51.100.201"]]
    # the VRID of an instance does not depend on which other services keepalived owns
    assert p.vrids()["vip_198_51_100_201_eth0"] == k.plan(docs, NODES3).vrids()["vip_198_51_100_201_eth0"]
    render_all(p)
    with pytest.raises(ConfigError, match=r'services "prod/c", "prod/d" share VIP 198.51.100.202'):
        k.plan(docs, NODES3, {"services": ["prod/c"]})
    with pytest.raises(ConfigError, match=r'services: no Service "prod/zz"'):
        k.plan(docs, NODES3, {"services": ["prod/zz"]})


def test_every_instance_tracks_its_own_hold_file_beside_the_drain_file():
    p = k.plan(base_docs(svc("a", "198.51.100.200"), svc("b", "198.51.100.201")), NODES3,
               {"drain_file": "/etc/keepalived/nocloudlb-drain"})
    text = render_all(p)["n2"]
    tracks = blocks(text, "track_file")
    insts = blocks(text, "vrrp_instance")
    assert len(insts) == 2
    for name, inst in insts.items():
        hold = tracks[f"nocloudlb_hold_{name}"]
        assert field(hold, "file") == f'"/etc/keepalived/nocloudlb-hold-{name}"'
        assert field(hold, "weight") == "0"  # non-zero = FAULT, never a priority change
        assert field(hold, "init_file") == "0"  # created released; an existing 1 is kept across a reload
        assert f"nocloudlb_hold_{name}" in inst and "nocloudlb_drain" in inst
    files = {i["name"]: i["hold_file"] for i in k.summary(p)}
    assert files == {n: f"/etc/keepalived/nocloudlb-hold-{n}" for n in insts}
