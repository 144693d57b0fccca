"""statusview: the watcher's change log, and --cluster's verdicts computed from metrics text
produced by the speaker's real collector."""

from __future__ import annotations

import io

from nocloudlb import statusview as sv
from nocloudlb.metrics import SpeakerCollector
from prometheus_client import CollectorRegistry, generate_latest


def status(leader: str | None, node: str = "n2") -> dict:
    return {"node": node, "time": "t", "config": {"state": "ok"}, "conflicts": [],
            "members": [{"name": n, "addr": f"198.51.100.1{n[1]}:7946", "state": "alive", "labels": {},
                         "configDigest": "c1"} for n in ("n1", "n2", "n3")],
            "vips": [{"ip": "198.51.100.200", "service": "prod/web", "pool": "web4", "leader": leader,
                      "announcing": leader == node, "reason": "" if leader == node else "notOwner"}]}


def test_watch_logs_unreachable_back_and_owner_change_in_order():
    seq = [status("n1"), status("n1"), OSError("connection refused"), status("n2")]

    def fetch() -> dict:
        item = seq.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    out = io.StringIO()
    assert sv.watch(fetch, out, sv.Paint(False), interval=0.0, count=4, redraw=False) == 0
    changes = out.getvalue().split("\nCHANGES\n", 1)[1].splitlines()
    assert [c.split("  ", 1)[1] for c in changes] == [
        "speaker unreachable: connection refused", "speaker reachable again",
        "198.51.100.200 (prod/web): owner n1 -> n2"]


def metrics(node: str, announced: list[str], config_ok: bool = True) -> str:
    reg = CollectorRegistry()
    snap = {"announced": [{"ip": ip, "node": node, "service": "prod/web"} for ip in announced],
            "config_ok": config_ok, "config_stale": False, "members": {"alive": 3}, "kinship": {}, "conflicts": 0}
    reg.register(SpeakerCollector(lambda: snap))
    return generate_latest(reg).decode()


def test_cluster_verdicts_from_each_members_metrics():
    ip = "198.51.100.200"

    def view(answers: dict[str, list[str]], leader: str | None = "n1") -> dict:
        st = status(leader)
        st["vips"][0]["announcing"] = ip in answers.get("n2", [])
        return sv.cluster_view(st, 7472, get=lambda host, port: metrics("n" + host[-1], answers["n" + host[-1]]))

    ok = view({"n1": [ip], "n2": [], "n3": []})
    assert ok["vips"][0] | {"services": None} == {"ip": ip, "services": None, "pool": "web4", "elected": "n1",
                                                  "announcedBy": ["n1"], "verdict": "ok", "protocol": "layer2"}
    assert [m["reachable"] for m in ok["members"]] == [True, True, True]
    assert view({"n1": [ip], "n2": [ip], "n3": []})["vips"][0]["verdict"] == "TWO OWNERS"
    assert view({"n1": [], "n2": [], "n3": []})["vips"][0]["verdict"] == "NO OWNER"
    assert view({"n1": [], "n2": [], "n3": [ip]})["vips"][0]["verdict"] == "moving"
    assert list(sv.problems(view({"n1": [ip], "n2": [ip], "n3": []}))) == [f"{ip}: TWO OWNERS"]


def test_a_member_that_cannot_be_asked_makes_an_unanswered_vip_unknown():
    st = status("n1")

    def get(host: str, port: int) -> str:
        raise OSError("timed out")

    v = sv.cluster_view(st, 7472, get=get)
    assert v["vips"][0]["verdict"] == "unknown"
    assert [(m["name"], m["reachable"]) for m in v["members"]] == [("n1", False), ("n2", True), ("n3", False)]
    assert "no: timed out" in sv.render_cluster(v, sv.Paint(False))


def test_header_names_every_tool_that_backs_off():
    from nocloudlb.statusview import backoff_lines

    modes = {"bgp": {"frr": {"healthy": False, "error": "bgpd: no answer within 0.35 s"},
                     "config": {"reload": {"state": "backoff", "failures": 3, "failuresTotal": 3,
                                           "error": "frr-reload --test refused", "nextTrySeconds": 4.2},
                                "withdraw": {"state": "ok", "failures": 0, "failuresTotal": 0}}},
             "dataplane": {"backoff": {"state": "backoff", "failures": 2, "failuresTotal": 5, "error": "nft: exit 1",
                                       "nextTrySeconds": 0.3}},
             "health": {"prod/web": {"backoff": {"state": "ok"}}}}
    assert backoff_lines(modes) == [
        "bgp: bgpd does not answer (bgpd: no answer within 0.35 s): this node's BFD is blocked",
        "bgp: config.reload failing (3 in a row), next try in 4.2 s: frr-reload --test refused",
        "dataplane: backoff failing (2 in a row), next try in 0.3 s: nft: exit 1",
    ]
    assert backoff_lines({"bgp": {"frr": {"healthy": True}}, "l2": None}) == []
