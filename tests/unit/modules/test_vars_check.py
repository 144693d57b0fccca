"""Bad inventory and -e variables are refused by the real playbooks before any host is contacted.

Table-driven: every case of BAD is a host of one inventory (group ``speakers``) carrying its own bad
variables, so one run of ``playbooks/site.yml`` checks them all (vars_check names the host of a
message when not every host has it). The hosts are "reachable" only through an ssh executable that
does not exist, at documentation addresses: a run that got past the check would show an unreachable
host, and none may. The ``-e`` cases run drain.yml, rolling-restart.yml, the migrations and site.yml.
Every output is checked for the absence of a traceback and of Ansible's internal type names.
The inventories the project runs (molecule scenarios, tests/install) must pass the same check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, collections_dir

BIN = Path(sys.executable).parent
PLAYBOOKS = ROOT / "playbooks"
# Reaching a host needs this executable, which does not exist: no packet can leave.
TRIPWIRE = {"ansible_connection": "ssh", "ansible_ssh_executable": "/nonexistent/no-host-may-be-contacted",
            "ansible_become": False}

GOOD_SERVICE = {"name": "web", "ports": [8080]}

# (variables of one host, fragments every one of which some message about that host must hold)
BAD: list[tuple[dict, list[str]]] = [
    ({"nocloudlb_pools": [{"name": "web4", "adress": ["198.51.100.200-198.51.100.209"]}]},
     ["nocloudlb_pools[0] (name: web4): unknown key 'adress' (did you mean 'addresses'?)"]),
    ({"nocloudlb_pools": [{"addresses": ["198.51.100.0/28"]}]}, ["nocloudlb_pools[0]: name is required"]),
    ({"nocloudlb_pools": [{"name": "p", "addresses": [{"a": 1}]}]},
     ["nocloudlb_pools[0] (name: p): addresses[0]: {a: 1} is not a string"]),
    ({"nocloudlb_pools": [{"name": "p", "addresses": "198.51.100.0/28", "auto_assign": "maybe"}]},
     ["nocloudlb_pools[0] (name: p): auto_assign: 'maybe' is not a boolean"]),
    ({"nocloudlb_pools": "web4"}, ["nocloudlb_pools: 'web4' is not a list of mappings"]),
    ({"nocloudlb_pools": {"name": "web4", "addresses": "198.51.100.0/28"}},
     ["nocloudlb_pools: {name: 'web4', addresses: '198.51.100.0/28'} is a single mapping, not a list"]),
    ({"nocloudlb_pools": [{"name": "p", "addresses": "198.51.100.0/28", "service_allocation": {"priority": "high"}}]},
     ["nocloudlb_pools[0] (name: p): service_allocation.priority: 'high' is not a whole number"]),
    ({"nocloudlb_l2_advertisements": [{"name": "lan", "interface": ["eth0"]}]},
     ["nocloudlb_l2_advertisements[0] (name: lan): unknown key 'interface' (did you mean 'interfaces'?)"]),
    ({"nocloudlb_l2_advertisements": ["lan"]}, ["nocloudlb_l2_advertisements[0]: 'lan' is not a mapping"]),
    ({"nocloudlb_services": [{"name": "web", "ports": [443], "trafic_policy": "Local"}]},
     ["nocloudlb_services[0] (name: web): unknown key 'trafic_policy' (did you mean 'traffic_policy'?)"]),
    ({"nocloudlb_services": [{"name": "web", "ports": [443], "traffic_policy": "local"}]},
     ["nocloudlb_services[0] (name: web): traffic_policy: 'local' is not one of Cluster, Local",
      "(did you mean 'Local'?)"]),
    ({"nocloudlb_services": [GOOD_SERVICE, {"name": "api", "ports": ["http"]}]},
     ["nocloudlb_services[1] (name: api): ports[0]: 'http' is not a port number (1-65535)"]),
    ({"nocloudlb_services": [{"name": "web", "ports": 70000}]},
     ["nocloudlb_services[0] (name: web): ports[0]: 70000 is not a port number (1-65535)"]),
    ({"nocloudlb_services": [{"name": "web", "ips": "198.51.100.201"}]},
     ["nocloudlb_services[0] (name: web): ports is required"]),
    ({"nocloudlb_services": [{"name": "dns", "ports": {"port": 53, "protocol": "UDP"}}]},
     ["nocloudlb_services[0] (name: dns): ports: {port: 53, protocol: 'UDP'} is a single mapping, not a list"]),
    ({"nocloudlb_services": [{"name": "dns", "ports": [{"port": 53, "protocol": "udp"}]}]},
     ["nocloudlb_services[0] (name: dns): ports[0]: protocol: 'udp' is not one of TCP, UDP, SCTP",
      "(did you mean 'UDP'?)"]),
    ({"nocloudlb_services": [{"name": "dns", "ports": [{"prot": 53}]}]},
     ["nocloudlb_services[0] (name: dns): ports[0]: unknown key 'prot' (did you mean 'port'?)"]),
    ({"nocloudlb_services": [{"name": "web6", "ports": [80], "ip_families": ["IPv5"]}]},
     ["nocloudlb_services[0] (name: web6): ip_families[0]: 'IPv5' is not one of IPv4, IPv6"]),
    ({"nocloudlb_services": [{"name": "local", "ports": [80], "health_check": {"type": "http", "pth": "/"}}]},
     ["nocloudlb_services[0] (name: local): health_check: unknown key 'pth' (did you mean 'path'?)"]),
    ({"nocloudlb_services": [{"name": "local", "ports": [80], "health_check": "ftp://127.0.0.1/"}]},
     ["nocloudlb_services[0] (name: local): health_check: 'ftp://127.0.0.1/': unsupported health check"]),
    ({"nocloudlb_services": [{"name": "dp", "ports": [80],
                              "backends": {"method": "natt", "servers": [{"address": "198.51.100.31"}]}}]},
     ["nocloudlb_services[0] (name: dp): backends.method: 'natt' is not one of nat, fullnat, dr, tun",
      "(did you mean 'nat'?)"]),
    ({"nocloudlb_services": [{"name": "dp", "ports": [80], "backends": {"servers": [{"adress": "198.51.100.31"}]}}]},
     ["nocloudlb_services[0] (name: dp): backends.servers[0]: unknown key 'adress' (did you mean 'address'?)"]),
    ({"nocloudlb_services": [{"name": "dp", "ports": [80],
                              "backends": {"servers": [{"address": "198.51.100.31", "port": 0}]}}]},
     ["nocloudlb_services[0] (name: dp): backends.servers[0].port: 0 is not a port number"]),
    ({"nocloudlb_services": [{"name": "dp", "ports": [80], "backends": {
        "servers": [{"address": "198.51.100.31"}], "health_check": "tcp://198.51.100.31:80"}}]},
     ["nocloudlb_services[0] (name: dp): backends.health_check: 'tcp://198.51.100.31:80'", "leave the host out"]),
    ({"nocloudlb_services": [GOOD_SERVICE, {"namespace": "prod", "ports": [80]}]},
     ["nocloudlb_services[1]: name is required"]),
    ({"nocloudlb_resources": [{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                               "metadata": {"name": "raw"}, "sepc": {"addresses": ["198.51.100.0/28"]}}]},
     ["nocloudlb_resources[0] (kind: IPAddressPool, name: raw): unknown key 'sepc' (did you mean 'spec'?)"]),
    ({"nocloudlb_memberlist_overrides": {"probeIntervall": 0.2}},
     ["nocloudlb_memberlist_overrides: unknown key 'probeIntervall' (did you mean 'probeInterval'?)"]),
    ({"nocloudlb_memberlist_overrides": {"probeInterval": "fast"}},
     ["nocloudlb_memberlist_overrides.probeInterval: 'fast' is not a number"]),
    ({"nocloudlb_bgp_flow_handover": {"rate": "lots"}},
     ["nocloudlb_bgp_flow_handover.rate: 'lots' is not a whole number"]),
    ({"nocloudlb_memberlist_profile": "LAN "},
     ["nocloudlb_memberlist_profile: 'LAN ' is not one of lan, fast (did you mean 'lan'?)"]),
    ({"nocloudlb_memberlist_port": 99999}, ["nocloudlb_memberlist_port: 99999 is not a port number (1-65535)"]),
    ({"nocloudlb_node_labels": ["zone=a"]}, ["nocloudlb_node_labels: ['zone=a'] is not a mapping"]),
    ({"nocloudlb_wait_ready": "perhaps"}, ["nocloudlb_wait_ready: 'perhaps' is not a boolean"]),
    ({"nocloudlb_cluster_hosts": {"n1": 1}}, ["nocloudlb_cluster_hosts: {n1: 1} is not a list"]),
    # a warning (an unknown variable is ignored, not refused), with the closest known name
    ({"nocloudlb_servcies": [GOOD_SERVICE]},
     ["unknown variable nocloudlb_servcies, ignored (did you mean 'nocloudlb_services'?)"]),
]

# The documented short forms pass: one string where a list is expected, one port number.
GOOD = {"nocloudlb_pools": [{"name": "web4", "addresses": "198.51.100.200-198.51.100.209"}],
        "nocloudlb_l2_advertisements": [{"name": "lan", "interfaces": "eth0", "pools": "web4"}],
        "nocloudlb_services": [{"name": "web", "ports": 443, "ips": "198.51.100.201", "traffic_policy": "Local",
                                "health_check": "tcp://127.0.0.1:443"},
                               {"name": "dns", "ports": [{"port": 53, "protocol": "UDP"}], "ip_families": "IPv4"}],
        "nocloudlb_memberlist_overrides": {"probeInterval": 0.2}, "nocloudlb_watchdog_sec": "12"}

# (playbook, -e arguments, fragments of the refusal, fragments of a warning or None)
EXTRA: list[tuple[str, list[str], list[str], list[str] | None]] = [
    ("drain.yml", ["-e", "traget=case00"], ["-e target is required", "-e traget was given: did you mean target?"],
     ["-e traget is not a variable of this playbook, ignored (did you mean target?)"]),
    ("drain.yml", ["-e", "target=case00", "-e", "state=drain"],
     ["-e state: 'drain' is not one of drained, undrained (did you mean 'drained'?)"], None),
    ("drain.yml", ["-e", "target=case00", "-e", "grace_period=abc", "-e", "confirm_with_probe=maybe"],
     ["-e grace_period: 'abc' is not a number", "-e confirm_with_probe: 'maybe' is not a boolean"], None),
    ("drain.yml", ["-e", "target=n9"], ["-e target=n9 matches no host of the inventory"], None),
    ("rolling-restart.yml", ["-e", "maintenance=reboott"],
     ["-e maintenance: 'reboott' is not one of restart-speaker, reboot, none (did you mean 'reboot'?)"], None),
    ("migrate-to-speaker.yml", ["-e", "service=web"], ["-e service=web: give the service as NAMESPACE/NAME"], None),
    ("site.yml", ["-e", "nocloudlb_watchdog_sec=ten", "-e", "nocloudlb_hosts=case00"],
     ["-e nocloudlb_watchdog_sec: 'ten' is not a whole number"], None),
]


def clean(text: str) -> None:
    assert "Traceback" not in text, text
    assert "_Ansible" not in text and "<class" not in text, text


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    collections = collections_dir()
    home = tmp_path_factory.mktemp("home")
    env = dict(os.environ, SPEAKER_SPEC=str(ROOT / "roles" / "speaker" / "meta" / "argument_specs.yml"),
               ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_HOME=str(home),
               ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_HOST_KEY_CHECKING="False",
               ANSIBLE_DISPLAY_ARGS_TO_STDOUT="False", ANSIBLE_FORCE_COLOR="0", COLUMNS="400",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")

    def run(playbook: Path, inventory: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook), *extra],
                              cwd=str(home), env=env, capture_output=True, text=True, timeout=120, check=False)

    return run


def inventory(path: Path, hosts: dict[str, dict]) -> Path:
    data = {"all": {"vars": TRIPWIRE, "children": {"speakers": {"hosts": hosts}, "nodes": {"hosts": {}}}}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def messages(out: str) -> list[str]:
    """The check's messages: the lines of its refusal ('- ...') and its warnings."""
    lines = [line[2:] for line in out.splitlines() if line.startswith("- ")]
    lines += [line.split("[WARNING]: ", 1)[1] for line in out.splitlines() if "[WARNING]: " in line]
    return lines


