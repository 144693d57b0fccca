"""Fixtures for tests that send real packets between network namespaces (root only).

- ``netns_prefix``: namespace name prefix; ``nl2`` here. Override it in a test module
  (``@pytest.fixture def netns_prefix(): return "nsp"``) to use another prefix.
- ``make_segment(hosts=3, client=True, prefix=None)``: builds a segment (see netns.py),
  torn down after the test even when it fails.
- ``segment``: a ready segment with 3 hosts and a client.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from netns import Segment  # noqa: E402
from netns import make_segment as _make_segment


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    reason = None
    if os.geteuid() != 0:
        reason = "network namespace tests need root"
    elif shutil.which("ip") is None:
        reason = "iproute2 (ip) is not installed"
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture
def netns_prefix() -> str:
    return "nl2"


@pytest.fixture
def make_segment(netns_prefix: str) -> Iterator[Callable[..., Segment]]:
    made: list[Segment] = []

    def factory(hosts: int = 3, client: bool = True, prefix: str | None = None) -> Segment:
        seg = _make_segment(prefix or netns_prefix, hosts=hosts, client=client)
        made.append(seg)
        return seg

    yield factory
    for seg in made:
        seg.close()


@pytest.fixture
def segment(make_segment: Callable[..., Segment]) -> Segment:
    return make_segment()
