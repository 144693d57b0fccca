# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pool_validate run for real: ansible-playbook on localhost, against the fixture manifests."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml
from conftest import FIXTURES

BIN = pathlib.Path(sys.executable).parent

SECRET = "s3cret-Never-Logged"

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: good
      nocloud.loadbalancer.pool_validate:
        resources: "{{ lookup('ansible.builtin.file', fixtures + '/metallb_l2.manifest') | from_yaml_all }}"
    - name: bgp
      nocloud.loadbalancer.pool_validate:
        resources: "{{ lookup('ansible.builtin.file', fixtures + '/metallb_bgp.manifest') | from_yaml_all }}"
    - name: bad
      nocloud.loadbalancer.pool_validate:
        resources:
          - {apiVersion: metallb.io/v1beta1, kind: IPAddressPool, metadata: {name: a},
             spec: {addresses: [198.51.100.0/24]}}
          - {apiVersion: metallb.io/v1beta1, kind: IPAddressPool, metadata: {name: b},
             spec: {addresses: [198.51.100.128/25, 203.0.113.9-203.0.113.1]}}
          - {apiVersion: metallb.io/v1beta2, kind: BGPPeer, metadata: {name: r},
             spec: {myASN: 64500, peerASN: 64501, peerAddress: 198.51.100.1, holdTime: 30s, keepaliveTime: 40s}}
      ignore_errors: true
    - name: bgp bad input
      nocloud.loadbalancer.pool_validate:
        check_password_files: true
        resources:
          - {apiVersion: metallb.io/v1beta1, kind: IPAddressPool, metadata: {name: a, labels: {use: bgp}},
             spec: {addresses: [203.0.113.0/28]}}
          - {apiVersion: metallb.io/v1beta1, kind: BFDProfile, metadata: {name: fast}, spec: {detectMultiplier: 300}}
          - {apiVersion: metallb.io/v1beta2, kind: BGPPeer, metadata: {name: r1},
             spec: {myASN: 64500, peerASN: 4294967296, peerAddress: 198.51.100.1, holdTime: 70000s}}
          - {apiVersion: metallb.io/v1beta2, kind: BGPPeer, metadata: {name: r2},
             spec: {myASN: 64500, peerASN: 64501, peerAddress: 198.51.100.2, passwordFile: "{{ missing }}"}}
          - {apiVersion: metallb.io/v1beta1, kind: BGPAdvertisement, metadata: {name: none},
             spec: {ipAddressPoolSelectors: [{matchLabels: {use: l2}}]}}
      ignore_errors: true
    - name: bgp missing password file
      nocloud.loadbalancer.pool_validate:
        check_password_files: true
        resources:
          - {apiVersion: metallb.io/v1beta1, kind: IPAddressPool, metadata: {name: a},
             spec: {addresses: [203.0.113.0/28]}}
          - {apiVersion: metallb.io/v1beta2, kind: BGPPeer, metadata: {name: r2},
             spec: {myASN: 64500, peerASN: 64501, peerAddress: 198.51.100.2, passwordFile: "{{ missing }}"}}
      ignore_errors: true
    - name: bgp password file
      nocloud.loadbalancer.pool_validate:
        check_password_files: true
        resources:
          - {apiVersion: metallb.io/v1beta1, kind: IPAddressPool, metadata: {name: a},
             spec: {addresses: [203.0.113.0/28]}}
          - {apiVersion: metallb.io/v1beta2, kind: BGPPeer, metadata: {name: r2},
             spec: {myASN: 64500, peerASN: 64501, peerAddress: 198.51.100.2, passwordFile: "{{ pwfile }}"}}
          - {apiVersion: metallb.io/v1beta1, kind: BGPAdvertisement, metadata: {name: all}}
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory, collections_path):
    """Task results of the playbook, run normally and in check mode: {mode: {task name: result}}."""
    tmp = tmp_path_factory.mktemp("pv")
    (tmp / "pb.yml").write_text(PLAYBOOK)
    (tmp / "pw").write_text(SECRET + "\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections_path), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", PATH=f"{BIN}:{os.environ.get('PATH', '')}",
               ANSIBLE_LOCAL_TEMP=str(tmp / "tmp"), ANSIBLE_HOME=str(tmp / "home"))
    out = {}
    for mode, extra in (("run", []), ("check", ["--check"])):
        proc = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
             "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"fixtures={FIXTURES}",
             "-e", f"pwfile={tmp / 'pw'}", "-e", f"missing={tmp / 'absent' / 'pw'}",
             str(tmp / "pb.yml"), *extra],
            cwd=tmp, env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        data = json.loads(proc.stdout)
        out[mode] = {t["task"]["name"]: t["hosts"]["localhost"] for t in data["plays"][0]["tasks"]}
    return out


