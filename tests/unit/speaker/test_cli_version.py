"""``nocloudlb --version``: the speaker's version and the collection's, read from the file the
speaker role writes into the virtual environment (sys.prefix)."""

from __future__ import annotations

import sys

import nocloudlb
import pytest
from nocloudlb import cli


def run_version(capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_version_with_the_roles_file(tmp_path, monkeypatch, capsys):
    (tmp_path / cli.COLLECTION_VERSION_FILE).write_text("1.2.3\n")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    out = run_version(capsys)
    assert out.splitlines() == [f"nocloudlb {nocloudlb.__version__}", "collection: nocloud.loadbalancer 1.2.3"]


@pytest.mark.parametrize("content", [None, "", "unknown\n", b"\xff\xfe"])
def test_version_without_a_usable_file(tmp_path, monkeypatch, capsys, content):
    if isinstance(content, bytes):
        (tmp_path / cli.COLLECTION_VERSION_FILE).write_bytes(content)
    elif content is not None:
        (tmp_path / cli.COLLECTION_VERSION_FILE).write_text(content)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    out = run_version(capsys)
    assert out.splitlines() == [f"nocloudlb {nocloudlb.__version__}", "collection: unknown"]


def test_version_needs_no_subcommand_and_a_subcommand_still_does(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    assert "required" in capsys.readouterr().err


def test_version_text_reads_the_given_prefix(tmp_path):
    (tmp_path / cli.COLLECTION_VERSION_FILE).write_text("0.1.0")
    assert cli.version_text(str(tmp_path)).endswith("collection: nocloud.loadbalancer 0.1.0")
    assert cli.version_text(str(tmp_path / "missing")).endswith("collection: unknown")
