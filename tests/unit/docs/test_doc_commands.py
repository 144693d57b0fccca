"""Every command of a ``console`` block in README.md and docs/*.md is run by a test, or its page says why
not (``not run by the tests: REASON`` on the command or as its block's first line).

The runners are asked which commands they run, with the same selection they run them by
(tests/install/doc_commands.py reads the pages for all of them): own_hosts.py (docs/own-hosts.md
block by block, and the node commands of README.md, troubleshooting.md and monitoring.md),
quickstart.py (docs/quickstart.md's lab commands, the drains), doc_playbooks.py (the
``ansible-playbook`` lines of README.md, howto.md and operations.md in the infra repository),
the Makefile's ``molecule-default`` step (``make lab``, ``make lab-down``) and .ci/run (``make test``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "install"))

import doc_commands  # noqa: E402
import doc_playbooks  # noqa: E402
import own_hosts  # noqa: E402
import quickstart  # noqa: E402


def make_recipe(target: str) -> str:
    text = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert m, f"no recipe for {target} in the Makefile"
    return m.group(1)


def runs() -> dict[tuple[str, str], str]:
    """(page, command) -> the runner that runs it."""
    out: dict[tuple[str, str], str] = {}
    for c in doc_commands.commands("docs/own-hosts.md"):
        out[(c.page, c.cmd)] = "own_hosts.py (the page's blocks)"
    for c in own_hosts.node_commands():
        out[(c.page, c.cmd)] = "own_hosts.py (node commands)"
    for page in ("docs/quickstart.md", "README.md"):
        for c in quickstart.selected(doc_commands.commands(page)):
            out[(c.page, c.cmd)] = "quickstart.py"
    by_text = {c.cmd: c for phase in ("deploy", "day2") for c in doc_playbooks.selected(phase)}
    for c in doc_commands.all_commands():
        if c.cmd in by_text and doc_playbooks.runnable(c):
            out[(c.page, c.cmd)] = "doc_playbooks.py"
    recipe = make_recipe("molecule-default")
    for target in ("lab", "lab-down"):
        if re.search(rf"\$\(MAKE\) {target}\b", recipe):
            for page in ("README.md", "docs/quickstart.md"):
                out[(page, f"make {target}")] = "Makefile molecule-default"
    if re.search(r"^make test\b", (ROOT / ".ci" / "run").read_text(), re.M):
        out[("README.md", "make test")] = ".ci/run"
    return out


def test_the_pages_have_commands():
    cmds = doc_commands.all_commands()
    assert len(cmds) > 60, len(cmds)
    want = {"README.md", "docs/howto.md", "docs/operations.md", "docs/own-hosts.md", "docs/quickstart.md",
            "docs/troubleshooting.md"}
    assert {c.page for c in cmds} >= want


def test_every_documented_command_is_run_or_says_why_not():
    ran = runs()
    missing = [f"{c.page}:{c.line}: {c.cmd}" for c in doc_commands.all_commands()
               if c.reason is None and (c.page, c.cmd) not in ran]
    assert not missing, ("commands no test runs and whose page gives no reason (`# not run by the tests: WHY`):\n"
                         + "\n".join(missing))


def test_a_reason_is_not_also_run():
    """A command with a reason that some runner does run: the page says something false."""
    ran = runs()
    both = [f"{c.page}:{c.line}: {c.cmd} (run by {ran[(c.page, c.cmd)]})" for c in doc_commands.all_commands()
            if c.reason is not None and (c.page, c.cmd) in ran]
    assert not both, both


@pytest.mark.parametrize(("block", "want"), [
    ("ls -l   # list\n", [("ls -l", None)]),
    ("# not run by the tests: it takes an hour\nmake soak\nmake soak2\n",
     [("make soak", "it takes an hour"), ("make soak2", "it takes an hour")]),
    ("make a   # slow; not run by the tests: an hour\nmake b\n", [("make a", "an hour"), ("make b", None)]),
    ("echo 'a # b'  # c\n", [("echo 'a # b'", None)]),
    ("cat > f <<'EOF'\nx: 1\n# y\nEOF\nls \\\n  -l\n", [("cat > f <<'EOF'", None), ("ls -l", None)]),
    ("# nocloudlb status\nnode n1 ...\n# nocloudlb probe 192.0.2.1\n192.0.2.1 is at ...\n",
     [("nocloudlb status", None), ("nocloudlb probe 192.0.2.1", None)]),
])
def test_reading_a_block(tmp_path, block, want):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(f"# x\n\ntext\n\n```console\n{block}```\n")
    got = [(c.cmd, c.reason) for c in doc_commands.commands("README.md", tmp_path)]
    assert got == want
    first = next(i for i, ln in enumerate(block.splitlines()) if not ln.startswith("# not run"))
    assert doc_commands.commands("README.md", tmp_path)[0].line == 6 + first  # the block's first line is line 6
