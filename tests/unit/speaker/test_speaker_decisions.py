"""The speaker's decision path, in process: a real Speaker (config, kinship on loopback, health)
whose layer-2 side effects are recorded in order (inproc_speaker.py). Each test is the regression
test of one defect of issue 8 section 1 and fails on the code before its fix."""

from __future__ import annotations

import time

import pytest
from inproc_speaker import decided, mac_field, pool_docs, run_loop, service_doc, vips_led, wait_for
from nocloudlb.core.election import DRAIN_LABEL

pytestmark = pytest.mark.timeout(60)


def two_nodes(harness, n_per_node: int = 2, policy: str = "Cluster", peer_labels: dict | None = None,
              speaker_kw: dict | None = None):
    """Speaker "s" and a bare kinship peer "p" publishing metadata from s's own codec."""
    vips = vips_led(["s", "p"], n_per_node)
    docs = pool_docs() + [service_doc(f"svc{i}", ip, policy) for i, ip in enumerate(sorted(vips))]
    sp = harness.speaker("s", docs, join=["p"], **(speaker_kw or {}))
    healthy = [f"test/svc{i}" for i in range(len(vips))]
    peer = harness.peer("p", sp.codec.encode(peer_labels or {}, healthy), join=["s"])
    decided(sp, {"s", "p"})
    return sp, peer, vips


def mine(vips: dict[str, str], node: str) -> set[str]:
    return {ip for ip, leader in vips.items() if leader == node}


# -- 1: the gossip layer closes --------------------------------------------------------------
def test_gossip_layer_closing_withdraws_everything_and_exits_nonzero(harness):
    sp, _peer, vips = two_nodes(harness)
    assert set(sp.journal.announced()) == mine(vips, "s")
    before = len(sp.journal)
    sp.membership.cluster.close(timeout=1.0)  # kinship stops under the speaker (not a leave() of ours)
    thread, out = run_loop(sp)
    thread.join(timeout=8)
    try:
        assert not thread.is_alive(), "the decision loop kept running with the gossip layer closed"
        assert out.get("code"), out  # non-zero: systemd restarts the speaker
    finally:
        sp.post("stop")
        thread.join(timeout=5)
    after = sp.journal[before:]
    assert sp.journal.announced() == {}, "still announcing with an unknown view"
    assert not any(ip in e[1] for e in after if e[0] == "announce" for ip in mine(vips, "p")), \
        "took the peer's VIPs"


# -- 14: add to lo first, announce after -----------------------------------------------------
def test_vips_are_on_lo_before_they_are_announced_and_not_announced_when_the_add_fails(harness):
    vips = vips_led(["s"], 3)
    docs = pool_docs() + [service_doc(f"svc{i}", ip) for i, ip in enumerate(sorted(vips))]
    sp = harness.speaker("s", docs)
    wait_for(sp.membership.first_join_done.is_set, 10, "start alone")
    sp.delivery.fail = 1
    sp.reconcile()
    assert sp.journal.announced() == {}, "announced a VIP whose address could not be added to lo"
    sp.reconcile()  # the add works now
    assert set(sp.journal.announced()) == set(vips)
    on_lo: set[str] = set()
    for e in sp.journal:
        if e[0] == "lo":
            on_lo = e[1]
        if e[0] == "announce":
            assert set(e[1]) <= on_lo, f"announced {sorted(set(e[1]) - on_lo)} before it was on lo"


# -- 5 (loop side): one exception never stops the loop ---------------------------------------
def test_an_exception_in_one_iteration_withdraws_and_the_loop_goes_on(harness):
    sp, _peer, vips = two_nodes(harness)
    ann = sp.announcer
    ann.fail = 1  # the next set_announced raises
    sp.labels.update({DRAIN_LABEL: ""})  # makes the next reconcile withdraw
    thread, out = run_loop(sp)
    try:
        sp.post()
        time.sleep(0.5)
        assert thread.is_alive(), f"the loop died: {out}"
        sp.labels.update(unset=[DRAIN_LABEL])
        sp.post()
        wait_for(lambda: set(sp.journal.announced()) == mine(vips, "s"), 5, "announcing again after the error")
    finally:
        sp.post("stop")
        thread.join(timeout=5)
    assert out.get("code") == 0, out


