"""Hosts of two Debian releases, reached the way Ansible reaches real machines: SSH with become.

One bookworm (Debian 12) and one trixie (Debian 13) host with ``ssh: true``. Ansible runs in the
lab's controller namespace with the lab's key and known_hosts (each host's own key), and logs in
as ``operator`` with sudo. It runs as root with a HOME of its own: on these machines the venv's
interpreter lives under /root (pyenv), which no other local user may execute (``runuser -u
nobody -- .venv/bin/ansible`` fails with "Permission denied"); labctl's ``controller-exec -u``
and ``Lab.controller_cmd(user=...)`` run an unprivileged user's own ansible there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import labctl
import pytest
from conftest import REPO, leftovers

pytestmark = pytest.mark.timeout(600)  # a first run builds two images (a few minutes each)

NAME = "pyssh"
TOPOLOGY = {
    "name": NAME,
    "segments": {"lan": {}},
    "hosts": {
        "deb12": {"groups": ["ssh"], "ssh": True,
                  "interfaces": [{"segment": "lan", "addresses": ["198.51.100.31/24", "2001:db8:1::31/64"]}]},
        "deb13": {"groups": ["ssh"], "ssh": True, "release": "trixie",
                  "interfaces": [{"segment": "lan", "addresses": ["198.51.100.32/24"]}]},
    },
}
ANSIBLE = REPO / ".venv" / "bin" / "ansible"


def test_bookworm_and_trixie_over_ssh_with_become() -> None:
    lab = labctl.Lab(NAME)
    lab.down()
    home = Path(tempfile.mkdtemp(prefix="nlab-ssh-home-"))
    try:
        res = lab.up(TOPOLOGY, timeout=90)
        assert res["system_state"] == {"deb12": "running", "deb13": "running"}, res["system_state"]
        assert res["controller_ns"] == labctl.PREFIX + "-pyssh-ssh-ctl"
        # trixie's systemd (257) refuses cgroup v1: its host runs on the unified hierarchy
        assert set(lab.cgroup_dirs("deb13")) == {"unified"}
        assert lab.exec("deb13", ["systemctl", "is-active", "ssh.service"]).stdout.strip() == "active"
        inv = json.loads(lab.ssh_inventory_file.read_text())["all"]
        assert inv["vars"]["ansible_user"] == "operator" and inv["vars"]["ansible_become"] is True
        assert inv["hosts"]["deb12"]["ansible_host"] == "198.51.100.31"
        # the controller namespace has the lab's link only, and no route beyond it
        routes = subprocess.run(lab.controller_cmd(["ip", "-4", "route", "show"]), text=True, check=True,
                                capture_output=True).stdout
        assert routes.split() == ["198.51.100.0/24", "dev", "eth0", "proto", "kernel", "scope", "link", "src",
                                  "198.51.100.254"], routes

        cmd = lab.controller_cmd(
            ["env", "-i", f"HOME={home}", f"PATH={ANSIBLE.parent}:/usr/bin:/bin", "ANSIBLE_HOST_KEY_CHECKING=True",
             # no ControlPersist: no ssh master may outlive the test (and the lab)
             "ANSIBLE_NOCOLOR=1", "ANSIBLE_SSH_ARGS=-o ControlMaster=no", str(ANSIBLE), "ssh",
             "-i", str(lab.ssh_inventory_file), "-o",
             "-m", "ansible.builtin.setup", "-a", "filter=ansible_distribution*,ansible_python,ansible_user_id"])
        out = subprocess.run(cmd, text=True, capture_output=True, timeout=120, cwd=home, check=False)
        assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
        facts = {}
        for line in out.stdout.splitlines():
            host, _sep, rest = line.partition(" | SUCCESS => ")
            if rest:
                facts[host] = json.loads(rest)["ansible_facts"]
        assert sorted(facts) == ["deb12", "deb13"], out.stdout
        assert facts["deb12"]["ansible_distribution"] == facts["deb13"]["ansible_distribution"] == "Debian"
        assert facts["deb12"]["ansible_distribution_major_version"] == "12"
        assert facts["deb13"]["ansible_distribution_major_version"] == "13"
        assert facts["deb13"]["ansible_distribution_release"] == "trixie"
        assert [facts[h]["ansible_python"]["version"]["minor"] for h in ("deb12", "deb13")] == [11, 13]
        assert {f["ansible_user_id"] for f in facts.values()} == {"root"}  # become (sudo) worked
        print({h: (f["ansible_distribution_version"], f["ansible_python"]["version"]) for h, f in facts.items()})
    finally:
        lab.down()
        shutil.rmtree(home, ignore_errors=True)
    assert not any(leftovers(NAME).values()), leftovers(NAME)
