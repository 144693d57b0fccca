"""A corrupt state file never crash-loops the speaker; a corrupt labels file starts the node drained.

Two real speakers on one bridge and a client. Before n1 starts, its ``stateDir/labels.json`` (and its
``lo-vips.json``) are garbage. On main at b37e060 n1 exits at once (``speakerFailed``: "cannot read
runtime labels") and systemd would restart it into the same error, so this test fails there waiting
for n1's membership. Now: n1 starts, both files are set aside (``*.corrupt-<UTC time>`` beside them,
``stateFileCorrupt`` in its log), and n1 is drained, since the lost file may have held a drain: n2
answers for the VIP n1 would lead (checked on the wire), n1's status says so. The usual undrain gives
the VIP back to n1.
"""

from __future__ import annotations

import pytest
from nocloudlb.core.control_client import request
from nocloudlb.core.election import DRAIN_LABEL
from speaker_harness import SpeakerCluster, pool_docs, service_doc, spread_vips

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def netns_prefix() -> str:
    return "bar"


def test_garbage_labels_file_starts_drained_and_is_set_aside(make_segment, tmp_path):
    vips = spread_vips(["n1", "n2"], 1)
    ip = next(a for a, leader in vips.items() if leader == "n1")
    docs = pool_docs() + [service_doc(f"svc{i}", [v]) for i, v in enumerate(sorted(vips))]
    c = SpeakerCluster(make_segment(hosts=2), tmp_path, resources=docs)
    state = tmp_path / "n1" / "state"
    state.mkdir(parents=True)
    (state / "labels.json").write_bytes(b"\x00\x01 not json {")
    (state / "lo-vips.json").write_text('{"managed": 5}')
    c.start_all()

    assert c.procs["n1"].poll() is None, "n1 exited"
    aside = sorted(p.name for p in state.iterdir() if ".corrupt-" in p.name)
    assert [n.split(".corrupt-")[0] for n in aside] == ["labels.json", "lo-vips.json"], sorted(state.iterdir())
    events = c.events("n1", "stateFileCorrupt")
    assert {e.get("path") for e in events} == {str(state / "labels.json"), str(state / "lo-vips.json")}, events
    labels_event = next(e for e in events if e["path"].endswith("labels.json"))
    assert labels_event.get("level") in ("error", "ERROR") and labels_event.get("drained") is True, labels_event
    st = c.status("n1")
    assert DRAIN_LABEL in st["labels"] and DRAIN_LABEL in st["published"]["labels"], st["labels"]
    assert st["stateFiles"] and st["stateFiles"][0]["setAside"].endswith(aside[0]), st["stateFiles"]

    # the node is drained: n2 answers for n1's VIP, n1 does not
    c.wait(lambda: [a["mac"] for a in c.probe(ip)] == [c.mac("n2")], 15, f"n2 alone answers for {ip}")
    assert not c.announcing("n1", ip)

    # the operator checks, then undrains with the usual command: n1 takes its VIP back
    res = request(c.sock("n1"), {"cmd": "label", "unset": [DRAIN_LABEL]})
    assert res["ok"], res
    c.wait(lambda: [a["mac"] for a in c.probe(ip)] == [c.mac("n1")], 15, f"n1 answers for {ip} again")
