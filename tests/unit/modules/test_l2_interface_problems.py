"""Issue 20 part 6: at deploy time the speaker role refuses an interface the node's L2Advertisements
name that the node cannot announce on (missing, down, a bond slave or bridge port named instead of the
bond or bridge), naming the host and the interface.

The filter is tested on facts as Ansible gathers them; the role's task file then runs for real
(ansible-playbook, gathered facts) inside a network namespace this test builds (root only; bridge
ports stand in for bond slaves: no bonding module on these kernels)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, collections_dir

sys.path.insert(0, str(collections_dir()))
from ansible_collections.nocloud.loadbalancer.plugins.filter.l2_interface_problems import (  # noqa: E402
    l2_interface_problems,
)

BIN = Path(sys.executable).parent


def _adv(name, interfaces, selectors=None):
    spec = {"ipAddressPools": ["default"], "interfaces": interfaces}
    if selectors:
        spec["nodeSelectors"] = selectors
    return {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": name}, "spec": spec}


FACTS = {
    "interfaces": ["lo", "eth0", "eth1", "eth2", "eth3", "bond0", "br0", "vlan_100"],
    "lo": {"device": "lo", "active": True, "type": "loopback"},
    "eth0": {"device": "eth0", "active": True, "type": "ether"},
    "eth1": {"device": "eth1", "active": False, "type": "ether"},
    "eth2": {"device": "eth2", "active": True, "type": "ether"},
    "eth3": {"device": "eth3", "active": True, "type": "ether"},
    "bond0": {"device": "bond0", "active": True, "type": "bonding", "slaves": ["eth2"]},
    "br0": {"device": "br0", "active": True, "type": "bridge", "interfaces": ["eth3"]},
    "vlan_100": {"device": "vlan-100", "active": False, "type": "ether"},
}


def test_the_filter_names_each_interface_the_node_cannot_announce_on():
    docs = [{"kind": "IPAddressPool", "metadata": {"name": "default"}, "spec": {"addresses": ["198.51.100.200/29"]}},
            _adv("a", ["eth0", "eth1", "eth2", "eth9", "bond0", "lo"]),
            _adv("zone-a", ["eth3", "vlan-100"], [{"matchLabels": {"zone": "a"}}]),
            _adv("zone-b", ["eth7"], [{"matchLabels": {"zone": "b"}}]),
            _adv("all", [])]
    got = {p["iface"]: p for p in l2_interface_problems(docs, {"zone": "a"}, FACTS)}
    assert {n: p["reason"] for n, p in got.items()} == {
        "eth1": "down", "eth2": "enslaved", "eth3": "enslaved", "eth9": "missing", "lo": "loopback",
        "vlan-100": "down"}
    assert "name bond0 instead" in got["eth2"]["detail"] and "name br0 instead" in got["eth3"]["detail"]
    assert got["eth9"]["advertisements"] == ["a"] and "eth0" in got["eth9"]["detail"]
    # zone b: its advertisement is checked, zone a's is not
    got_b = {p["iface"] for p in l2_interface_problems(docs, {"zone": "b"}, FACTS)}
    assert "eth7" in got_b and "eth3" not in got_b
    assert l2_interface_problems([_adv("ok", ["eth0", "bond0", "br0"])], {}, FACTS) == []


def test_the_filter_wants_network_facts():
    with pytest.raises(Exception, match="network subset"):
        l2_interface_problems([], {}, {"hostname": "n1"})


PLAY = """
- name: The speaker role's interface check on this namespace
  hosts: localhost
  connection: local
  gather_facts: true
  gather_subset: [network]
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  tasks:
    - name: Check
      ansible.builtin.include_role:
        name: nocloud.loadbalancer.speaker
        tasks_from: interfaces.yml
"""


def _netns(name: str, *cmds: str) -> None:
    for cmd in cmds:
        subprocess.run(["ip", "netns", "exec", name, "sh", "-ec", cmd], check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the role's interface check on real interfaces needs root and iproute2")
    name = f"nlif-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        _netns(name,
               "ip link set lo up",
               "ip link add eth0 type veth peer name eth0p && ip link set eth0p up && ip link set eth0 up",
               "ip link add eth1 type veth peer name eth1p && ip link set eth1p up",  # eth1 left down
               "ip link add br0 type bridge && ip link add eth2 type veth peer name eth2p "
               "&& ip link set eth2 master br0 && ip link set eth2p up && ip link set eth2 up && ip link set br0 up",
               # the kernel reports the bridge's carrier through linkwatch, up to a second later: a play that
               # gathered facts before then saw br0 down (a flake), so wait for it
               "for i in $(seq 50); do [ \"$(cat /sys/class/net/br0/operstate)\" = up ] && exit 0; sleep 0.1; done; "
               "echo br0 never came up >&2; exit 1")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _play(netns: str, tmp: Path, documents: list[dict]) -> subprocess.CompletedProcess:
    (tmp / "play.yml").write_text(PLAY)
    (tmp / "vars.json").write_text(json.dumps({"speaker__documents": documents, "nocloudlb_node_labels": {}}))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections_dir()), ANSIBLE_HOME=str(tmp),
               ANSIBLE_LOCAL_TEMP=str(tmp / "tmp"), ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    return subprocess.run(["ip", "netns", "exec", netns, str(BIN / "ansible-playbook"), "-i", "localhost,",
                           str(tmp / "play.yml"), "-e", f"@{tmp / 'vars.json'}"],
                          cwd=str(tmp), env=env, capture_output=True, text=True, timeout=180, check=False)


def test_the_role_refuses_missing_down_and_enslaved_interfaces_naming_host_and_interface(netns, tmp_path):
    bad = _play(netns, tmp_path, [_adv("default", ["eth0", "eth1", "eth2", "eth9", "br0"])])
    out = bad.stdout + bad.stderr
    assert bad.returncode == 2, out[-3000:]
    assert "host localhost cannot announce on" in out, out[-3000:]
    assert "interface eth1 (L2Advertisement default): down" in out, out[-3000:]
    assert "interface eth2 (L2Advertisement default): enslaved: a port of bridge br0: name br0 instead" in out
    assert "interface eth9 (L2Advertisement default): missing: no such interface on this node" in out
    assert "interface eth0 " not in out and "interface br0 " not in out
    good = _play(netns, tmp_path, [_adv("default", ["eth0", "br0"]), _adv("all", [])])
    assert good.returncode == 0, (good.stdout + good.stderr)[-3000:]


def test_the_role_runs_the_check_before_installing_anything():
    tasks = yaml.safe_load((ROOT / "roles" / "speaker" / "tasks" / "main.yml").read_text())
    order = [t.get("ansible.builtin.import_tasks") for t in tasks]
    assert order.index("interfaces.yml") < order.index("install.yml")
    assert order.index("resources.yml") < order.index("interfaces.yml")
