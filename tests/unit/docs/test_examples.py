"""Every module's EXAMPLES block is a valid task list: wrapped in a play and syntax-checked by
ansible-playbook against this collection (made importable through a temporary path)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
MODULES = sorted((ROOT / "plugins" / "modules").glob("*.py"))


def examples(path: Path) -> str:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EXAMPLES" for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise AssertionError(f"{path.name} has no EXAMPLES")


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_examples_block_is_a_task_list_ansible_accepts(module, tmp_path, collections_path):
    tasks = yaml.safe_load(examples(module))
    assert isinstance(tasks, list) and tasks, f"{module.name}: EXAMPLES is not a list of tasks"
    fqcn = f"nocloud.loadbalancer.{module.stem}"
    assert any(fqcn in t for t in tasks), f"{module.name}: no example calls {fqcn} by its FQCN"
    play = tmp_path / "examples.yml"
    play.write_text(yaml.safe_dump([{"name": f"EXAMPLES of {fqcn}", "hosts": "all", "gather_facts": False,
                                     "tasks": tasks}], sort_keys=False))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections_path), ANSIBLE_HOME=str(tmp_path / "h"),
               ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "--syntax-check",
                           str(play)], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
