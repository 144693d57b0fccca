"""Status on a BGP cluster (issue 20): a VIP only BGP serves is a BGP row (announced by every eligible
node, no "NO OWNER"), ``--cluster`` judges it by the nodes that should announce it, the metrics say
which protocol announces, and the site playbook's summary names BGP's announcers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from nocloudlb import statusview as sv
from nocloudlb.core.election import DRAIN_LABEL, NodeView
from nocloudlb.core.schema import parse_resources
from nocloudlb.metrics import SpeakerCollector
from nocloudlb.status import StatusReport
from prometheus_client import CollectorRegistry, generate_latest

IP = "203.0.113.10"
L2IP = "198.51.100.200"
NODES = ("n1", "n2", "n3")


def l2_row(ip: str = IP, leader: str | None = None, reason: str = "noMatchingAdvertisement",
           service: str = "prod/web") -> dict:
    return {"ip": ip, "service": service, "pool": "bgp" if ip == IP else "web4", "leader": leader,
            "announcing": False, "reason": reason, "interfaces": [], "onLo": True, "l2State": "", "conflict": None}


def bgp_status(announcing: bool = True, reason: str = "", up: int = 1, peers: int = 1, withdrawn: bool = False,
               ips: tuple[str, ...] = (IP,)) -> dict:
    return {"peers": [{"name": f"r{i}", "state": "Established" if i < up else "Active"} for i in range(peers)],
            "bgpVips": {ip: {"announcing": announcing, "reason": reason, "services": ["prod/web"]} for ip in ips},
            "withdrawn": withdrawn}


# -- merge_bgp: the rows -------------------------------------------------------------------------
def test_a_vip_only_bgp_serves_is_a_bgp_row_announced_here():
    [row] = sv.merge_bgp([l2_row()], bgp_status(), announcers={IP: ["n2", "n1"]})
    assert row["protocol"] == "bgp" and row["announcing"] and row["reason"] == "" and row["leader"] is None
    assert row["bgp"] == {"announcing": True, "reason": "", "sessionsUp": 1, "sessions": 1, "announcers": ["n1", "n2"]}
    assert sv.role_of(row) == "announcing"
    assert sv.owner_text(row) == "bgp: n1,n2"


@pytest.mark.parametrize(("bgp", "reason", "role"), [
    (bgp_status(announcing=False, reason="drained"), "drained", "drained"),
    (bgp_status(announcing=False, reason="noPeer"), "noPeer", "ineligible"),
    (bgp_status(withdrawn=True), "withdrawn", "withdrawn"),
    (bgp_status(up=0), "noSessionUp", "announcing"),
])
def test_a_bgp_row_says_why_this_node_does_not_announce(bgp, reason, role):
    [row] = sv.merge_bgp([l2_row()], bgp)
    assert (row["reason"], sv.role_of(row)) == (reason, role)
    assert row["announcing"] == (reason == "noSessionUp")


def test_a_vip_both_modes_serve_keeps_its_layer2_row_with_the_bgp_part():
    rows = sv.merge_bgp([l2_row(leader="n2", reason="notOwner"), l2_row(L2IP, leader="n1", reason="notOwner")],
                        bgp_status())
    assert [(r["ip"], r["protocol"], r["leader"]) for r in rows] == [(IP, "layer2", "n2"), (L2IP, "layer2", "n1")]
    assert rows[0]["bgp"]["announcing"] and "bgp" not in rows[1]
    # a layer-2 advertisement that selects other nodes only: they lead, this row stays layer 2
    [row] = sv.merge_bgp([l2_row(leader="n3")], bgp_status())
    assert row["protocol"] == "layer2"


def test_rows_without_bgp_get_their_protocol_and_bgp_vips_without_a_layer2_row_get_one():
    assert [r["protocol"] for r in sv.merge_bgp([l2_row(L2IP, leader="n1")], None)] == ["layer2"]
    rows = sv.merge_bgp([], bgp_status(), pool_of=lambda ip: "bgp")
    assert [(r["ip"], r["service"], r["pool"], r["protocol"], r["announcing"]) for r in rows] == \
        [(IP, "prod/web", "bgp", "bgp", True)]


def test_the_table_and_summary_show_bgp_not_no_owner():
    st = {"node": "n1", "config": {"state": "ok"}, "members": [], "conflicts": [],
          "modes": {"bgp": bgp_status()},
          "vips": sv.merge_bgp([l2_row(), l2_row(L2IP, leader="n1", reason="")], bgp_status(ips=(IP,)))}
    st["vips"][1]["announcing"] = True
    st["vipSummary"] = sv.vip_summary(st["vips"])
    text = sv.render(st, sv.Paint(False))
    line = next(ln for ln in text.splitlines() if ln.startswith(IP))
    assert "none" not in line and "bgp (every eligible node)" in line and "announcing" in line
    assert "sessions 1/1 up" in line
    assert "bgp sessions 1/1 established: r0 Established" in text
    assert st["vipSummary"]["leaders"] == {"bgp": 1, "n1": 1}
    assert st["vipSummary"]["byRole"] == {"announcing": 1, "owner": 1}


# -- --cluster --------------------------------------------------------------------------------
def metrics(node: str, bgp: list[str], sessions: list[int] | None = None, l2: list[str] = ()) -> str:
    reg = CollectorRegistry()
    snap = {"announced": [{"ip": ip, "node": node, "service": "prod/web", "protocol": "bgp"} for ip in bgp]
            + [{"ip": ip, "node": node, "service": "prod/web"} for ip in l2],
            "config_ok": True, "config_stale": False, "members": {"alive": 3}, "kinship": {}, "conflicts": 0}
    reg.register(SpeakerCollector(lambda: snap))
    text = generate_latest(reg).decode()
    for i, up in enumerate(sessions if sessions is not None else [1]):
        text += f'nocloudlb_bgp_session_up{{peer="r{i}"}} {float(up)}\n'
    return text


def cluster(answers: dict[str, list[str]], announcers: list[str] | None, sessions: dict | None = None,
            down: tuple[str, ...] = ()) -> dict:
    """The cluster view from n1 (which announces IP when answers['n1'] has it)."""
    sessions = sessions or {}
    bgp = bgp_status(announcing=IP in answers["n1"], up=sessions.get("n1", [1])[0] if sessions.get("n1") else 1)
    st = {"node": "n1", "time": "t", "config": {"state": "ok"}, "conflicts": [], "modes": {"bgp": bgp},
          "members": [{"name": n, "addr": f"198.51.100.1{n[1]}:7946", "state": "alive", "labels": {},
                       "configDigest": "c"} for n in NODES],
          "vips": sv.merge_bgp([l2_row()], bgp, announcers=None if announcers is None else {IP: announcers})}

    def get(host: str, port: int) -> str:
        node = "n" + host[-1]
        if node in down:
            raise OSError("timed out")
        return metrics(node, answers[node], sessions.get(node))

    return sv.cluster_view(st, 7472, get=get)


def test_cluster_a_healthy_bgp_vip_is_ok_and_exits_0():
    view = cluster({"n1": [IP], "n2": [IP], "n3": [IP]}, ["n1", "n2", "n3"])
    [v] = view["vips"]
    assert (v["protocol"], v["elected"], v["announcedBy"], v["verdict"]) == \
        ("bgp", ["n1", "n2", "n3"], ["n1", "n2", "n3"], "ok")
    assert list(sv.problems(view)) == []
    assert [m["bgpSessions"] for m in view["members"]] == [[1, 1], [1, 1], [1, 1]]
    text = sv.render_cluster(view, sv.Paint(False))
    assert "bgp: n1,n2,n3" in text and "BGP SESSIONS UP" in text


def test_cluster_a_drained_node_is_not_expected():
    view = cluster({"n1": [IP], "n2": [IP], "n3": []}, ["n1", "n2"])
    assert view["vips"][0]["verdict"] == "ok" and not list(sv.problems(view))


def test_cluster_a_node_that_should_announce_and_does_not_is_missing():
    view = cluster({"n1": [IP], "n2": [], "n3": [IP]}, ["n1", "n2", "n3"])
    assert view["vips"][0]["verdict"] == "MISSING n2"
    assert list(sv.problems(view)) == [f"{IP}: MISSING n2"]


def test_cluster_an_announcer_without_an_established_session_is_missing():
    view = cluster({"n1": [IP], "n2": [IP], "n3": [IP]}, ["n1", "n2", "n3"], sessions={"n3": [0, 0]})
    assert view["vips"][0]["verdict"] == "MISSING n3"


def test_cluster_nobody_eligible_is_no_announcer_and_an_extra_one_is_no_failure():
    assert cluster({"n1": [], "n2": [], "n3": []}, [])["vips"][0]["verdict"] == "NO ANNOUNCER"
    view = cluster({"n1": [IP], "n2": [IP], "n3": [IP]}, ["n1", "n2"])
    assert view["vips"][0]["verdict"] == "extra n3" and not list(sv.problems(view))


def test_cluster_an_unreachable_member_makes_its_part_unknown():
    view = cluster({"n1": [IP], "n2": [IP], "n3": []}, ["n1", "n2", "n3"], down=("n3",))
    assert view["vips"][0]["verdict"] == "unknown" and not list(sv.problems(view))


def test_cluster_without_announcers_any_working_announcer_will_do():
    assert cluster({"n1": [], "n2": [IP], "n3": []}, None)["vips"][0]["verdict"] == "ok"
    assert cluster({"n1": [], "n2": [], "n3": []}, None)["vips"][0]["verdict"] == "NO ANNOUNCER"


def test_cluster_layer2_vips_ignore_bgp_announcements():
    st = {"node": "n1", "time": "t", "config": {"state": "ok"}, "conflicts": [], "modes": {},
          "members": [{"name": n, "addr": f"198.51.100.1{n[1]}:7946", "state": "alive", "labels": {},
                       "configDigest": "c"} for n in NODES],
          "vips": sv.merge_bgp([l2_row(L2IP, leader="n2", reason="notOwner")], None)}
    view = sv.cluster_view(st, 7472, get=lambda host, port: metrics("n" + host[-1], [L2IP],
                                                                    l2=[L2IP] if host.endswith("2") else []))
    assert view["vips"][0]["verdict"] == "ok" and view["vips"][0]["announcedBy"] == ["n2"]


# -- the speaker's side: announcers from the published view, metrics per protocol ------------------
def report(modes: dict, nodes: list[NodeView] | None = None, docs: list | None = None) -> StatusReport:
    parsed = parse_resources(docs) if docs is not None else None
    runners = [SimpleNamespace(name=name, status=lambda st=st: dict(st)) for name, st in modes.items()]
    rt = SimpleNamespace(modes=runners, membership=object())
    config = SimpleNamespace(cfg=SimpleNamespace(node_name="n1", parsed=parsed), codec=object())
    views = SimpleNamespace(node_views=lambda: nodes or [])
    return StatusReport(rt, config, views, fail=None)  # type: ignore[arg-type]


def test_announcers_are_the_live_undrained_members_bgp_selects():
    docs = [{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "bgp"},
             "spec": {"addresses": ["203.0.113.0/26"]}},
            {"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer", "metadata": {"name": "r1"},
             "spec": {"myASN": 64512, "peerASN": 64500, "peerAddress": "198.51.100.1"}},
            {"apiVersion": "metallb.io/v1beta1", "kind": "BGPAdvertisement", "metadata": {"name": "a"}, "spec": {}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "prod"},
             "spec": {"type": "LoadBalancer", "ports": [{"port": 443, "protocol": "TCP"}]},
             "status": {"loadBalancer": {"ingress": [{"ip": IP}]}}}]
    nodes = [NodeView("n1"), NodeView("n2", {DRAIN_LABEL: ""}), NodeView("n3"), NodeView("n4", state="dead")]
    rep = report({"bgp": bgp_status()}, nodes, docs)
    assert rep.bgp_announcers() == {IP: ["n1", "n3"]}
    rows = rep._vip_rows({"bgp": bgp_status()}, announcers=True)
    assert [(r["ip"], r["pool"], r["protocol"], r["bgp"]["announcers"]) for r in rows] == \
        [(IP, "bgp", "bgp", ["n1", "n3"])]


def test_the_metrics_name_the_protocol_that_announces():
    owner = dict(l2_row(L2IP, leader="n1", reason=""), announcing=True)
    modes = {"l2": {"vips": [l2_row(), owner]}, "bgp": bgp_status()}
    rep = report(modes)
    announced = rep._announced({name: dict(st) for name, st in modes.items()})
    assert sorted((a["ip"], a["protocol"]) for a in announced) == [(L2IP, "layer2"), (IP, "bgp")]
    text = metrics("n1", [IP], l2=[L2IP])
    assert f'nocloudlb_speaker_announced{{ip="{IP}",node="n1",protocol="bgp",service="prod/web"}} 1.0' in text
    assert f'nocloudlb_speaker_announced{{ip="{L2IP}",node="n1",protocol="layer2",service="prod/web"}} 1.0' in text
