"""Fixtures for the module tests: run a module file as Ansible does (JSON args file), and a
layer-2 segment in network namespaces (prefix ndp-) for the wire-level modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from collection_link import collections_dir  # a module run as a plain script imports its module_utils from there

ROOT = Path(__file__).resolve().parents[3]
MODULES = ROOT / "plugins" / "modules"


def run_module(name: str, args: dict, netns: str | None = None, check_mode: bool = False,
               diff: bool = False, timeout: float = 60) -> dict:
    """Run plugins/modules/<name>.py with args (optionally inside a netns) and return its JSON result."""
    payload = dict(args)
    if check_mode:
        payload["_ansible_check_mode"] = True
    if diff:
        payload["_ansible_diff"] = True
    args_file = Path(f"/tmp/ndp-args-{uuid.uuid4().hex[:8]}.json")
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))
    try:
        cmd = [sys.executable, str(MODULES / f"{name}.py"), str(args_file)]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(collections_dir()),
                                                                        os.environ.get("PYTHONPATH")])))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    finally:
        args_file.unlink(missing_ok=True)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        detail = f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        raise AssertionError(f"module {name} printed no JSON: {detail}") from None


@pytest.fixture
def segment():
    """A bare bridge in namespaces (tests/netns/netns.py, prefix ndp-): tests attach the hosts they
    need with their own MACs and addresses, Segment.attach(name, addrs, mac)."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    sys.path.insert(0, str(ROOT / "tests" / "netns"))
    from netns import make_segment

    seg = make_segment("ndp", hosts=0, client=False)
    try:
        yield seg
    finally:
        seg.close()