# -- 4: decide from the published state ------------------------------------------------------
def test_a_node_decides_from_what_it_published_not_from_newer_local_labels(harness):
    sp, _peer, vips = two_nodes(harness)
    assert set(sp.journal.announced()) == mine(vips, "s")
    # drained locally, but the metadata carrying it cannot be published (too large): the peer
    # still elects this node, so it must keep answering
    sp.membership.set_meta = _raise_too_large
    sp.labels.update({DRAIN_LABEL: ""})
    sp.reconcile()
    assert set(sp.journal.announced()) == mine(vips, "s"), "withdrew on a drain its peers never saw"
    st = sp.status()
    me = next(m for m in st["members"] if m["name"] == "s")
    assert DRAIN_LABEL in me["labels"]
    assert DRAIN_LABEL not in me.get("publishedLabels", {DRAIN_LABEL: ""})


def _raise_too_large(meta):
    import kinship

    raise kinship.MetaTooLarge("encoded metadata is larger than max_meta_bytes")


def test_a_config_whose_worst_case_metadata_cannot_fit_is_refused(tmp_path):
    import yaml
    from nocloudlb.daemon import validate

    keys = [f"example.com/{c * 48}" for c in "ab"]  # two long node-selector label keys, 600 Local services
    docs = pool_docs([{"matchExpressions": [{"key": k, "operator": "Exists"}]} for k in keys]) + [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc{i}", "namespace": "test",
                                                             "annotations": {"metallb.io/allow-shared-ip": "k"}},
         "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                  "ports": [{"port": 1000 + i, "protocol": "TCP"}]},
         "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.200"}]}}} for i in range(600)]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"node": {"name": "s"}, "memberlist": {"bind": "127.0.0.1:7946"},
                                    "resources": docs}))
    ok, errors = validate(str(path))
    assert not ok
    assert any("512" in e and "Local-policy" in e for e in errors), errors


# -- 13: re-announce only what may have moved ------------------------------------------------
def test_heal_reannounces_only_vips_whose_leader_may_have_changed(harness):
    sp, _peer, vips = two_nodes(harness, peer_labels={DRAIN_LABEL: ""})  # p drained: never a candidate

    def leads_all() -> bool:  # under load p's metadata can come after the first reconcile (then s waits)
        sp.reconcile()
        return set(sp.journal.announced()) == set(vips)

    wait_for(leads_all, 10, "s announces every VIP once it has p's metadata")
    led = set(sp.journal.announced())
    for heal in (["heal\tmemberRecovered\tp"], ["heal\tmemberJoined\tp"]):
        n = len(sp.journal)
        sp.reannounce(heal)
        sent = [ip for e in sp.journal[n:] if e[0] == "reannounce" for ip in e[1]]
        assert sent == [], f"{heal}: re-announced {sent} though p could never have taken them"
    n = len(sp.journal)
    sp.reannounce(["heal\trefuted\ts"])  # this node was held dead: every VIP it leads may have moved
    sent = [ip for e in sp.journal[n:] if e[0] == "reannounce" for ip in e[1]]
    assert sorted(sent) == sorted(led)


# -- 9: peers identified by the MACs they publish --------------------------------------------
def test_peers_are_recognised_by_the_vip_interface_macs_they_publish(harness):
    vips = vips_led(["s", "p"], 1)
    docs = pool_docs() + [service_doc(f"svc{i}", ip) for i, ip in enumerate(sorted(vips))]
    sp = harness.speaker("s", docs, join=["p"])
    meta = dict(sp.codec.encode({}, []))
    meta["m"] = mac_field("02:00:00:00:bb:01", "02:00:00:00:bb:02")  # p's VIP-segment MACs
    harness.peer("p", meta, join=["s"])
    wait_for(lambda: {m.name for m in sp.membership.members() if m.state == "alive"} == {"s", "p"}, 10, "join")
    sp.reconcile()
    is_peer = sp.announcer.is_peer_mac
    assert is_peer(bytes.fromhex("02000000bb02")), "a MAC the peer published is taken for a foreign owner"
    assert not is_peer(bytes.fromhex("02000000cc01"))


# -- 7: "next restart" fields are frozen in the running config -------------------------------
def test_restart_only_fields_keep_their_running_values_on_reload(harness, tmp_path):
    sp, _peer, _vips = two_nodes(harness)
    doc = harness.config("s", pool_docs(), join=["p"])
    doc["node"]["name"] = "renamed"
    doc["stateDir"] = str(tmp_path / "elsewhere")
    harness.write("s", doc)
    res = sp.reload()
    assert res["ok"]
    assert sp.cfg.node_name == "s" and sp.cfg.state_dir == str(tmp_path / "s" / "state")
    pending = res.get("restartPending") or res["config"].get("restartPending")
    assert {"node_name", "state_dir"} <= set(pending), res
    assert sp.status()["node"] == "s"


