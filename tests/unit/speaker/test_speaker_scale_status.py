"""Issue 10 (scale): the status of 10,000 VIPs stays usable: a summary by default past STATUS_ROWS rows,
every row on request, filters; the CLI asks for what its flags say and shows the summary."""

from __future__ import annotations

import json

import pytest
from nocloudlb import cli
from nocloudlb.statusview import STATUS_ROWS, Paint, render, select_vips, vip_summary


def rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        leader = ("n1", "n2", "n3")[i % 3]
        out.append({"ip": f"2001:db8:100::{i + 1:x}", "service": f"bench/svc{i}", "pool": "default",
                    "leader": leader, "announcing": leader == "n1", "reason": "" if leader == "n1" else "notOwner",
                    "interfaces": [], "onLo": True, "l2State": "", "conflict": None})
    return out


def test_past_the_threshold_a_plain_request_gets_the_summary_only():
    vips = rows(STATUS_ROWS + 500)
    shown, info = select_vips(vips, {"cmd": "status"})
    assert shown == [] and info == {"total": 1500, "matched": 1500, "shown": 0, "omitted": 1500}
    assert len(json.dumps(vip_summary(vips))) < 400
    assert vip_summary(vips)["leaders"] == {"n1": 500, "n2": 500, "n3": 500}
    assert select_vips(vips, {"vips": "all"})[0] == vips
    small = rows(10)
    assert select_vips(small, {})[0] == small  # small clusters see every row, as before


@pytest.mark.parametrize("req, count", [
    ({"ips": ["2001:db8:100::1", "2001:db8:100::5"]}, 2), ({"service": "bench/svc1*"}, 611),
    ({"announcing": True}, 500), ({"reason": "notOwner"}, 1000), ({"leader": "n2", "limit": 7}, 7),
    ({"leader": "n2", "announcing": True}, 0), ({"vips": "none", "leader": "n2"}, 0),
])
def test_filters_give_rows_at_size(req, count):
    shown, info = select_vips(rows(1500), req)
    assert len(shown) == count and info["shown"] == count


@pytest.mark.parametrize("req", [{"vips": "some"}, {"ips": "2001:db8::1"}, {"announcing": "yes"},
                                 {"limit": -1}, {"service": 3}])
def test_bad_selection_is_refused_naming_the_field(req):
    with pytest.raises(ValueError) as info:
        select_vips(rows(3), req)
    assert next(iter(k for k in req)) in str(info.value)


def test_table_shows_the_summary_and_how_to_ask_for_rows():
    vips = rows(1500)
    shown, info = select_vips(vips, {})
    st = {"node": "n1", "vips": shown, "vipsShown": info, "vipSummary": vip_summary(vips), "members": []}
    text = render(st, Paint(False))
    assert "1500 VIPs, 500 announced here" in text and "1500 rows not shown" in text and "--all" in text


def test_cli_flags_become_the_request(monkeypatch, capsys):
    asked: list[dict] = []

    def fake(_sock, req):
        asked.append(req)
        return {"node": "n1", "vips": [], "vipsShown": {"omitted": 0}, "vipSummary": vip_summary([]), "members": []}

    monkeypatch.setattr(cli, "_request", fake)
    assert cli.main(["status", "--socket", "/nonexistent", "--service", "prod/*", "--announcing",
                     "--limit", "5", "--ip", "198.51.100.200"]) == 0
    assert asked[-1] == {"cmd": "status", "service": "prod/*", "announcing": True, "limit": 5,
                         "ips": ["198.51.100.200"]}
    cli.main(["status", "--socket", "/nonexistent", "--all", "-o", "json"])
    assert asked[-1] == {"cmd": "status", "vips": "all"}
