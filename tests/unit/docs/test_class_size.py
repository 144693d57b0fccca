"""Every class of the daemon (speaker/nocloudlb) has one job and fits on a few screens: at most
``MAX_LINES`` lines from ``class`` to its last line, nested classes counted with their parent."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MAX_LINES = 300


def class_sizes(root: Path) -> dict[str, int]:
    """``module.py:Class`` -> lines, for every top-level class of every module under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                out[f"{path.relative_to(root)}:{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_no_class_in_the_daemon_is_over_the_limit():
    sizes = class_sizes(ROOT / "speaker" / "nocloudlb")
    assert len(sizes) > 50, "the walk found too few classes: is the path right?"
    over = {name: lines for name, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"classes over {MAX_LINES} lines (split them by job): {over}"


def test_the_measure_counts_a_class_from_its_first_to_its_last_line(tmp_path):
    (tmp_path / "m.py").write_text("class A:\n    x = 1\n\n    def f(self):\n        return 2\n\n\n"
                                   "class B:\n    pass\n")
    assert class_sizes(tmp_path) == {"m.py:A": 5, "m.py:B": 2}