def about(lines: list[str], host: str) -> list[str]:
    """The messages about one host: those ending with '(on ..., host, ...)'."""
    out = []
    for line in lines:
        m = re.search(r" \(on ([^()]+)\)$", line)
        if m and host in m.group(1).split(", "):
            out.append(line)
    return out


@pytest.fixture(scope="module")
def batch(runner, tmp_path_factory):
    hosts = {f"case{i:02d}": dict(vars_, ansible_host=f"192.0.2.{10 + i}") for i, (vars_, _f) in enumerate(BAD)}
    hosts["good"] = dict(GOOD, ansible_host="192.0.2.200")
    inv = inventory(tmp_path_factory.mktemp("inv") / "hosts.yml", hosts)
    proc = runner(PLAYBOOKS / "site.yml", inv)
    return proc, messages(proc.stdout + proc.stderr)


def test_the_batch_is_refused_by_the_check_before_any_host_is_contacted(batch):
    proc, lines = batch
    out = proc.stdout + proc.stderr
    clean(out)
    assert proc.returncode == 2, out
    assert "The variables are not valid" in out, out
    assert "UNREACHABLE" not in out and "no-host-may-be-contacted" not in out, out
    # the inventory's check (localhost), then the variables' check; nothing after it ran
    assert out.count("PLAY [") == 2 and "Gathering Facts" not in out, out
    assert len(BAD) >= 20 and lines


