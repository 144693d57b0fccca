# -*- coding: utf-8 -*-
"""labctl's topology keys release and ssh, and the pieces of the ssh controller that need no root."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("labctl_tool", ROOT / "roles" / "lab" / "files" / "labctl.py")
assert spec and spec.loader
labctl = importlib.util.module_from_spec(spec)
sys.modules["labctl_tool"] = labctl
spec.loader.exec_module(labctl)


def topo(**host: object) -> dict:
    return {"name": "t", "segments": {"lan": {}},
            "hosts": {"a": {"interfaces": [{"segment": "lan", "addresses": ["198.51.100.31/24"]}], **host},
                      "b": {"interfaces": [{"segment": "lan", "addresses": ["198.51.100.254/24"]}]}}}


def test_without_the_new_keys_a_topology_normalises_as_before() -> None:
    t = labctl.validate_topology(topo())
    assert set(t["hosts"]["a"]) == {"groups", "interfaces", "routes", "forwarding", "services", "vars"}
    default = labctl.load_topology(ROOT / "roles" / "lab" / "files" / "topologies" / "default.yml")
    assert labctl.topology_hash(default) == "ee646398faa16b0e"  # the hash of main's labctl


def test_release_and_ssh_are_recorded_and_checked() -> None:
    t = labctl.validate_topology(topo(release="trixie", ssh=True))
    assert t["hosts"]["a"]["release"] == "trixie" and t["hosts"]["a"]["ssh"] is True
    assert "ssh" not in labctl.validate_topology(topo(ssh=False))["hosts"]["a"]
    with pytest.raises(labctl.LabError, match="hosts.a.release"):
        labctl.validate_topology(topo(release="Trixie 13"))
    with pytest.raises(labctl.LabError, match="hosts.a.ssh: must be true or false"):
        labctl.validate_topology(topo(ssh="yes"))
    v6only = topo(ssh=True)
    v6only["hosts"]["a"]["interfaces"][0]["addresses"] = ["2001:db8:1::31/64"]
    with pytest.raises(labctl.LabError, match="needs an IPv4 address"):
        labctl.validate_topology(v6only)


def test_controller_takes_the_highest_free_address_of_the_ssh_hosts_subnet(tmp_path: Path) -> None:
    t = labctl.validate_topology(topo(ssh=True))
    lab = labctl.Lab("t", state_root=tmp_path)
    links = lab.controller_links({"topology": t})
    assert links == [{"segment": "lan", "port": "ctl-0", "name": "eth0", "address": "198.51.100.253/24"}]
    assert lab.controller_ns == "nlab-t-ssh-ctl"


def test_image_flavours_differ_and_the_mirror_falls_back_to_the_machines_release(tmp_path: Path) -> None:
    assert {"openssh-server", "sudo"} <= set(labctl.image_packages())  # every image; sshd enabled per host
    src = tmp_path / "debian.sources"
    src.write_text("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\n"
                   "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n")
    assert labctl.debian_mirror("trixie", src, fallback="bookworm") == "http://mirror.example/debian"
    with pytest.raises(labctl.LabError, match="Suites: trixie"):
        labctl.debian_mirror("trixie", src)
