# -*- coding: utf-8 -*-
"""Which move the keepalived storm check blames for a slow or failed connection
(molecule/keepalived/files/handover_window.py): only one it could have lost a SYN to."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "handover_window", ROOT / "molecule" / "keepalived" / "files" / "handover_window.py")
assert spec and spec.loader
hw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hw)

V4, V6 = "198.51.100.202", "2001:db8:1::200"
MOVES = [[12.38, V4, "n1"], [12.38, V6, "n1"], [28.364, V4, "n3"], [28.364, V6, "n3"], [40.43, V4, "n1"]]


@pytest.mark.parametrize(("vip", "t", "expected"), [
    (V4, 28.30, [28.364, V4, "n3"]),   # began 64 ms before the move: its SYN may have met the old owner's drop
    (V4, 28.90, [28.364, V4, "n3"]),   # began after it, before the client's ARP could have been stale long
    (V6, 27.621, None),                # 0.74 s before: its SYN was lost to something else (a loaded run)
    (V4, 26.0, None),                  # no move near at all
    (V4, 29.5, None),                  # 1.1 s after: not the move's
    (V6, 40.45, None),                 # the IPv4 VIP moved then, not this one
    (V4, 40.40, [40.43, V4, "n1"]),
])
def test_a_connection_is_blamed_on_a_move_only_in_its_window(vip, t, expected):
    assert hw.nearest(MOVES, vip, t, hw.SYN_BEFORE_MOVE, hw.SYN_AFTER_MOVE) == expected


def test_the_nearest_of_two_moves_in_the_window():
    moves = [[10.0, V4, "n1"], [10.5, V4, "n3"]]
    assert hw.nearest(moves, V4, 10.45, 0.1, 1.0) == [10.5, V4, "n3"]
    assert hw.nearest(moves, V4, 10.2, 0.1, 1.0) == [10.0, V4, "n1"]  # 10.5 is 0.3 s ahead: out of the window