@pytest.mark.parametrize("index", range(len(BAD)), ids=[f"case{i:02d}" for i in range(len(BAD))])
def test_each_bad_variable_is_named_with_its_item_and_value(batch, index):
    _proc, lines = batch
    mine = about(lines, f"case{index:02d}")
    for fragment in BAD[index][1]:
        assert any(fragment in line for line in mine), f"{fragment!r} not in {mine}"


def test_the_documented_short_forms_pass(batch):
    _proc, lines = batch
    assert about(lines, "good") == []


@pytest.mark.parametrize("playbook,args,refused,warned", EXTRA, ids=[" ".join(a) for _p, a, _r, _w in EXTRA])
def test_bad_extra_vars_are_refused_before_any_host_is_contacted(runner, tmp_path, playbook, args, refused, warned):
    inv = inventory(tmp_path / "hosts.yml", {"case00": {"ansible_host": "192.0.2.10"}})
    proc = runner(PLAYBOOKS / playbook, inv, *args)
    out = proc.stdout + proc.stderr
    clean(out)
    assert proc.returncode == 2, out
    assert "UNREACHABLE" not in out and "no-host-may-be-contacted" not in out, out
    # refused in the plays that contact no host: the checks on localhost, before the first that acts
    assert out.split("PLAY [")[-1].startswith("Check"), out
    for fragment in refused:
        assert fragment in out, out
    for fragment in warned or []:
        assert any(fragment in line for line in messages(out)), out


