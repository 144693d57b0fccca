"""The speaker role's templates, rendered by Ansible on localhost and checked by the core:
friendly variables become valid MetalLB documents, the config passes `nocloudlb validate`,
and `previous` is read back from a written config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT

BIN = Path(sys.executable).parent
PLAYBOOK = Path(__file__).parent / "playbooks" / "speaker_templates.yml"


@pytest.fixture(scope="module")
def run(tmp_path_factory, collections_path):
    home = tmp_path_factory.mktemp("home")
    out = tmp_path_factory.mktemp("out")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections_path), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
               ANSIBLE_HOME=str(home), ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_NOCOLOR="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    extra = json.dumps({"role_root": str(ROOT / "roles" / "speaker"), "out_dir": str(out),
                        "nocloudlb_cli": str(BIN / "nocloudlb")})
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(PLAYBOOK), "-e", extra],
                          cwd=str(home), env=env, capture_output=True, text=True, timeout=300, check=False)
    start = proc.stdout.find("{")
    assert start >= 0, f"no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(proc.stdout[start:])
    tasks = {t["task"]["name"]: t["hosts"]["localhost"] for p in report["plays"] for t in p["tasks"]}
    return proc, tasks, out


def test_the_play_succeeds(run):
    proc, tasks, _rest = run
    failed = {name: r.get("msg") for name, r in tasks.items() if r.get("failed")}
    assert proc.returncode == 0 and not failed, failed


def test_friendly_forms_become_metallb_documents(run):
    _proc, tasks, _rest = run
    docs = tasks["Show the documents"]["speaker__documents"]
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert kinds[:4] == [("IPAddressPool", "web4"), ("IPAddressPool", "web6"), ("IPAddressPool", "pinned"),
                         ("L2Advertisement", "default")]
    pools = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "IPAddressPool"}
    assert pools["web4"] == {"addresses": ["198.51.100.200-198.51.100.209"], "avoidBuggyIPs": True}
    assert pools["pinned"]["autoAssign"] is False and pools["pinned"]["serviceAllocation"]["priority"] == 10
    svcs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert svcs["web"]["metadata"]["annotations"] == {"metallb.io/address-pool": "web4",
                                                      "metallb.io/allow-shared-ip": "web"}
    assert svcs["web-alt"]["spec"]["ports"] == [{"port": 8081, "protocol": "TCP", "name": "alt"}]
    assert svcs["fixed"]["metadata"]["namespace"] == "default"
    assert svcs["fixed"]["metadata"]["annotations"]["metallb.io/loadBalancerIPs"] == "198.51.100.226"
    assert json.loads(svcs["local"]["metadata"]["annotations"]["nocloud.io/health-check"])["path"] == "/healthz"
    assert svcs["dns"]["metadata"]["annotations"]["nocloud.io/health-check"] == "tcp://127.0.0.1:53"
    assert svcs["dns"]["spec"]["ports"] == [{"port": 53, "protocol": "UDP"}]
    assert svcs["web6"]["spec"]["ipFamilies"] == ["IPv6"]
    assert svcs["other"]["spec"]["loadBalancerClass"] == "example.com/other"
    # the short forms: one port number, one address, one string where a list is expected
    assert svcs["single"]["spec"]["ports"] == [{"port": 8443, "protocol": "TCP"}]
    assert svcs["single"]["metadata"]["annotations"]["metallb.io/loadBalancerIPs"] == "198.51.100.227"
    assert svcs["single"]["spec"]["ipFamilies"] == ["IPv4"]
    assert pools["web6"] == {"addresses": ["2001:db8:1::200/125"]}


def test_allocation_honours_sharing_requests_and_families(run):
    _proc, tasks, _rest = run
    got = tasks["Allocate"]["assignments"]
    assert got["prod/web"] == got["prod/web-alt"]
    assert got["default/fixed"] == ["198.51.100.226"]
    assert got["default/single"] == ["198.51.100.227"]
    assert got["prod/web6"][0].startswith("2001:db8:1::")
    assert "default/other" not in got


def test_config_is_valid_for_the_daemon_and_previous_reads_back(run):
    _proc, tasks, out = run
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["node"] == {"name": "n1", "labels": {"zone": "a"}}
    assert cfg["memberlist"] == {"bind": "[2001:db8:1::11]:7946", "join": ["[2001:db8:1::11]:7946",
                                 "198.51.100.12:7946"], "profile": "fast", "keyFile": f"{out}/memberlist.key",
                                 "probeInterval": 0.2}
    assert cfg["handover"] == {"grace": 12}
    assert cfg["bgp"] == {"flowHandover": {"rate": 5000, "burst": 300}}  # checked by `nocloudlb validate` too
    assert tasks["Render the configuration"]["changed"] is True  # written only after `nocloudlb validate` passed
    previous = tasks["Show previous"]["previous"]
    assert previous == tasks["Allocate"]["assignments"]
