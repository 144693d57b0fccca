# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router role renders FRR, BIRD 2 and GoBGP from the same variables; each file passes the
router's own checker (vtysh --dryrun, bird -p, gobgpd --dry-run), and what a router cannot do is
refused before rendering, with the router and the field named."""

from __future__ import annotations

import re

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from .conftest import FILES, KINDS, ROOT, check, render, router_config, variables

# Variable sets every kind must render into a config its checker accepts.
CASES = {
    "dual-stack": {},
    "ipv4 only": {"router_listen_ranges": ["198.51.100.0/24"], "router_pools": ["203.0.113.10-203.0.113.20"]},
    "ipv6 only": {"router_listen_ranges": ["2001:db8:1::/64"], "router_pools": ["2001:db8:100::/120"]},
    "no pools yet": {"router_pools": []},
    "no listen ranges": {"router_listen_ranges": []},
    "one path": {"router_maximum_paths": 1},
    "ibgp": {"router_nodes_asn": 64500},
    "4-byte asn": {"router_asn": 4200000000, "router_nodes_asn": 4200000001, "router_id": "198.51.100.254"},
    "slow timers": {"router_timers": [30, 90]},
    "host bits in a range": {"router_listen_ranges": ["198.51.100.7/24"]},
}
BFD = {"receive_interval": 100, "transmit_interval": 100, "detect_multiplier": 3}
EXTRAS = {  # what gobgp refuses
    "bfd": {"router_bfd": BFD},
    "bfd defaults": {"router_bfd": {"detect_multiplier": 5}},
    "password": {"router_password": "x" * 80},
    "password with quote-like characters": {"router_password": "a'b`c$d\\e{f}"},
    "password and bfd": {"router_password": "s3cret", "router_bfd": BFD},
    "bfd peers": {"router_bfd": BFD, "router_bfd_peers": ["198.51.100.12", "198.51.100.11", "2001:db8:1::11"],
                  "router_addresses": ["198.51.100.1/24", "192.0.2.1/24", "2001:db8:1::1/64"]},
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(CASES))
def test_every_kind_renders_what_its_checker_accepts(tools, kind, case):
    text = render(kind, **CASES[case])
    proc = check(tools, kind, text)
    assert proc.returncode == 0, f"{kind} refused its rendered config ({case}):\n{proc.stdout}{proc.stderr}\n{text}"


@pytest.mark.parametrize("kind", ["frr", "bird"])
@pytest.mark.parametrize("extra", list(EXTRAS))
def test_bfd_and_password_render_for_the_routers_that_have_them(tools, kind, extra):
    text = render(kind, **EXTRAS[extra])
    proc = check(tools, kind, text)
    assert proc.returncode == 0, f"{kind} refused its rendered config ({extra}):\n{proc.stdout}{proc.stderr}\n{text}"


def test_the_checkers_refuse_a_broken_file(tools):
    """The checkers are real: a file bent after rendering is refused by each."""
    frr = render("frr").replace("neighbor nodes passive", "neighbor nodes passive-ish")
    bird = render("bird").replace("{32,32}", "{33,33}")
    gobgp = render("gobgp").replace("passive-mode", "passive-mod")
    for kind, text in (("frr", frr), ("bird", bird), ("gobgp", gobgp)):
        proc = check(tools, kind, text)
        assert proc.returncode != 0, f"{kind} accepted a broken file:\n{text}"
    assert "Invalid prefix pattern range" in check(tools, "bird", bird).stderr
    assert "passive-mod" in check(tools, "gobgp", gobgp).stdout


def test_the_role_validates_with_these_commands():
    """The tests run the very commands of the role's `validate:` (with the fetched binaries)."""
    commands = {}
    for kind in KINDS:
        tasks = yaml.safe_load((ROOT / "roles" / "router" / "tasks" / f"{kind}.yml").read_text())
        commands[kind] = [t["ansible.builtin.template"]["validate"] for t in tasks if "ansible.builtin.template" in t]
    assert commands == {"frr": ["vtysh --dryrun -f %s"], "bird": ["bird -p -c %s"],
                        "gobgp": ["gobgpd --dry-run --pprof-disable --config-type toml -f %s"]}