# (playbook, -e arguments, the play that must start after the check: it contacts the host, the tripwire fails it)
VALID: list[tuple[str, list[str], str]] = [
    ("drain.yml", ["-e", "target=case00"], "PLAY [Drain or undrain nocloudlb nodes]"),
    ("drain.yml", ["-e", "target=speakers", "-e", "state=undrained", "-e", "grace_period=1.5"],
     "PLAY [Drain or undrain nocloudlb nodes]"),
    ("rolling-restart.yml", ["-e", "maintenance=none"], "PLAY [Restart nocloudlb nodes one at a time]"),
    ("migrate-to-speaker.yml", ["-e", "service=prod/web"], "PLAY [Move from keepalived to the speaker]"),
    ("site.yml", ["-e", "nocloudlb_watchdog_sec=12"], "PLAY [Deploy the nocloudlb speakers]"),
]


@pytest.mark.parametrize("playbook,args,next_play", VALID, ids=[f"{p} {' '.join(a)}" for p, a, _n in VALID])
def test_valid_extra_vars_pass_the_check(runner, tmp_path, playbook, args, next_play):
    inv = inventory(tmp_path / "hosts.yml", {"case00": dict(GOOD, ansible_host="192.0.2.10")})
    proc = runner(PLAYBOOKS / playbook, inv, *args)
    out = proc.stdout + proc.stderr
    clean(out)
    assert next_play in out and "no-host-may-be-contacted" in out, out  # the check passed; then the tripwire
    assert "[WARNING]: -e" not in out and "The variables are not valid" not in out, out


