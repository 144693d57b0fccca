"""The previous release's speaker as a source tree a test can run beside the current code.

``release/previous.json`` names the commit of this repository that is the reference for wire
compatibility (the last state that passed the full CI; ``NOCLOUDLB_PREVIOUS=<commit>`` names another).
:func:`materialise` writes that commit's ``speaker/nocloudlb`` and ``plugins/module_utils`` into a
directory with ``git archive`` and links ``speaker/nocloudlb/core`` to the module_utils, which is what
the package's ``package-dir`` mapping does for an installed speaker (``nocloudlb.core`` is
plugins/module_utils). The directory returned is the import root: a speaker started with it first on
``PYTHONPATH`` (``python -m nocloudlb.cli``) imports that tree, not the editable install of the checkout
(whose finder setuptools appends after the path finder, so ``PYTHONPATH`` takes precedence).
:func:`check_tree` proves it in a subprocess.

Run as a script it materialises the tree and prints the import root::

    python tests/netns/previous_release.py DEST
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "release" / "previous.json"


class PreviousReleaseError(RuntimeError):
    """The previous release's tree cannot be made (no git, not a git checkout, the commit is missing)."""


def previous() -> dict:
    """The record of release/previous.json (commit, date, version, why)."""
    return dict(json.loads(RECORD.read_text()))


def previous_commit() -> str:
    """The commit tests take as the previous release: ``NOCLOUDLB_PREVIOUS`` if set (another release to
    test against, e.g. 0.1.0's 8998b708), else the record's."""
    return os.environ.get("NOCLOUDLB_PREVIOUS") or str(previous()["commit"])


def _git(*args: str, data: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False, text=not data,
                          timeout=120)


def materialise(dest: Path, commit: str | None = None) -> Path:
    """``commit``'s (default: the record's) speaker and core under ``dest``; returns the import root
    (``dest/speaker``). PreviousReleaseError with the reason and the remedy when it cannot be done."""
    rec = previous()
    commit = commit or previous_commit()
    if shutil.which("git") is None:
        raise PreviousReleaseError("git is not installed: the previous release's speaker is taken from the "
                                   f"repository's history (commit {commit}, release/previous.json)")
    if _git("rev-parse", "--git-dir").returncode != 0:
        raise PreviousReleaseError(f"{REPO} is not a git checkout: the previous release's speaker (commit "
                                   f"{commit}) is taken from its history; run the test from a clone")
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        hint = "the clone is shallow: `git fetch --unshallow`" if shallow else "fetch main's full history"
        raise PreviousReleaseError(f"commit {commit} (the previous release, release/previous.json) is not in "
                                   f"this clone: {hint}")
    paths = rec.get("paths") or ["speaker/nocloudlb", "plugins/module_utils"]
    archive = _git("archive", "--format=tar", commit, *paths, data=True)
    if archive.returncode != 0:
        raise PreviousReleaseError(f"git archive {commit} failed: {archive.stderr.decode(errors='replace').strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    core = dest / "speaker" / "nocloudlb" / "core"
    if not core.exists():
        core.symlink_to(Path("..") / ".." / "plugins" / "module_utils", target_is_directory=True)
    return dest / "speaker"


def env_for(root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose ``PYTHONPATH`` starts with ``root`` (other entries kept after it)."""
    env = dict(base or {})
    rest = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), rest) if p)
    return env


def check_tree(root: Path) -> dict[str, Any]:
    """Where a Python started with ``root`` on ``PYTHONPATH`` imports ``nocloudlb`` and ``nocloudlb.core``
    from; PreviousReleaseError unless both are under ``root``'s tree (the editable install would win)."""
    code = ("import json, nocloudlb, nocloudlb.core.election as e; "
            "print(json.dumps({'nocloudlb': nocloudlb.__file__, 'core': e.__file__, "
            "'version': nocloudlb.__version__, 'wire': getattr(nocloudlb, 'WIRE_VERSION', None)}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60,
                         env=env_for(root, dict(os.environ)), cwd=str(root))
    if out.returncode != 0:
        raise PreviousReleaseError(f"the tree at {root} does not import: {out.stderr.strip()[-500:]}")
    where = json.loads(out.stdout.strip().splitlines()[-1])
    tree = root.parent.resolve()
    for key in ("nocloudlb", "core"):
        if not Path(where[key]).resolve().is_relative_to(tree):
            raise PreviousReleaseError(f"{key} imports from {where[key]}, not from {tree}")
    return where


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: previous_release.py DEST")
    try:
        print(materialise(Path(sys.argv[1])))
    except PreviousReleaseError as exc:
        sys.exit(f"previous_release: {exc}")
