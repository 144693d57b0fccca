# -*- coding: utf-8 -*-
"""Issue 20 part 6: a playbook whose host pattern matches no host of the inventory fails loudly
(naming the pattern and the groups the inventory has) instead of exiting 0 having done nothing.

Every playbook of playbooks/ that acts on the nodes runs for real (ansible-playbook, the collection
found through a temporary ANSIBLE_COLLECTIONS_PATH) against an inventory whose group is not named
``speakers``; then only its checking plays run against the same inventory with the group given, and
must pass (the check does not refuse a good inventory).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
INVENTORY = """\
[nodes]
n1 ansible_connection=local
n2 ansible_connection=local
[routers]
r1 ansible_connection=local
[loose]
"""
# playbook -> (extra vars of the failing run, extra vars of the passing run)
CASES = {
    "site.yml": ([], ["-e", "nocloudlb_hosts=nodes"]),
    "rolling_restart.yml": ([], ["-e", "nocloudlb_hosts=nodes"]),
    "rotate_key.yml": ([], ["-e", "nocloudlb_hosts=nodes"]),
    "keepalived.yml": ([], ["-e", "nocloudlb_hosts=nodes:!n2"]),
    "migrate_to_keepalived.yml": (["-e", "service=prod/web"], ["-e", "service=prod/web", "-e", "nocloudlb_hosts=n1"]),
    "migrate_to_speaker.yml": (["-e", "pool=web4"], ["-e", "pool=web4", "-e", "nocloudlb_hosts=nodes"]),
    "drain.yml": (["-e", "target=speakers"], ["-e", "target=n1"]),
}


# the old hyphenated names, kept as aliases that import the playbooks above: they must fail the same way
ALIASES = {"rolling-restart.yml": "rolling_restart.yml", "rotate-key.yml": "rotate_key.yml",
           "migrate-to-keepalived.yml": "migrate_to_keepalived.yml", "migrate-to-speaker.yml": "migrate_to_speaker.yml"}


def _playbook(name: str) -> Path:
    path = ROOT / "playbooks" / name
    assert path.exists(), f"playbooks/{name} not found"
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory, collections_path):
    home = tmp_path_factory.mktemp("ansible_home")
    (home / "inventory.ini").write_text(INVENTORY)
    return home, dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections_path), ANSIBLE_HOME=str(home),
                      ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                      ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_DEPRECATION_WARNINGS="False")


def _run(env, playbook: Path, extra: list[str]) -> subprocess.Popen:
    home, environ = env
    return subprocess.Popen([str(BIN / "ansible-playbook"), "-i", str(home / "inventory.ini"), str(playbook), *extra],
                            cwd=str(home), env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _checks_only(playbook: Path, out: Path) -> Path:
    """The playbook's plays on localhost (the checks), alone."""
    plays = [p for p in yaml.safe_load(playbook.read_text()) if p.get("hosts") == "localhost"]
    assert plays, f"{playbook.name}: no checking play on localhost"
    path = out / f"checks-{playbook.name}"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return path


def test_a_pattern_matching_no_host_fails_naming_it_and_the_groups(env):
    runs = {name: _run(env, _playbook(name), bad) for name, (bad, _good) in CASES.items()}
    runs |= {alias: _run(env, _playbook(alias), CASES[name][0]) for alias, name in ALIASES.items()}
    for name, proc in runs.items():
        out = proc.communicate(timeout=240)[0]
        assert proc.returncode == 2, f"{name}: rc {proc.returncode}\n{out[-3000:]}"
        said = "no host of the inventory matches" in out and "'speakers'" in out  # nocloudlb_hosts
        said = said or "-e target=speakers matches no host of the inventory" in out  # drain.yml
        assert said, f"{name}:\n{out[-3000:]}"
        assert "The inventory's groups: loose, nodes, routers" in out, f"{name}:\n{out[-3000:]}"
        # nothing ran on a node: the check is the first play, and it stopped the run
        assert "n1" not in out.split("PLAY RECAP")[-1], f"{name}:\n{out[-3000:]}"


def test_the_check_passes_when_the_pattern_matches(env, tmp_path):
    runs = {name: _run(env, _checks_only(_playbook(name), tmp_path), good) for name, (_bad, good) in CASES.items()}
    for name, proc in runs.items():
        out = proc.communicate(timeout=240)[0]
        assert proc.returncode == 0, f"{name}: rc {proc.returncode}\n{out[-3000:]}"
        assert "failed=0" in out, f"{name}:\n{out[-3000:]}"
