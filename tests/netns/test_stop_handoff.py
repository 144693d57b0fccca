"""A stop of the speaker hands its VIPs over first (speaker/nocloudlb/stophandoff.py, the unit's ExecStop).

Three real speakers (``lan`` profile), a VIP led by each, slow HTTP servers behind them and a client that
GETs every VIP back to back (a request nearly always in flight). Each node in turn is restarted as
systemd does it with the unit's ExecStop: ``nocloudlb stop-handoff`` (drain, wait for the takers), SIGTERM,
start again. The takers forward the connections in flight back to it (a planned move), so no GET fails;
the restarted speaker removes the drain the stop set and takes its VIP back. Without the hand-off a
SIGTERM is a leave: the taker takes the VIP without forwarding, and a request in flight when clients
switch MACs is reset (own-hosts-test: one in about 1,500, in about one upgrade of eight).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from nocloudlb.core.election import DRAIN_LABEL
from previous_release import check_tree, materialise
from speaker_harness import SpeakerCluster, VipWatch, pool_docs, service_doc, spread_vips

pytestmark = pytest.mark.timeout(300)
NODES = ["n1", "n2", "n3"]


@pytest.fixture
def netns_prefix() -> str:
    return "nsh"


def stop_handoff(c: SpeakerCluster, name: str) -> str:
    out = c.seg.run(c.host(name).ns, [sys.executable, "-m", "nocloudlb.cli", "stop-handoff", "--socket", c.sock(name),
                                      "--state-dir", str(c.dir / name / "state")], check=False, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(scope="module")
def previous_root(tmp_path_factory) -> Path:
    """The previous release's speaker tree (release/previous.json), checked to import from its own root."""
    root = materialise(tmp_path_factory.mktemp("previous"))
    check_tree(root)
    return root


@pytest.mark.parametrize("upgrade", [False, True], ids=["restart", "upgrade-from-previous"])
def test_a_restart_through_stop_handoff_loses_no_request(make_segment, tmp_path, request, upgrade):
    """Each node restarted through stop-handoff, as the unit does. ``upgrade``: every node runs the previous
    release first and starts this code after its stop, as site.yml's upgrade does (this code's command
    drains the old speaker; the old takers forward; the new speaker removes the drain)."""
    vips = spread_vips(NODES)
    docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
    c = SpeakerCluster(make_segment(hosts=3), tmp_path / "cluster", profile="lan", resources=docs)
    if upgrade:
        for n in NODES:
            c.source[n] = request.getfixturevalue("previous_root")
    c.start_all(timeout=40)
    c.wait(c.settled, 30, "every VIP past its checks")
    for ip, leader in vips.items():
        c.wait(lambda ip=ip, leader=leader: c.answered_by(ip, leader), 20, f"{ip} answered by {leader} alone")
    watch = VipWatch(c, vips, tmp_path / "samples.jsonl", 0.05, 0.04, 300)
    t0 = time.time()
    said = {}
    for ip, leader in vips.items():
        said[leader] = stop_handoff(c, leader)
        assert (c.dir / leader / "state" / "stop-drained").exists()
        assert c.status(leader)["labels"].get(DRAIN_LABEL) == "true"
        assert not c.announcing(leader, ip), f"{leader} still announces {ip} after stop-handoff"
        c.stop(leader, signal.SIGTERM)
        time.sleep(0.5)  # the node is away a moment, as in a restart
        c.source.pop(leader, None)  # an upgrade starts this code
        c.start(leader)
        c.wait(lambda ip=ip, leader=leader: c.answered_by(ip, leader), 30, f"{leader} answers {ip} again")
        assert c.events(leader, "stopDrainCleared"), "taken back before the drain of the stop was removed"
        assert DRAIN_LABEL not in c.status(leader)["labels"], "the drain the stop set outlived the restart"
        assert not (c.dir / leader / "state" / "stop-drained").exists()
        time.sleep(0.5)
    _samples, failed = watch.stop(t0, time.time())
    gets = {ip: len(p.samples) for ip, p in watch.polls.items()}
    print(f"stop-handoff said: {said}; GETs {gets}, failed {failed}")
    assert all(line.startswith("nocloudlb stop-handoff: handed over 1 VIPs") for line in said.values()), said
    assert not any(failed.values()), failed
    if upgrade:
        return
    # an operator's drain is left alone: nothing handed over, no marker, drained after the restart too
    node = NODES[0]
    c.label(node, "set", f"{DRAIN_LABEL}=true")
    assert "drained already" in stop_handoff(c, node)
    assert not (c.dir / node / "state" / "stop-drained").exists()
    c.stop(node, signal.SIGTERM)
    c.start(node)
    c.wait(lambda: c.try_status(node) and c.status(node).get("ready"), 30, f"{node} ready")
    assert c.status(node)["labels"].get(DRAIN_LABEL) == "true"


def test_the_control_a_plain_sigterm_resets_a_request_in_flight(make_segment, tmp_path):
    """Why the hand-off: the same restarts with SIGTERM alone (a leave) lose GETs: the taker takes the VIP from
    a member that left, without forwarding, and resets the request in flight at the switch. Up to three
    restarts of the VIP's leader; at least one GET must fail (else the test above proves nothing)."""
    vips = spread_vips(NODES)
    ip, leader = next(iter(vips.items()))
    docs = pool_docs() + [service_doc(f"svc{i}", [v]) for i, v in enumerate(sorted(vips))]
    c = SpeakerCluster(make_segment(hosts=3), tmp_path / "cluster", profile="lan", resources=docs)
    c.start_all(timeout=40)
    c.wait(c.settled, 30, "every VIP past its checks")
    c.wait(lambda: c.answered_by(ip, leader), 20, f"{ip} answered by {leader} alone")
    watch = VipWatch(c, {ip: leader}, tmp_path / "samples.jsonl", 0.05, 0.04, 300)
    t0 = time.time()
    lost = 0
    for _restart in range(3):
        c.stop(leader, signal.SIGTERM)
        time.sleep(0.5)
        c.start(leader)
        c.wait(lambda: c.answered_by(ip, leader), 30, f"{leader} answers {ip} again")
        time.sleep(0.5)
        lost = len([f for f in watch.polls[ip].failed if f["t"] >= t0])
        if lost:
            break
    _samples, failed = watch.stop(t0, time.time())
    print(f"plain SIGTERM: GETs failed {failed}")
    assert lost, "no GET failed without the hand-off: the hand-off test cannot tell it works"
