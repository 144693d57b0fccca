"""Shared by every unit test. Being here also puts tests/unit on sys.path (pytest's prepend import
mode), so tests in any folder below can import ``collection_link``."""

from __future__ import annotations

from pathlib import Path

import pytest
from collection_link import collections_dir


@pytest.fixture(scope="session")
def collections_path() -> Path:
    """A directory for ANSIBLE_COLLECTIONS_PATH holding this collection (collection_link.py)."""
    return collections_dir()
