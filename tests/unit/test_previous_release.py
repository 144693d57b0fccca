"""release/previous.json and tests/netns/previous_release.py (no root): the record names a commit,
the helper refuses with the reason and the remedy when it cannot make the tree, and the tree it makes
imports the previous release's nocloudlb and nocloudlb.core ahead of the editable install."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "netns"))

import previous_release as pr  # noqa: E402


def test_the_record_names_a_commit_and_why():
    rec = pr.previous()
    assert re.fullmatch(r"[0-9a-f]{40}", rec["commit"]), rec
    assert rec["date"] and rec["why"] and rec["paths"] == ["speaker/nocloudlb", "plugins/module_utils"]


def test_a_missing_commit_is_refused_with_the_remedy(tmp_path):
    with pytest.raises(pr.PreviousReleaseError, match="not in this clone|git is not installed|not a git checkout"):
        pr.materialise(tmp_path, "0" * 40)


def test_the_tree_imports_ahead_of_the_editable_install(tmp_path):
    root = pr.materialise(tmp_path)
    assert (root / "nocloudlb" / "core").resolve() == (tmp_path / "plugins" / "module_utils").resolve()
    where = pr.check_tree(root)
    assert Path(where["nocloudlb"]).resolve().is_relative_to(tmp_path.resolve()), where
    assert Path(where["core"]).resolve().is_relative_to(tmp_path.resolve()), where
