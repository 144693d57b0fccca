"""Up, idempotent up, down and crash cleanup, measured on real hosts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import labctl
import pytest
from conftest import DEFAULT_TOPOLOGY, LABCTL, REPO, labctl_cli, leftovers, one_segment

pytestmark = pytest.mark.timeout(240)


def test_up_fast_idempotent_and_down_leaves_nothing(image) -> None:
    lab = labctl.Lab("pyu")
    lab.down()
    try:
        res = lab.up(DEFAULT_TOPOLOGY)
        print(f"up of {len(res['booted'])} hosts with a cached image: {res['seconds']} s; {res['system_state']}")
        assert res["changed"] and len(res["booted"]) == 6
        assert res["system_state"] == {h: "running" for h in res["booted"]}
        assert res["seconds"] < 60
        pids = {h: lab.pid(h) for h in lab.hosts()}
        again = lab.up(DEFAULT_TOPOLOGY)
        assert again["changed"] is False and again["booted"] == []
        assert {h: lab.pid(h) for h in lab.hosts()} == pids
        inv = json.loads(lab.inventory_file.read_text())["all"]
        assert inv["vars"]["ansible_connection"] == "community.docker.nsenter"
        assert sorted(inv["children"]) == ["clients", "nodes", "routers"]
        assert inv["hosts"]["n1"]["ansible_nsenter_pid"] == pids["n1"]
        assert inv["hosts"]["n1"]["lab_ipv4"] == "198.51.100.11"
        st = lab.state()
    finally:
        lab.down()
    assert not any(leftovers("pyu").values()), leftovers("pyu")
    for h in st["hosts"].values():
        assert not labctl.pid_alive(h["pid"], h["pid_start"])
        assert not labctl.pid_alive(h["launcher"], h["launcher_start"])


def crash_mid_up(name: str) -> dict:
    """Start `labctl up`, kill -9 it once three hosts have booted; return the state it left."""
    state_file = labctl.STATE_ROOT / name / "state.json"
    labctl.Lab(name).down()
    proc = subprocess.Popen([sys.executable, str(LABCTL), "up", "-t", str(DEFAULT_TOPOLOGY), "-n", name],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                st = json.loads(state_file.read_text())
            except (FileNotFoundError, ValueError):
                st = {}
            if sum(1 for h in st.get("hosts", {}).values() if h.get("pid")) >= 3:
                break
            time.sleep(0.01)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    st = json.loads(state_file.read_text())
    alive = [h for h in st["hosts"].values() if labctl.pid_alive(h["pid"], h["pid_start"])]
    assert alive, "the crash was meant to leave hosts running"
    return st


def test_cleanup_after_a_crash_mid_up(image) -> None:
    """kill -9 the controller while hosts boot; cleanup finds everything from the state dir."""
    try:
        st = crash_mid_up("pyc")
        assert any(leftovers("pyc").values())
    finally:
        out = labctl_cli("cleanup", "-n", "pyc")
    assert json.loads(out.stdout)["changed"] is True
    assert not any(leftovers("pyc").values()), leftovers("pyc")
    for h in st["hosts"].values():
        assert not labctl.pid_alive(h.get("pid"), h.get("pid_start"))
        assert not labctl.pid_alive(h.get("launcher"), h.get("launcher_start"))
    assert json.loads(labctl_cli("down", "-n", "pyc").stdout)["changed"] is False


def test_up_after_a_crash_completes_the_lab(image) -> None:
    lab = labctl.Lab("pyr")
    try:
        crash_mid_up("pyr")
        res = lab.up(DEFAULT_TOPOLOGY)
        assert res["system_state"] == {h: "running" for h in lab.hosts()}, res
        for src, dst in (("c1", "198.51.100.11"), ("n3", "192.0.2.10"), ("c2", "198.51.100.50")):
            assert " 0% packet loss" in lab.exec(src, ["ping", "-c", "2", "-i", "0.2", "-W", "1", dst]).stdout
        assert lab.up(DEFAULT_TOPOLOGY)["changed"] is False
    finally:
        lab.down()
    assert not any(leftovers("pyr").values()), leftovers("pyr")


def test_up_repairs_half_made_namespace_handles(image) -> None:
    """A run killed inside `ip netns add|attach` leaves /run/netns/NAME as a plain file, no mount.

    Made here on purpose for a host's handle and the fabric's (whose namespace then dies with its
    bridges): the next up must replace both, rewire the host, and say it changed something.
    """
    topo = one_segment("pyh", {"h1": "198.51.100.41/24", "h2": "198.51.100.42/24"})
    lab = labctl.Lab("pyh")
    lab.down()
    try:
        lab.up(topo)
        for ns in (lab.host_ns("h1"), lab.fabric_ns):
            subprocess.run(["umount", f"/run/netns/{ns}"], check=True)
            assert os.path.isfile(f"/run/netns/{ns}") and not labctl.netns_handle_ok(ns)
        res = lab.up(topo)
        assert res["changed"] is True and res["booted"] == [], res
        assert labctl.netns_handle_ok(lab.host_ns("h1"), lab.pid("h1")) and labctl.netns_handle_ok(lab.fabric_ns)
        assert " 0% packet loss" in lab.exec("h1", ["ping", "-c", "2", "-i", "0.2", "-W", "1", "198.51.100.42"]).stdout
        assert lab.up(topo)["changed"] is False
    finally:
        lab.down()
    assert not any(leftovers("pyh").values()), leftovers("pyh")


def test_role_second_up_reports_no_change(image) -> None:
    env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1"}

    def play(action: str) -> str:
        res = subprocess.run(["ansible-playbook", str(REPO / "playbooks" / "lab.yml"), "-e", f"lab_action={action}",
                              "-e", "lab_name=pya"], env=env, text=True, capture_output=True, timeout=180, check=False)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        return res.stdout

    def changed(out: str) -> int:
        m = re.search(r"localhost\s+:.*changed=(\d+)", out)
        assert m, out[-2000:]
        return int(m.group(1))

    try:
        assert changed(play("up")) == 1
        assert changed(play("up")) == 0
        assert "running" in play("status")
    finally:
        assert changed(play("down")) == 1
    assert not any(leftovers("pya").values()), leftovers("pya")


def test_cgroup_v2_only_mode(image, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a machine with only the unified hierarchy gets (forced here with NLAB_CGROUP=v2)."""
    monkeypatch.setenv("NLAB_CGROUP", "v2")
    topo = one_segment("pyv", {"a1": "198.51.100.31/24", "a2": "198.51.100.32/24"})
    lab = labctl.Lab("pyv")
    lab.down()
    try:
        res = lab.up(topo)
        assert res["system_state"] == {"a1": "running", "a2": "running"}, res
        assert set(lab.cgroup_dirs("a1")) == {"unified"}
        assert "cgroup2" in lab.exec("a1", ["stat", "-f", "-c", "%T", "/sys/fs/cgroup"]).stdout
        ev = lab.fault_freeze("a1", silent=False)
        assert lab.status()["hosts"]["a1"]["frozen"] is True
        lab.undo(ev["id"])
        assert lab.host_state("a1") == "running"
        ev = lab.fault_restart("a2", hard=True)
        assert ev["state"] == "running"
        assert " 0% packet loss" in lab.exec("a2", ["ping", "-c", "2", "-i", "0.2", "198.51.100.31"]).stdout
    finally:
        lab.down()
    assert not any(leftovers("pyv").values()), leftovers("pyv")


