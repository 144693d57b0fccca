"""speaker_info and node_drain against real ``nocloudlb speaker`` processes in network namespaces
(the speaker helpers' harness, tests/netns/speaker_harness.py), fast profile. Root only."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from .conftest import ROOT, run_module

sys.path.insert(0, str(ROOT / "tests" / "netns"))

if os.geteuid() != 0:
    pytest.skip("needs root for network namespaces", allow_module_level=True)

from netns import make_segment  # noqa: E402
from nocloudlb.core.election import DRAIN_LABEL, election_order  # noqa: E402
from speaker_harness import SpeakerCluster, pool_docs, service_doc, spread_vips  # noqa: E402

pytestmark = pytest.mark.timeout(120)
NODES = ["n1", "n2", "n3"]
CLI = str(Path(sys.executable).with_name("nocloudlb"))


@pytest.fixture
def cluster(tmp_path):
    made = []

    def build(hosts: int = 3, extra: list[dict] | None = None, vips: dict | None = None) -> SpeakerCluster:
        seg = make_segment(f"ndp{os.getpid() % 1000}", hosts=hosts, client=True)
        made.append(seg)
        names = [f"n{i + 1}" for i in range(hosts)]
        vips = vips or spread_vips(names)
        docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))] + (extra or [])
        c = SpeakerCluster(seg, tmp_path, profile="fast", resources=docs)
        c.start_all()
        c.vips = vips
        return c

    yield build
    for seg in made:
        seg.close()


def drain(c: SpeakerCluster, node: str, **args) -> dict:
    check = args.pop("_check", False)
    args.setdefault("probe_command", CLI)
    return run_module("node_drain", {"socket": c.sock(node), **args}, c.host(node).ns, check_mode=check, diff=True)


def test_speaker_info_reports_the_cluster_and_names_a_missing_socket(cluster, tmp_path):
    c = cluster()
    ip, leader = next(iter(c.vips.items()))
    res = run_module("speaker_info", {"socket": c.sock("n2")})
    assert not res.get("failed"), res
    assert res["changed"] is False and res["node"] == "n2" and res["ready"] is True
    assert {m["name"]: m["state"] for m in res["members"]} == dict.fromkeys(NODES, "alive")
    assert res["leaders"][ip] == leader == election_order(NODES, ip)[0]
    assert res["config"]["state"] == "ok" and res["drained"] is False
    missing = run_module("speaker_info", {"socket": str(tmp_path / "nope.sock")})
    assert missing["failed"] and f"socket: {tmp_path / 'nope.sock'} does not exist" in missing["msg"]


def test_drain_moves_the_vips_on_the_wire_then_undrain_takes_them_back(cluster):
    c = cluster()
    ip = next(ip for ip, leader in c.vips.items() if leader == "n1")
    second = election_order(NODES, ip)[1]
    c.wait(lambda: [a["mac"] for a in c.probe(ip)] == [c.mac("n1")], 5, "n1 answering first")

    check = drain(c, "n1", _check=True)
    assert check["changed"] and check["moved"] == {ip: None}, check
    assert check["diff"]["after"]["labels"][DRAIN_LABEL] == "true"
    assert DRAIN_LABEL not in c.status("n1")["labels"]  # check mode changed nothing

    res = drain(c, "n1", confirm_with_probe=True, grace_period=0.2)
    assert not res.get("failed"), res
    assert res["changed"] and res["drained"] and res["moved"] == {ip: second}
    assert res["probed"][ip] == [c.mac(second)]
    assert DRAIN_LABEL not in res["diff"]["before"]["labels"] and DRAIN_LABEL in res["diff"]["after"]["labels"]
    assert [a["mac"] for a in c.probe(ip)] == [c.mac(second)]  # the client sees the move too
    assert drain(c, "n1")["changed"] is False  # already drained

    back = drain(c, "n1", state="undrained")
    assert not back.get("failed"), back
    assert back["changed"] and not back["drained"] and ip in back["regained"]
    c.wait(lambda: [a["mac"] for a in c.probe(ip)] == [c.mac("n1")], 5, "n1 answering again")
    assert drain(c, "n1", state="undrained")["changed"] is False


def test_drain_refuses_when_no_other_member_is_alive(cluster):
    c = cluster(hosts=1)
    res = drain(c, "n1")
    assert res["failed"] and "cannot drain n1" in res["msg"] and "no other member is alive and undrained" in res["msg"]
    assert DRAIN_LABEL not in c.status("n1")["labels"]


def test_drain_times_out_and_rolls_back_when_no_other_node_is_eligible(cluster):
    # Only n1 matches the advertisement's node selector: the others are alive but not eligible.
    only_n1 = [{"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "only-n1"},
                "spec": {"ipAddressPools": ["default"], "nodeSelectors": [{"matchLabels": {"rack": "n1"}}]}}]
    docs = [d for d in pool_docs() if d["kind"] != "L2Advertisement"]
    c = cluster(extra=[], vips={"198.51.100.210": "n1"})
    for name in NODES:
        c.write_config(name, c.config(name, resources=docs + only_n1 + [service_doc("svc0", ["198.51.100.210"])]))
        c.send_signal(name, 1)  # SIGHUP: reload
    c.wait(lambda: c.announcing("n1", "198.51.100.210") and not c.announcing("n2", "198.51.100.210"), 5, "n1 only")
    t0 = time.monotonic()
    res = drain(c, "n1", timeout=2)
    assert res["failed"] and "timeout after 2s draining n1: no other node took over 198.51.100.210" in res["msg"], res
    assert "the drain label was cleared again" in res["msg"] and time.monotonic() - t0 < 15
    assert DRAIN_LABEL not in c.status("n1")["labels"]
    c.wait(lambda: c.announcing("n1", "198.51.100.210"), 5, "n1 announcing again after the rollback")
