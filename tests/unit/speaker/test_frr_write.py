"""frr.conf goes through state.atomic_write: 0640, group frr when the process may give it, never half written."""

from __future__ import annotations

import grp
import os
import stat

import pytest
from nocloudlb.bgp.frr import FrrControl
from nocloudlb.state import atomic_write

GROUP = "nogroup"  # present on Debian; stands in for frr here


def test_frr_write_is_0640_with_the_group_and_leaves_no_temp_file(tmp_path):
    conf = tmp_path / "frr.conf"
    conf.write_text("old\n")
    fc = FrrControl(conf=str(conf), group=GROUP)
    assert fc.write("router bgp 64512\n") == str(conf)
    st = os.stat(conf)
    assert conf.read_text() == "router bgp 64512\n"
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == grp.getgrnam(GROUP).gr_gid
    assert sorted(os.listdir(tmp_path)) == ["frr.conf"]


def test_frr_write_without_the_group_still_keeps_others_out(tmp_path):
    conf = tmp_path / "frr.conf"
    FrrControl(conf=str(conf), group="no-such-group-here").write("x\n")
    st = os.stat(conf)
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == os.getegid()


def test_atomic_write_group_falls_back_when_chown_is_refused(tmp_path, monkeypatch):
    def refuse(*_args, **_kw):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chown", refuse)
    target = tmp_path / "f"
    atomic_write(target, b"secret", 0o640, gid=grp.getgrnam(GROUP).gr_gid)
    st = os.stat(target)
    assert target.read_bytes() == b"secret" and stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == os.getegid()


def test_atomic_write_failure_keeps_the_old_file(tmp_path):
    target = tmp_path / "frr.conf"
    atomic_write(target, b"good", 0o640)
    with pytest.raises(TypeError):
        atomic_write(target, "not bytes", 0o640, gid=0)  # type: ignore[arg-type]
    assert target.read_bytes() == b"good" and os.listdir(tmp_path) == ["frr.conf"]