# -- the inventories the project runs pass -----------------------------------------------------------

INVENTORIES = sorted(p.parent for p in ROOT.glob("molecule/*/inventory/group_vars")) + [
    ROOT / "tests" / "install" / "infra" / "inventory"]

CHECK_ONLY = """\
- name: Check only
  hosts: speakers
  gather_facts: false
  tasks:
    - name: Check the variables as site.yml and keepalived.yml do
      nocloud.loadbalancer.vars_check:
        roles: [speaker, keepalived]
      run_once: true
      register: checked
    - name: The speaker role's own argument validation (as it runs when the role starts) passes too
      ansible.builtin.validate_argument_spec:
        argument_spec: "{{ (lookup('ansible.builtin.file', spec) | from_yaml).argument_specs.main.options }}"
      vars:
        spec: "{{ lookup('ansible.builtin.env', 'SPEAKER_SPEC') }}"
    - name: Show what was checked
      ansible.builtin.debug:
        msg: "{{ checked | to_json }}"
"""


def test_the_project_inventories_and_the_short_forms_pass(runner, tmp_path):
    playbook = tmp_path / "check.yml"
    playbook.write_text(CHECK_ONLY)
    assert len(INVENTORIES) >= 6
    short = tmp_path / "short-forms"
    (short / "group_vars").mkdir(parents=True)
    (short / "group_vars" / "speakers.yml").write_text(yaml.safe_dump(GOOD))
    for source in [*INVENTORIES, short]:
        inv = tmp_path / (source.relative_to(ROOT).as_posix().replace("/", "_") if source != short else "short")
        shutil.copytree(source / "group_vars", inv / "group_vars")
        host = dict(TRIPWIRE, ansible_host="192.0.2.10", lab_ipv4="198.51.100.11")
        (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
            "speakers": {"hosts": {"n1": host}}, "nodes": {"hosts": {"n1": {}}}}}}))
        proc = runner(playbook, inv)
        out = proc.stdout + proc.stderr
        clean(out)
        assert proc.returncode == 0, f"{source}:\n{out}"
        assert "[WARNING]" not in out, f"{source}:\n{out}"
        shown = json.loads(re.search(r'"msg": "(\{.*\})"', out).group(1).encode().decode("unicode_escape"))
        assert shown["checked_hosts"] == ["n1"] and shown["errors"] == [] and shown["skipped"] == {}, source