def test_bird_policy():
    text = render("bird", router_password="s3cret-pass", router_bfd=BFD)
    assert "neighbor range 198.51.100.0/24 as 64512;" in text and "neighbor range 2001:db8:1::/64 as 64512;" in text
    assert "  passive on;" in text and "hold time 9;" in text and "keepalive time 3;" in text
    assert "  error wait time 1, 10;" in text  # a node back from a failure is taken back within seconds
    assert ("if net ~ [ 203.0.113.0/26{32,32}, 203.0.113.64/30{32,32}, 203.0.113.68/31{32,32}, "
            "203.0.113.70/32{32,32} ] then accept;") in text
    assert "if net ~ [ 2001:db8:100::/120{128,128} ] then accept;" in text
    assert text.count("export none;") == 2 and text.count("import filter nocloudlb_pools_") == 2
    assert text.count("merge paths on limit 8;") == 2 and text.count("export where source = RTS_BGP;") == 2
    assert 'password "s3cret-pass";' in text and "bfd on;" in text
    assert "min rx interval 100 ms;" in text and "multiplier 3;" in text
    assert "router id 198.51.100.1;" in text
    # no pools: nothing imported; one path: nothing merged
    empty = render("bird", router_pools=[], router_maximum_paths=1)
    assert "if net ~" not in empty and empty.count("merge paths off;") == 2
    assert "bfd" not in render("bird") and "password" not in render("bird")