def test_valid_manifest_returns_normalized_pools(results):
    good = results["run"]["good"]
    assert good["changed"] is False and not good.get("failed")
    first, second = good["pools"]
    assert first["name"] == "first-pool" and first["families"] == ["IPv4", "IPv6"]
    assert first["addresses"] == ["198.51.100.200-198.51.100.220", "2001:db8:100::/124"]
    # Two services share 198.51.100.210: one address assigned.
    assert first["counts"] == {"ipv4": {"total": 21, "assigned": 1, "available": 20},
                               "ipv6": {"total": 16, "assigned": 0, "available": 16}}
    assert first["l2Advertisements"] == ["example"] and first["serviceAllocation"] is None
    assert (second["autoAssign"], second["avoidBuggyIPs"], second["counts"]["ipv4"]["total"]) == (False, True, 15)
    assert good["advertisements"]["l2"][1] == {"name": "edge", "pools": ["second-pool"], "interfaces": [],
                                               "nodeSelectors": [], "serviceSelectors": []}
    assert good["summary"]["services"] == 3 and good["unpooled"] == []


def test_bgp_manifest(results):
    bgp = results["run"]["bgp"]
    assert bgp["summary"]["bgpPeers"] == 2 and bgp["summary"]["communities"] == 2
    local, external = bgp["advertisements"]["bgp"]
    assert local["communities"] == ["1234:1"] and external["aggregationLength"] == 24
    assert bgp["pools"][0]["counts"]["ipv6"]["total"] == 2**64


def test_bad_manifest_lists_every_error(results):
    bad = results["run"]["bad"]
    assert bad["failed"] is True
    assert bad["errors"] == [
        'IPAddressPool "b": spec.addresses[1]: invalid CIDR "203.0.113.9-203.0.113.1" in pool "b": invalid IP range '
        '"203.0.113.9-203.0.113.1": start IP "203.0.113.9" is after the end IP "203.0.113.1"',
        'IPAddressPool "b": spec.addresses[0]: CIDR "198.51.100.128/25" in pool "b" overlaps with already defined '
        'CIDR "198.51.100.0/24" (from "198.51.100.0/24" in pool "a")',
        'BGPPeer "r": spec.keepaliveTime: invalid BGPPeer timers: invalid keepaliveTime "40s", must be lower than '
        'holdTime "30s"',
    ]
    assert bad["msg"] == "invalid load balancer configuration (3 problems):\n" + "\n".join(bad["errors"])


def test_bgp_bad_input_refused_with_field_and_value(results):
    bad = results["run"]["bgp bad input"]
    assert bad["failed"] is True
    errors = bad["errors"]
    assert errors[:4] == [
        'BFDProfile "fast": spec.detectMultiplier: invalid detect multiplier value: invalid value 300, must be in '
        '2-255 range',
        'BGPPeer "r1": spec.peerASN: invalid value 4294967296, must be in 0-4294967295 range',
        'BGPPeer "r1": spec.peerASN: missing peer ASN and dynamicASN',
        'BGPPeer "r1": spec.holdTime: invalid BGPPeer timers: invalid hold time "70000s": must be at most 65535s '
        "(BGP's 16-bit field; FRR refuses more)",
    ]
    assert errors[4] == ('BGPAdvertisement "none": spec.ipAddressPoolSelectors: BGPAdvertisement "none" selects no '
                         'IPAddressPool (defined pools: "a")')
    assert len(errors) == 5  # the schema errors stop before the files are read


def test_missing_password_file_refused(results, tmp_path_factory):
    bad = results["run"]["bgp missing password file"]
    assert bad["failed"] is True and len(bad["errors"]) == 1
    assert bad["errors"][0].startswith('BGPPeer "r2": spec.passwordFile: password file "')
    assert bad["errors"][0].endswith('/absent/pw" not found')


def test_password_file_read_on_the_host_and_never_shown(results):
    ok = results["run"]["bgp password file"]
    assert not ok.get("failed") and ok["summary"]["bgpPeers"] == 1
    assert SECRET not in json.dumps(results["run"])


def test_check_mode_is_the_same_read_only_run(results):
    for name in ("good", "bgp", "bad", "bgp bad input", "bgp missing password file", "bgp password file"):
        run, check = dict(results["run"][name]), dict(results["check"][name])
        for volatile in ("invocation",):
            run.pop(volatile, None)
            check.pop(volatile, None)
        assert run == check
    assert results["check"]["good"]["changed"] is False


def test_fixture_manifests_are_yaml_streams():
    for path in sorted(FIXTURES.glob("*.manifest")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs and all({"apiVersion", "kind", "metadata"} <= set(d) for d in docs), path
