# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 20 part 6: the router role keeps a config file it did not write (no nocloudlb-managed line) as
FILE.nocloudlb-backup, once, with a WARNING in the play's output; its own files, and no file, are left
alone (tasks/backup.yml run through Ansible on localhost, playbooks/backup.yml)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, collections_dir, render

BIN = Path(sys.executable).parent
PLAYBOOK = Path(__file__).parent / "playbooks" / "backup.yml"


@pytest.fixture(scope="module")
def play(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    out = tmp_path_factory.mktemp("out")
    (out / "foreign.conf").write_text("router id 192.0.2.1;\n# the operator's own\n")
    (out / "ours.conf").write_text(render("bird"))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections_dir()),
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
               ANSIBLE_HOME=str(home), ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(PLAYBOOK), "-e",
                           json.dumps({"out_dir": str(out)})],
                          cwd=str(home), env=env, capture_output=True, text=True, timeout=300, check=False)
    start = proc.stdout.find("{")
    assert start >= 0, f"no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    results: list[tuple[str, dict]] = []
    for p in json.loads(proc.stdout[start:])["plays"]:
        for t in p["tasks"]:
            results.append((t["task"]["name"], t["hosts"]["localhost"]))
    return proc, results, out


def _warnings(results, path):
    return [r["msg"] for name, r in results
            if "Warn that the role replaces" in name and not r.get("skipped") and path in r.get("msg", "")]


def test_a_foreign_file_is_kept_once_with_a_warning(play):
    proc, results, out = play
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    backup = out / "foreign.conf.nocloudlb-backup"
    assert backup.read_text() == "router id 192.0.2.1;\n# the operator's own\n"  # the first one, not overwritten
    warned = _warnings(results, str(out / "foreign.conf"))
    assert len(warned) == 1 and warned[0].startswith("WARNING: localhost: "), warned
    assert "kept as " + str(backup) in warned[0] and "--diff" in warned[0]


def test_the_roles_own_file_and_no_file_are_left_alone(play):
    _proc, results, out = play
    assert not (out / "ours.conf.nocloudlb-backup").exists()
    assert not (out / "absent.conf.nocloudlb-backup").exists() and not (out / "absent.conf").exists()
    assert _warnings(results, str(out / "ours.conf")) == [] and _warnings(results, str(out / "absent.conf")) == []


def test_every_template_carries_the_marker_and_every_kind_backs_up_first():
    import yaml

    for kind in ("frr", "bird", "gobgp"):
        assert "nocloudlb-managed" in render(kind).splitlines()[1], kind
        tasks = yaml.safe_load((ROOT / "roles" / "router" / "tasks" / f"{kind}.yml").read_text())
        names = [next(iter(k for k in t if k.startswith("ansible.builtin."))) for t in tasks]
        assert names.index("ansible.builtin.include_tasks") < names.index("ansible.builtin.template"), kind
