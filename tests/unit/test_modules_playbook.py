# -*- coding: utf-8 -*-
"""Run tests/playbooks/modules.yml with ansible-playbook and check what the modules returned.

The playbook asserts on its own; this test also reads every task's result
through the ansible.posix.json callback, so that a task that was silently
skipped, or a message that changed, fails here. The collection is found
through a temporary ANSIBLE_COLLECTIONS_PATH holding
ansible_collections/nocloud/loadbalancer -> this checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "tests" / "playbooks" / "modules.yml"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def play(tmp_path_factory, collections_path):
    home = tmp_path_factory.mktemp("ansible_home")
    env = dict(os.environ)
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(collections_path),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        ANSIBLE_NOCOLOR="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", str(PLAYBOOK), "--diff"],
        cwd=str(home),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    start = proc.stdout.find("{")
    assert start >= 0, f"no JSON from ansible-playbook (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(proc.stdout[start:])
    tasks = {}
    for play_ in report["plays"]:
        for task in play_["tasks"]:
            tasks[task["task"]["name"]] = task["hosts"]["localhost"]
    return proc, report, tasks


def test_playbook_passes_every_assertion(play):
    proc, report, tasks = play
    stats = report["stats"]["localhost"]
    assert proc.returncode == 0, proc.stderr + proc.stdout[-4000:]
    assert stats["failures"] == 0
    assert stats["rescued"] == 5  # the five bad cases, each failing the way it should
    assert stats["skipped"] == 0
    assert not [name for name, result in tasks.items() if name == "Not reached" or result.get("skipped")]


def test_good_manifest_allocation(play):
    tasks = play[2]
    first = tasks["Allocate addresses for the good manifest"]
    assert first["changed"] is True
    assert first["assignments"] == {
        "default/both": ["2001:db8:100::", "203.0.113.16"],
        "default/db": ["203.0.113.1"],
        "default/fixed": ["198.51.100.210"],
        "infra/dns-tcp": ["198.51.100.200"],
        "infra/dns-udp": ["198.51.100.200"],
        "prod/api": ["198.51.100.220"],
        "prod/extra": ["198.51.100.221"],
        "prod/web": ["198.51.100.201"],
    }
    assert first["pools_by_service"]["prod/api"] == "web-team"
    assert first["diff"]["before"] == {}
    assert first["diff"]["after"] == first["assignments"]
    names = [s["metadata"]["name"] for s in first["services"]]
    assert names == ["web", "api", "extra", "dns-tcp", "dns-udp", "db", "both", "fixed", "elsewhere"]
    both = first["services"][names.index("both")]
    assert both["status"] == {"loadBalancer": {"ingress": [{"ip": "2001:db8:100::"}, {"ip": "203.0.113.16"}]}}
    assert "status" not in first["services"][names.index("elsewhere")]
    assert tasks["Allocate again with the previous assignments"]["changed"] is False


def test_stability_and_check_mode(play):
    tasks = play[2]
    grown = tasks["Add a service that sorts first and ask for one of the held addresses elsewhere"]
    assert grown["changes"] == {"added": {"aaa/aaa": ["198.51.100.202"]}, "changed": {}, "removed": {}}
    assert grown["warnings"] == [
        'Failed to allocate IP for "aaa/thief": can\'t change sharing key for "aaa/thief", address also in use by '
        "prod/web"
    ]
    checked = tasks["Allocate in check mode"]
    assert checked["changed"] is True
    assert checked["assignments"]["prod/web"] == ["198.51.100.209"]


def test_bad_cases_fail_with_actionable_messages(play):
    tasks = play[2]
    crowded = tasks["Allocate three services from a pool of two addresses"]
    assert crowded["failed"] is True
    assert crowded["msg"] == 'Failed to allocate IP for "default/c": no available IPs'
    assert crowded["assignments"] == {"default/a": ["203.0.113.100"], "default/b": ["203.0.113.101"]}

    unmet = tasks["Allocate with requests that cannot be met, without failing"]
    assert not unmet.get("failed")
    assert unmet["failures"] == [
        'Failed to allocate IP for "default/nopool": unknown pool "missing"',
        'Failed to allocate IP for "default/outside": ["192.0.2.1"] is not allowed in config',
        'Failed to allocate IP for "default/two": port TCP/80 is already in use on "203.0.113.100"',
    ]

    one_bad = tasks["Allocate with one bad request among five"]
    assert one_bad["failed"] is True
    assert one_bad["msg"] == 'Failed to allocate IP for "default/bad": invalid metallb.io/loadBalancerIPs: "not-an-ip"'
    assert one_bad["assignments"] == {f"default/{n}": [f"203.0.113.{100 + i}"] for i, n in enumerate("abcd")}

    for name in ("Validate the bad manifest", "Allocate for the bad manifest"):
        bad = tasks[name]
        assert bad["failed"] is True
        assert bad["errors"] == [
            'IPAddressPool "typo": spec.addresses[0]: invalid CIDR "198.51.100.0/33" in pool "typo"',
            'IPAddressPool "backwards": spec.addresses[0]: invalid CIDR "198.51.100.20-198.51.100.10" in pool '
            '"backwards": invalid IP range "198.51.100.20-198.51.100.10": start IP "198.51.100.20" is after the end '
            'IP "198.51.100.10"',
            'IPAddressPool "second": spec.addresses[0]: CIDR "203.0.113.8/29" in pool "second" overlaps with already '
            'defined CIDR "203.0.113.0/28" (from "203.0.113.0/28" in pool "first")',
        ], name

    previous = tasks["Pass an address that is not one"]
    assert previous["errors"] == ["previous['prod/web']: '198.51.100.300' is not an IP address"]
