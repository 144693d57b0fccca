"""The plots scripts/pictures.py draws from benchmark runs show their run's JSON, draw the same bytes
every time (docs-check compares them), and a plot whose data changed is reported as out of date."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytest.importorskip("matplotlib")


def pictures(out: Path | None = None):
    spec = importlib.util.spec_from_file_location("pictures_under_test", ROOT / "scripts" / "pictures.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if out is not None:
        mod.OUT = out
    return mod


def test_bgp_withdrawal_plot_shows_every_figure_of_its_run():
    svg = pictures().bgp_withdrawal()
    times = json.loads((ROOT / "docs" / "images" / "bgp_withdrawal.json").read_text())["withdrawal"]["times"]
    for fault, runs in times.items():
        assert fault.replace("(", "").split()[0] in svg
        for t in runs:
            assert f"{t:.3f} s" in svg, (fault, t)


def test_false_failover_plot_shows_every_count_of_its_run():
    svg = pictures().false_failovers()
    rows = json.loads((ROOT / "docs" / "images" / "false_failovers.json").read_text())["false_failovers"]
    for r in rows:
        assert r["system"] in svg
        assert f">{r['takeovers']}<" in svg, r


def test_plots_are_the_same_bytes_each_time():
    mod = pictures()
    assert mod.bgp_withdrawal() == mod.bgp_withdrawal()
    assert mod.false_failovers() == mod.false_failovers()


def test_a_plot_whose_data_changed_is_out_of_date(tmp_path, monkeypatch, capsys):
    for name in ("bgp_withdrawal", "false_failovers"):
        shutil.copy(ROOT / "docs" / "images" / f"{name}.json", tmp_path)
        shutil.copy(ROOT / "docs" / "images" / f"{name}.svg", tmp_path)
    mod = pictures(tmp_path)
    mod.PICTURES = {}  # the Graphviz diagrams have their own sources, not data
    monkeypatch.setattr("sys.argv", ["pictures.py", "--check"])
    assert mod.main() == 0
    data = json.loads((tmp_path / "false_failovers.json").read_text())
    data["false_failovers"][0]["takeovers"] = 3
    (tmp_path / "false_failovers.json").write_text(json.dumps(data))
    assert mod.main() == 1
    assert "false_failovers.svg" in capsys.readouterr().err
