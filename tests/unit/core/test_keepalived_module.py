# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The keepalived_render module, run as Ansible runs it (a JSON args file), in and out of check mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import l2adv, pool, service
from test_keepalived_check import assert_keepalived_accepts

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def collections(collections_path, tmp_path_factory):
    """(the collections directory, a directory for the modules' argument files)"""
    return collections_path, tmp_path_factory.mktemp("kad-args")


def run(collections, args, check_mode=False):
    top, tmp = collections
    payload = dict(args, _ansible_check_mode=check_mode)
    f = tmp / "args.json"
    f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))
    env = dict(os.environ, PYTHONPATH=str(top))
    proc = subprocess.run([sys.executable, str(ROOT / "plugins/modules/keepalived_render.py"), str(f)],
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    return json.loads(proc.stdout)


DOCS = [pool("web4", "198.51.100.200-198.51.100.220"), l2adv("lan", interfaces=["eth0"]),
        service("web", status_ips=["198.51.100.200"]), service("db", status_ips=["198.51.100.201"])]


@pytest.mark.parametrize("check_mode", [False, True])
def test_module_renders_every_node_and_reports_masters(collections, check_mode):
    out = run(collections, {"resources": DOCS, "nodes": ["n1", "n2", "n3"], "profile": "fast"}, check_mode)
    assert not out.get("failed"), out
    assert out["changed"] is False
    assert sorted(out["configs"]) == ["n1", "n2", "n3"]
    for text in out["configs"].values():
        assert "advert_int 0.1" in text
        assert_keepalived_accepts(text)
    assert out["masters"]["198.51.100.200"] in {"n1", "n2", "n3"}
    assert set(out["vrids"]) == {i["name"] for i in out["instances"]}


def test_module_service_view_and_single_node(collections):
    out = run(collections, {"resources": DOCS, "nodes": ["n1", "n2", "n3"], "service": "prod/web", "node": "n2"})
    assert list(out["configs"]) == ["n2"]
    view = out["service"]
    assert "198.51.100.200" in view["keepalived"] and "198.51.100.201" not in view["keepalived"]
    assert '"name": "web"' in view["speaker"] and '"name": "db"' not in view["speaker"]
    assert_keepalived_accepts(view["keepalived"])


def test_module_refuses_with_every_problem_named(collections):
    out = run(collections, {"resources": DOCS, "nodes": [{"name": "n1", "interfaces": ["ens3"]}],
                            "version": 3, "auth_pass": "secret12"})
    assert out["failed"]
    assert "VRRPv3 (RFC 5798) has no authentication" in out["msg"]
    assert "secret12" not in json.dumps(out)  # no_log
    out = run(collections, {"resources": DOCS, "nodes": [{"name": "n1", "interfaces": ["ens3"]}]})
    assert out["failed"] and sorted(out["errors"]) == [
        'keepalived: service "prod/db" (VIP 198.51.100.201): node "n1" has no interface "eth0" (it has: ens3)',
        'keepalived: service "prod/web" (VIP 198.51.100.200): node "n1" has no interface "eth0" (it has: ens3)',
    ]
