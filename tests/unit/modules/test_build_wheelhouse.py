# -*- coding: utf-8 -*-
"""The speaker role's controller-side wheelhouses (roles/speaker/files/build_wheelhouse.py): one per
kind of node, so that a node whose Python, CPU or C library differ from the controller's gets
wheels it can install, of the same versions, without compiling and without a package index."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "roles" / "speaker" / "files" / "build_wheelhouse.py"
sys.path.insert(0, str(SCRIPT.parent))
import build_wheelhouse as bw  # noqa: E402


@pytest.mark.parametrize(("plat", "has", "lacks", "python"), [
    ("linux-x86_64-py3.13-glibc2.41", ["manylinux_2_41_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64",
                                       "manylinux1_x86_64"], ["manylinux_2_42_x86_64", "linux_x86_64"], "3.13"),
    ("linux-x86_64-py3.11-glibc2.36", ["manylinux_2_36_x86_64", "manylinux2010_x86_64"],
     ["manylinux_2_39_x86_64"], "3.11"),
    ("linux-aarch64-py3.12-glibc2.39", ["manylinux_2_39_aarch64", "manylinux2014_aarch64"],
     ["manylinux2010_aarch64", "manylinux_2_16_aarch64"], "3.12"),
    ("linux-x86_64-py3.12-musl1.2", ["musllinux_1_2_x86_64", "musllinux_1_0_x86_64"], ["manylinux2014_x86_64"], "3.12"),
])
def test_the_platform_tags_a_node_installs(plat, has, lacks, python):
    tags, py = bw.pip_platforms(plat)
    assert py == python and set(has) <= set(tags) and not set(lacks) & set(tags)


@pytest.mark.parametrize("plat", ["linux-x86_64-py3.12-", "macosx-14.0-arm64-py3.12-", "linux-riscv64-py3.13-glibc2.41",
                                  "linux-x86_64-py3.13-glibc3.1", "nonsense"])
def test_a_platform_without_wheels_is_refused_with_its_name(plat):
    with pytest.raises(ValueError, match="platform"):
        bw.pip_platforms(plat)


def test_this_python_reads_as_a_platform_the_builder_serves():
    out = subprocess.run([sys.executable, str(SCRIPT), "--print-platform"], capture_output=True, text=True, check=True)
    tags, python = bw.pip_platforms(out.stdout.strip())
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}" and tags


def installable(wheel: str, plat: str) -> bool:
    tags, python = bw.pip_platforms(plat)
    version = tuple(int(x) for x in python.split("."))
    interpreter = "cp" + python.replace(".", "")
    supported = set(cpython_tags(version, platforms=tags)) | set(compatible_tags(version, interpreter, tags))
    return bool(parse_wheel_filename(wheel)[3] & supported)


def test_a_debian_13_node_gets_wheels_for_python_3_13_of_the_controllers_versions(tmp_path):
    """The real index, the real source: the controller (this Python) builds its own wheelhouse and
    fetches one for Debian 13 (Python 3.13, glibc 2.41); the second run builds nothing."""
    trixie = "linux-x86_64-py3.13-glibc2.41"
    argv = [sys.executable, str(SCRIPT), "--source", str(ROOT), "--cache", str(tmp_path), "--digest", "d1",
            "--platform", trixie]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    own = bw.node_platform()
    assert set(out["wheelhouses"]) == {own, trixie} and set(out["built"]) == {own, trixie}
    wheels = {p: sorted(w.name for w in Path(d).glob("*.whl")) for p, d in out["wheelhouses"].items()}
    versions = {p: {parse_wheel_filename(w)[:2] for w in ws} for p, ws in wheels.items()}
    assert versions[own] == versions[trixie] and any(str(nv[0]) == "nocloudlb" for nv in versions[trixie])
    assert all(installable(w, trixie) for w in wheels[trixie]), wheels[trixie]
    # compiled dependencies (PyYAML, MarkupSafe) differ: the controller's cp311 ones would not install there
    assert not all(installable(w, trixie) for w in wheels[own]) or sys.version_info[:2] == (3, 13)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    assert json.loads(again.stdout)["built"] == []
    assert not list(tmp_path.glob("d1/*.tmp"))


def test_a_platform_it_cannot_serve_fails_with_one_line_and_leaves_nothing(tmp_path):
    argv = [sys.executable, str(SCRIPT), "--source", str(ROOT), "--cache", str(tmp_path), "--digest", "d2",
            "--platform", "linux-x86_64-py3.12-", "--controller", "linux-x86_64-py3.11-glibc2.36"]
    (tmp_path / "d2" / "linux-x86_64-py3.11-glibc2.36").mkdir(parents=True)  # the controller's, built before
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "linux-x86_64-py3.12-" in res.stderr and "Traceback" not in res.stderr
    assert sorted(p.name for p in (tmp_path / "d2").iterdir()) == ["linux-x86_64-py3.11-glibc2.36"]