def test_gobgp_policy_as_gobgpd_reads_it(tools):
    text = render("gobgp")
    proc = check(tools, "gobgp", text, debug=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dump = proc.stdout
    assert 'ImportPolicyList:    {"nocloudlb-pools"}' in dump
    assert 'DefaultImportPolicy: "reject-route"' in dump and 'DefaultExportPolicy: "reject-route"' in dump
    assert "UseMultiplePathsConfig{Enabled:true}" in dump
    assert "HoldTime:9, KeepaliveInterval:3" in dump and "PassiveMode:true" in dump
    assert 'DynamicNeighborConfig{Prefix:"198.51.100.0/24", PeerGroup:"nodes"}' in dump
    assert 'DynamicNeighborConfig{Prefix:"2001:db8:1::/64", PeerGroup:"nodes"}' in dump
    assert '{IpPrefix:"203.0.113.70/32", MasklengthRange:"32..32"}' in dump
    assert '{IpPrefix:"2001:db8:100::/120", MasklengthRange:"128..128"}' in dump
    assert "AuthPassword:\"\"" in dump
    # no pools: no policy at all, so the default (reject) takes every route
    proc = check(tools, "gobgp", render("gobgp", router_pools=[]), debug=True)
    assert proc.returncode == 0 and "ImportPolicyList:    {}" in proc.stdout and "PolicyDefinitions: nil" in proc.stdout


def test_frr_unchanged_by_the_kinds():
    """The frr kind renders what the role rendered before router_kind existed."""
    text = render("frr", router_password="s3cret", router_bfd=BFD)
    for line in (" neighbor nodes passive", " neighbor nodes password s3cret", " neighbor nodes bfd profile nodes",
                 " bgp listen range 198.51.100.0/24 peer-group nodes",
                 "ip prefix-list nocloudlb-pools-ipv4 seq 5 permit 203.0.113.0/26 ge 32 le 32",
                 "ipv6 prefix-list nocloudlb-pools-ipv6 seq 5 permit 2001:db8:100::/120 ge 128 le 128",
                 "  maximum-paths 8", "route-map nocloudlb-deny-all deny 10"):
        assert line + "\n" in text, line


def test_static_bfd_peers_take_the_routers_address_on_their_network():
    """FRR 10.2-10.3 nodes start BGP only once BFD is up; the router's static sessions come first."""
    extra = EXTRAS["bfd peers"]
    frr = render("frr", **extra)
    for peer in ("198.51.100.11 local-address 198.51.100.1", "198.51.100.12 local-address 198.51.100.1",
                 "2001:db8:1::11 local-address 2001:db8:1::1"):
        assert f" peer {peer}\n  profile nodes\n exit\n" in frr, peer
    bird = render("bird", **extra)
    assert ("  neighbor 198.51.100.11 local 198.51.100.1;\n" in bird
            and "  neighbor 2001:db8:1::11 local 2001:db8:1::1;\n" in bird)
    assert bird.index("neighbor 198.51.100.11 ") < bird.index("neighbor 198.51.100.12 ") < bird.index("2001:db8:1::11 ")
    # as the role passes them: Ansible's interface facts (a link-local address and lo are not chosen)
    facts = [{"device": "lo", "ipv4": {"address": "127.0.0.1", "netmask": "255.0.0.0"},
              "ipv6": [{"address": "::1", "prefix": "128", "scope": "host"}]},
             {"device": "eth0", "ipv4": {"address": "198.51.100.2", "netmask": "255.255.255.0"},
              "ipv4_secondaries": [{"address": "203.0.113.1", "netmask": "255.255.255.0"}],
              "ipv6": [{"address": "fe80::1", "prefix": "64", "scope": "link"},
                       {"address": "2001:db8:1::2", "prefix": "64", "scope": "global"}]}]
    out = router_config(variables("bird", router_bfd=BFD, router_bfd_peers=["2001:db8:1::11", "198.51.100.11"],
                                  router_addresses=facts))
    assert out["bfd_peers"] == [{"peer": "198.51.100.11", "local": "198.51.100.2", "interface": "eth0", "version": 4},
                                {"peer": "2001:db8:1::11", "local": "2001:db8:1::2", "interface": "eth0", "version": 6}]
    frr = render("frr", router_bfd=BFD, router_bfd_peers=["198.51.100.11"], router_addresses=facts)
    assert " peer 198.51.100.11 local-address 198.51.100.2 interface eth0\n  profile nodes\n" in frr
    assert " peer 198" not in render("frr", router_bfd=BFD) and "neighbor 198" not in render("bird", router_bfd=BFD)


# (kind, overrides, the message) - each refused by the check, before anything is rendered.
REFUSALS = [
    ("gobgp", {"router_bfd": BFD},
     "router gobgp: router_bfd: GoBGP has no BFD; leave router_bfd empty for gobgp, or use router_kind frr or bird"),
    ("gobgp", {"router_password": "s3cret"},
     "router gobgp: router_password: GoBGP sets TCP MD5 keys only for configured neighbours, not for "
     "dynamic-neighbors ranges, so the nodes' sessions could never come up; leave router_password empty for "
     "gobgp, or use router_kind frr or bird"),
    ("frr", {"router_password": "x" * 81},
     "router frr: router_password: invalid BGP password: longer than 80 bytes (the TCP MD5 key limit)"),
    ("bird", {"router_password": "x" * 81},
     "router bird: router_password: invalid BGP password: longer than 80 bytes (the TCP MD5 key limit)"),
    ("frr", {"router_password": "two words"},
     "router frr: router_password: invalid BGP password: only printable ASCII without spaces, '!' or '#' fits "
     "on FRR's \"neighbor ... password\" line"),
    ("bird", {"router_password": "a\nb"},
     "router bird: router_password: invalid BGP password: only printable ASCII without spaces"),
    ("bird", {"router_password": 'say"hi"'},
     'router bird: router_password: BIRD strings have no escapes, so a password with " cannot be written in '
     "bird.conf"),
    ("juniper", {}, "router juniper: router_kind: unknown router 'juniper'; choose one of frr, bird, gobgp"),
    ("bird", {"router_pools": ["203.0.113.0/26", "not-a-cidr"]},
     "router bird: router_pools: invalid address range 'not-a-cidr'"),
    ("gobgp", {"router_pools": ["203.0.113.9-203.0.113.1"]},
     "router gobgp: router_pools: invalid address range '203.0.113.9-203.0.113.1'"),
    ("frr", {"router_listen_ranges": ["198.51.100.10-198.51.100.20"]},
     "router frr: router_listen_ranges: '198.51.100.10-198.51.100.20' is not a CIDR"),
    ("bird", {"router_listen_ranges": "198.51.100.0/24"},
     "router bird: router_listen_ranges: a list of CIDRs is needed, not '198.51.100.0/24'"),
    ("bird", {"router_bfd": {"receive_interval": 5}},
     "router bird: router_bfd.receive_interval: 5 is outside 10-60000"),
    ("frr", {"router_bfd": {"echo_mode": True}},
     "router frr: router_bfd: unknown field(s) echo_mode (known: receive_interval, transmit_interval, "
     "detect_multiplier)"),
    ("bird", {"router_timers": [10, 5]}, "router bird: router_timers: keepalive 10 s is longer than hold 5 s"),
    ("gobgp", {"router_timers": [3]}, "router gobgp: router_timers: [keepalive, hold] in seconds is needed, not [3]"),
    ("bird", {"router_id": "2001:db8::1"}, "router bird: router_id: '2001:db8::1' is not an IPv4 address"),
    ("bird", {"router_maximum_paths": 0}, "router bird: router_maximum_paths: 0 is outside 1-256"),
    ("gobgp", {"router_asn": "sixty"}, "router gobgp: router_asn: 'sixty' is not a number"),
    ("gobgp", {"router_bfd_peers": ["198.51.100.11"]},
     "router gobgp: router_bfd_peers: GoBGP has no BFD; leave router_bfd_peers empty for gobgp"),
    ("frr", {"router_bfd_peers": ["198.51.100.11"], "router_addresses": ["198.51.100.1/24"]},
     "router frr: router_bfd_peers: BFD sessions need router_bfd (their timers), which is empty"),
    ("bird", {"router_bfd_peers": "198.51.100.11", "router_bfd": BFD},
     "router bird: router_bfd_peers: a list of the nodes' addresses is needed, not '198.51.100.11'"),
    ("frr", {"router_bfd_peers": ["198.51.100.0/24"], "router_bfd": BFD},
     "router frr: router_bfd_peers: '198.51.100.0/24' is not an IP address"),
    ("bird", {"router_bfd_peers": ["203.0.113.5"], "router_bfd": BFD, "router_addresses": ["203.0.113.1/24"]},
     "router bird: router_bfd_peers: 203.0.113.5 is in none of router_listen_ranges (198.51.100.0/24, "
     "2001:db8:1::/64), so it never peers with this router"),
    ("frr", {"router_bfd_peers": ["198.51.100.11"], "router_bfd": BFD, "router_addresses": ["192.0.2.1/24"]},
     "router frr: router_bfd_peers: 198.51.100.11 is on none of this router's networks (192.0.2.1/24); "
     "these BFD sessions are single-hop"),
    ("frr", {"router_bfd_peers": ["198.51.100.11"], "router_bfd": BFD},
     "router frr: router_bfd_peers: 198.51.100.11 is on none of this router's networks (no addresses known: "
     "gather facts)"),
]


@pytest.mark.parametrize(("kind", "overrides", "message"), REFUSALS,
                         ids=[f"{k}-{next(iter(o), 'router_kind')}-{i}" for i, (k, o, _m) in enumerate(REFUSALS)])
def test_refused_with_the_router_and_the_field_named(kind, overrides, message):
    with pytest.raises(AnsibleFilterError, match="^" + re.escape(message)):
        router_config(variables(kind, **overrides))


def test_what_is_refused_for_one_kind_is_fine_for_another():
    assert router_config(variables("bird", router_bfd=BFD, router_password="s3cret"))["bfd"] == BFD
    assert router_config(variables("frr", router_password='say"hi"'))["password_set"] is True
    assert router_config(variables("frr", router_bfd={"detect_multiplier": 5}))["bfd"] == {
        "receive_interval": 300, "transmit_interval": 300, "detect_multiplier": 5}


def test_the_result_holds_no_password():
    out = router_config(variables("bird", router_password="s3cret"))
    assert "s3cret" not in repr(out) and out["password_set"] is True


def test_templates_exist_for_every_kind():
    assert sorted(FILES) == sorted(KINDS)
    assert all((ROOT / "roles/router/templates" / f).exists() for f in FILES.values())
