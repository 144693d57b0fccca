"""Fixtures of the speaker unit tests: ``harness`` builds in-process speakers (inproc_speaker.py)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from inproc_speaker import Harness  # noqa: E402


@pytest.fixture
def harness(tmp_path, monkeypatch):
    import nocloudlb.metrics

    # one process holds several speakers: none registers its collector in the global registry
    monkeypatch.setattr(nocloudlb.metrics, "serve", lambda bind, snapshot, registry=None: None)
    h = Harness(tmp_path)
    yield h
    h.close()
