# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router role through Ansible (playbooks/router_role.yml on localhost): its check loaded by FQCN,
each kind's template written with the role's own `validate:` command (the fetched checkers on PATH),
idempotent, check mode with a diff that writes nothing, and refusals whose message names the router
and the field and is not hidden."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import FILES, KINDS, ROOT, collections_dir

BIN = Path(sys.executable).parent
PLAYBOOK = Path(__file__).parent / "playbooks" / "router_role.yml"
TASKS = ROOT / "roles" / "router" / "tasks"


def _template_task(kind: str) -> dict:
    tasks = yaml.safe_load((TASKS / f"{kind}.yml").read_text())
    return next(t for t in tasks if "ansible.builtin.template" in t)


@pytest.fixture(scope="module")
def play(tools, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    out = tmp_path_factory.mktemp("out")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections_dir()),
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
               ANSIBLE_HOME=str(home), ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_NOCOLOR="1",
               PATH=f"{tools}{os.pathsep}{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    extra = {"role_root": str(ROOT / "roles" / "router"), "out_dir": str(out), "files": FILES,
             "validators": {k: _template_task(k)["ansible.builtin.template"]["validate"] for k in KINDS}}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(PLAYBOOK), "-e", json.dumps(extra)],
                          cwd=str(home), env=env, capture_output=True, text=True, timeout=300, check=False)
    start = proc.stdout.find("{")
    assert start >= 0, f"no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(proc.stdout[start:])
    tasks: dict[str, list[dict]] = {}
    for p in report["plays"]:
        for t in p["tasks"]:
            tasks.setdefault(t["task"]["name"], []).append(t["hosts"]["localhost"])
    return proc, report, tasks, out


def test_the_play_succeeds(play):
    proc, report, _tasks, _out = play
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert report["stats"]["localhost"]["failures"] == 0
    assert report["stats"]["localhost"]["rescued"] == 3


def test_each_kind_written_after_its_checker_passed_and_idempotent(play):
    _proc, _report, tasks, out = play
    for kind in KINDS:
        name = FILES[kind].removesuffix(".j2")
        first, again = tasks[f"Write ({kind})"][0], tasks[f"Write again ({kind})"][0]
        assert first.get("changed") is True and not first.get("failed"), first
        assert again.get("changed") is False, again
        assert (out / name).stat().st_size > 0
    assert "neighbor range 198.51.100.0/24 as 64512;" in (out / "bird.conf").read_text()
    assert 'prefix = "2001:db8:1::/64"' in (out / "gobgpd.conf").read_text()
    assert " bgp listen range 198.51.100.0/24 peer-group nodes" in (out / "frr.conf").read_text()


def test_check_mode_shows_the_diff_and_writes_nothing(play):
    _proc, _report, tasks, _out = play
    result = tasks["Four paths, in check mode with diff"][0]
    assert result["changed"] is True
    diff = result["diff"][0] if isinstance(result["diff"], list) else result["diff"]
    assert "merge paths on limit 4;" in diff["after"] and "merge paths on limit 8;" in diff["before"]
    written = base64.b64decode(tasks["Read the file back"][0]["content"]).decode()
    assert "merge paths on limit 8;" in written and "limit 4" not in written


def test_refusals_name_the_router_and_the_field_and_are_not_hidden(play):
    _proc, _report, tasks, _out = play
    shown = tasks["Show the refusals"][0]["msg"]
    # ansible-core says which task and filter failed, then the filter's own words, last
    assert shown["bfd"].endswith("failed: router gobgp: router_bfd: GoBGP has no BFD; leave router_bfd empty "
                                 "for gobgp, or use router_kind frr or bird"), shown
    assert shown["password"].endswith("failed: router frr: router_password: invalid BGP password: longer than 80 "
                                      "bytes (the TCP MD5 key limit)"), shown
    assert "p" * 81 not in shown["password"]
    assert shown["pool"].endswith("failed: router bird: router_pools: invalid address range '203.0.113.0/33': "
                                  "invalid IPNetwork 203.0.113.0/33"), shown


def test_the_role_hides_the_password_and_its_diff():
    """Every template that can hold router_password is no_log and diff-less when one is set, as FRR's was."""
    for kind in ("frr", "bird"):
        task = _template_task(kind)
        assert task["no_log"] == "{{ router_password | length > 0 }}", kind
        assert task["diff"] == "{{ router_password | length == 0 }}", kind
    assert "no_log" not in _template_task("gobgp")  # gobgp refuses a password: its file holds no secret