# -- 6: a rollout that adds a Local service keeps peers' health readable ----------------------
def test_adding_a_local_service_on_one_node_keeps_every_vip_with_one_owner(harness):
    vips = vips_led(["s1", "s2"], 2)
    docs = pool_docs() + [service_doc(f"svc{i}", ip, "Local") for i, ip in enumerate(sorted(vips))]
    s1 = harness.speaker("s1", docs, join=["s2"])
    s2 = harness.speaker("s2", docs, join=["s1"])
    both = {"s1", "s2"}
    for sp in (s1, s2):
        wait_for(lambda sp=sp: {m.name for m in sp.membership.members() if m.state == "alive"} == both, 10, "join")

    def settle() -> None:
        for _dummy in range(3):
            for sp in (s1, s2):
                sp.reconcile()
            time.sleep(0.3)

    settle()
    assert set(s1.journal.announced()) == mine(vips, "s1")
    assert set(s2.journal.announced()) == mine(vips, "s2")
    # s2 gets the next config first: one more Local service (on an address nobody else uses)
    new = service_doc("added", "198.51.100.239", "Local")
    doc = harness.config("s2", docs + [new], join=["s1"])
    harness.write("s2", doc)
    assert s2.reload()["ok"]
    settle()
    one = set(s1.journal.announced())
    two = set(s2.journal.announced())
    assert not one & two, f"both nodes announce {sorted(one & two)} during the rollout"
    assert one | two >= set(vips), f"nobody announces {sorted(set(vips) - one - two)}"
    assert one == mine(vips, "s1") and two - {"198.51.100.239"} == mine(vips, "s2")


# -- 15: graceful stop: withdraw, then leave -------------------------------------------------
def test_graceful_stop_withdraws_before_it_leaves_the_cluster(harness):
    sp, _peer, vips = two_nodes(harness)
    assert set(sp.journal.announced()) == mine(vips, "s")
    real_leave = sp.membership.leave
    at_leave: dict = {}

    def leave(timeout: float = 2.0) -> None:
        # the moment peers learn we left, the successor announces: nothing may be answered here then
        at_leave["announced"] = sp.journal.announced()
        real_leave(timeout=timeout)

    sp.membership.leave = leave
    sp._shutdown()
    assert "announced" in at_leave, "never left the cluster"
    assert at_leave["announced"] == {}, f"still answering for {sorted(at_leave['announced'])} when it left"


def test_reload_through_the_control_socket_says_which_settings_wait_for_a_restart(harness, tmp_path):
    from nocloudlb.core.control_client import request

    sp, _peer, _vips = two_nodes(harness)
    thread, _out = run_loop(sp)
    try:
        doc = harness.config("s", pool_docs(), join=["p"])
        doc["node"]["name"] = "renamed"
        harness.write("s", doc)
        res = request(sp.cfg.socket, {"cmd": "reload"}, 15.0)
        assert res["ok"] and "node_name" in res.get("restartPending", []), res
        assert request(sp.cfg.socket, {"cmd": "status"}, 5.0)["node"] == "s"
    finally:
        sp.post("stop")
        thread.join(timeout=5)


# -- a VIP its leader never answered is checked when taken ------------------------------------
def test_a_vip_its_leader_did_not_answer_is_checked_when_taken_from_it(harness):
    """p leads two VIPs and publishes (metadata ``x``) that it does not answer one of them (its RFC 5227 check
    found another MAC). When p leaves, s takes both: the one p answered without the check (failover speed),
    the other with it (skipping it would fight the host that answers it). netns: test_speaker_conflict.py."""
    vips = vips_led(["s", "p"], 2)
    docs = pool_docs() + [service_doc(f"svc{i}", ip) for i, ip in enumerate(sorted(vips))]
    sp = harness.speaker("s", docs, join=["p"])
    off, answered = sorted(mine(vips, "p"))
    peer = harness.peer("p", sp.codec.encode({}, [], off_wire=[off]), join=["s"])
    decided(sp, {"s", "p"})
    sp.reconcile()
    assert set(sp.journal.announced()) == mine(vips, "s")
    peer.leave(timeout=2.0)

    def took_both() -> bool:
        sp.reconcile()
        return set(sp.journal.announced()) == set(vips)

    wait_for(took_both, 10, "s takes p's VIPs once p left")
    gained = next(e for e in reversed(sp.journal) if e[0] == "announce" and off in e[1])
    assert answered in gained[2], "a VIP p answered is checked: failover slowed for nothing"
    assert off not in gained[2], "a VIP p never answered is taken without the check"
