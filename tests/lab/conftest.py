"""Fixtures for tests of the namespace lab (roles/lab/files/labctl.py).

These tests boot real systemd hosts in namespaces: they need root, the cgroup v1
freezer and named systemd hierarchies, and the base image (built on first use,
about a minute). Lab names used here start with "py" so they never meet a
developer's or molecule's lab.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LABCTL = REPO / "roles" / "lab" / "files" / "labctl.py"
DEFAULT_TOPOLOGY = REPO / "roles" / "lab" / "files" / "topologies" / "default.yml"
sys.path.insert(0, str(LABCTL.parent))

import labctl  # noqa: E402

if os.geteuid() != 0:
    pytest.skip("the lab needs root", allow_module_level=True)


@pytest.fixture(scope="session")
def image() -> Path:
    path = labctl.ensure_image()[0]
    return path


def one_segment(name: str, hosts: dict[str, str]) -> dict:
    """A lab topology with one segment `lan` and the given hosts (name -> IPv4 address/prefix)."""
    return {"name": name, "segments": {"lan": {}},
            "hosts": {h: {"interfaces": [{"segment": "lan", "addresses": [a]}]} for h, a in hosts.items()}}


def leftovers(name: str) -> dict[str, list[str]]:
    """Everything of lab `name` that down must remove: namespaces, mounts, cgroup dirs, state dir."""
    prefix = f"{labctl.PREFIX}-{name}-"
    cg = []
    hierarchies = {**labctl.cgroup_hierarchies(), **labctl.cgroup_hierarchies(v2=True)}  # v2: trixie hosts
    for mnt, own in hierarchies.values():
        base = mnt / own.lstrip("/")
        cg += [str(p) for p in base.glob(prefix + "*")]
    state_dir = labctl.STATE_ROOT / name
    return {
        "netns": [n for n in labctl.netns_list() if n.startswith(prefix)],
        "mounts": [m for m in labctl.mountpoints() if m.startswith(str(state_dir))],
        "cgroups": cg,
        "state": [str(state_dir)] if state_dir.exists() else [],
    }


@pytest.fixture(scope="session")
def lab(image: Path) -> Iterator[labctl.Lab]:
    """The default topology (n1-n3, c1 on lan; r1 between lan and edge; c2 on edge) as lab "pyt".

    Under pytest-xdist every worker boots its own, named after it ("pyt0", "pyt1", ...).
    """
    name = "pyt" + os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
    the_lab = labctl.Lab(name)
    the_lab.down()
    try:
        res = the_lab.up(DEFAULT_TOPOLOGY)
        assert all(v == "running" for v in res["system_state"].values()), res["system_state"]
        yield the_lab
    finally:
        the_lab.down()
    assert not any(leftovers(name).values()), leftovers(name)


@pytest.fixture
def clean(lab: labctl.Lab) -> Iterator[labctl.Lab]:
    """The session lab, with every fault a test left behind undone afterwards."""
    yield lab
    lab.undo_all()


def addr(lab: labctl.Lab, host: str, v6: bool = False) -> str:
    h = lab.state()["topology"]["hosts"][host]
    return next(a.split("/")[0] for i in h["interfaces"] for a in i["addresses"] if (":" in a) == v6)


def ping(lab: labctl.Lab, src: str, dst_ip: str, count: int = 1, wait: float = 1, interval: float = 0.2) -> int:
    """Number of echo replies src got from dst_ip."""
    res = lab.exec(src, ["ping", "-n", "-q", "-c", str(count), "-W", str(wait), "-i", str(interval), dst_ip],
                   check=False, timeout=count * interval + wait + 15)
    m = re.search(r"(\d+) received", res.stdout)
    assert m, f"ping output not understood: {res.stdout!r} {res.stderr!r}"
    return int(m.group(1))


def labctl_cli(*args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run labctl.py; with check, a non-zero exit fails the test with the command's stdout and stderr."""
    res = subprocess.run([sys.executable, str(LABCTL), *args], text=True, capture_output=True, timeout=timeout,
                         check=False)
    if check:
        assert res.returncode == 0, (f"labctl {' '.join(args)} exited with {res.returncode}\n"
                                     f"--- stdout:\n{res.stdout[-4000:]}\n--- stderr:\n{res.stderr[-8000:]}")
    return res