@pytest.mark.parametrize("topology,message", [
    ({"name": "Bad", "segments": {"lan": {}}, "hosts": {"n1": {}}}, "name: must match"),
    ({"segments": {"lan": {}}, "hosts": {"n1": {"interfaces": [{"segment": "wan"}]}}},
     "hosts.n1.interfaces[0].segment: not a declared segment (lan) (got 'wan')"),
    ({"segments": {"lan": {}},
      "hosts": {"n1": {"interfaces": [{"segment": "lan", "addresses": ["198.51.100.300/24"]}]}}},
     "hosts.n1.interfaces[0].addresses: not an address"),
    ({"segments": {"lan": {}},
      "hosts": {"n1": {"interfaces": [{"segment": "lan", "addresses": ["198.51.100.1/24"]}]},
                "n2": {"interfaces": [{"segment": "lan", "addresses": ["198.51.100.1/24"]}]}}},
     "address already used by n1"),
    ({"segments": {"lan": {}},
      "hosts": {"n1": {"interfaces": [{"segment": "lan", "addresses": ["198.51.100.2/24"]}],
                       "routes": [{"to": "default", "via": "192.0.2.1"}]}}},
     "hosts.n1.routes[0].via: not on any subnet of this host's interfaces (got '192.0.2.1')"),
    ({"segments": {"lan": {}}, "hosts": {"n1": {"interfaces": [{"segment": "lan"}], "color": "red"}}},
     "hosts.n1: unknown keys"),
])
def test_topology_errors_name_field_and_value(topology: dict, message: str) -> None:
    with pytest.raises(labctl.LabError) as exc:
        labctl.validate_topology(topology)
    assert message in str(exc.value)
