# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router role's templates rendered with the role's filters, and the routers' own checkers.

The checkers are Debian's (bird2 2.0.12, gobgpd 3.10, frr 8.4), unpacked by
scripts/fetch-router-tools.sh into .cache/routers (never installed: their maintainer scripts would
start daemons on this machine). No daemon is started: `bird -p` parses, `gobgpd --dry-run` reads
the file and exits (with pprof off, in a network namespace of its own when unshare works),
`vtysh --dryrun` parses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2
import pytest
from collection_link import collections_dir

ROOT = Path(__file__).resolve().parents[3]
TEMPLATES = ROOT / "roles" / "router" / "templates"
FETCH = ROOT / "scripts" / "fetch-router-tools.sh"
TOOLS = Path(os.environ.get("NOCLOUDLB_ROUTER_TOOLS", ROOT / ".cache" / "routers"))
FILES = {"frr": "frr.conf.j2", "bird": "bird.conf.j2", "gobgp": "gobgpd.conf.j2"}
KINDS = tuple(FILES)

# the filters import each other by their collection path, as Ansible loads them
sys.path.insert(0, str(collections_dir()))
from ansible_collections.nocloud.loadbalancer.plugins.filter.router_cidrs import router_cidrs  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.filter.router_config import router_config  # noqa: E402

# The role's defaults, with ranges and pools of both families.
BASE = {
    "router_kind": "frr",
    "router_asn": 64500,
    "router_nodes_asn": 64512,
    "router_id": "",
    "router_listen_ranges": ["198.51.100.0/24", "2001:db8:1::/64"],
    "router_pools": ["203.0.113.0/26", "203.0.113.64-203.0.113.70", "2001:db8:100::/120"],
    "router_maximum_paths": 8,
    "router_password": "",
    "router_bfd": {},
    "router_timers": [3, 9],
}


def variables(kind: str, **overrides) -> dict:
    out = dict(BASE, router_kind=kind)
    out.update(overrides)
    return out


def render(kind: str, **overrides) -> str:
    """The role's template for KIND, rendered as the role does (check.yml's filter, then the template
    with Ansible's defaults: trim_blocks, undefined facts chaining to their default())."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.ChainableUndefined,
                             trim_blocks=True, keep_trailing_newline=True)
    env.filters["nocloud.loadbalancer.router_cidrs"] = router_cidrs
    env.filters["nocloud.loadbalancer.router_config"] = router_config
    values = variables(kind, **overrides)
    context = dict(values, router__config=router_config(values), router__default_id="198.51.100.1",
                   ansible_managed="Ansible managed", inventory_hostname="r1")
    return env.get_template(FILES[kind]).render(context)


def _tools_ready() -> str | None:
    """None when TOOLS/bin has the three checkers, else why not."""
    if (TOOLS / ".ok").exists():
        return None
    if shutil.which("apt-get") is None:
        return "no apt-get here to fetch bird2/gobgpd/frr (scripts/fetch-router-tools.sh)"
    proc = subprocess.run([str(FETCH), str(TOOLS)], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0 or not (TOOLS / ".ok").exists():
        return f"scripts/fetch-router-tools.sh could not fetch the routers' checkers: {proc.stderr.strip()[-400:]}"
    return None


@pytest.fixture(scope="session")
def tools() -> Path:
    reason = _tools_ready()
    if reason:
        pytest.skip(reason)
    return TOOLS / "bin"


def _isolated() -> list[str]:
    """A network namespace of its own for gobgpd's dry run, when this machine allows it."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True, check=False).returncode == 0:
        return [unshare, "-n"]
    return []


def check(tools: Path, kind: str, text: str, debug: bool = False) -> subprocess.CompletedProcess:
    """Run the router's own checker on TEXT, the same command as the role's `validate:`."""
    with tempfile.TemporaryDirectory(prefix="router-check-") as tmp:
        path = Path(tmp) / FILES[kind].removesuffix(".j2")
        path.write_text(text, encoding="utf-8")
        if kind == "frr":
            cmd = [str(tools / "vtysh"), "--dryrun", "-f", str(path)]
        elif kind == "bird":
            cmd = [str(tools / "bird"), "-p", "-c", str(path)]
        else:
            cmd = _isolated() + [str(tools / "gobgpd"), "--dry-run", "--pprof-disable", "--config-type", "toml",
                                 "-f", str(path)] + (["-l", "debug"] if debug else [])
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, cwd=tmp)
