"""The collection as Ansible finds it, for every unit test that runs a module, a filter or a play.

``collections_dir()`` is a directory holding ``ansible_collections/nocloud/loadbalancer``, a link to
this tree: put it on ``ANSIBLE_COLLECTIONS_PATH`` (plays), ``PYTHONPATH`` (a module run as a script)
or ``sys.path`` (a filter imported by its collection path). One per test process, made on first use
(also at import time, for the tests that need it then) and removed at exit: the link, not the tree.
``tests/unit/conftest.py`` hands it to fixtures as ``collections_path``.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_DIRS: list[Path] = []


def collections_dir() -> Path:
    if not _DIRS:
        top = Path(tempfile.mkdtemp(prefix="nocloudlb-collections-"))
        namespace = top / "ansible_collections" / "nocloud"
        namespace.mkdir(parents=True)
        (namespace / "loadbalancer").symlink_to(ROOT, target_is_directory=True)
        _DIRS.append(top)
        atexit.register(shutil.rmtree, top, ignore_errors=True)  # rmtree removes the link, not the tree
    return _DIRS[0]
