"""node_drain confirms a drain from another member's view (issue 8, defect 4): two in-process
speakers (tests/unit/speaker/inproc_speaker.py: real config, kinship on loopback, decision loops
running; layer-2 side effects recorded), the module run as Ansible runs it against one of them."""

from __future__ import annotations

import sys

import pytest

from .conftest import ROOT, run_module

sys.path.insert(0, str(ROOT / "tests" / "unit" / "speaker"))

from inproc_speaker import Harness, pool_docs, run_loop, service_doc, vips_led, wait_for  # noqa: E402
from nocloudlb.core.election import DRAIN_LABEL  # noqa: E402

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def pair(tmp_path, monkeypatch):
    import nocloudlb.metrics

    monkeypatch.setattr(nocloudlb.metrics, "serve", lambda bind, snapshot, registry=None: None)
    h = Harness(tmp_path)
    loops = []
    vips = vips_led(["s1", "s2"], 2)
    docs = pool_docs() + [service_doc(f"svc{i}", ip) for i, ip in enumerate(sorted(vips))]
    s1 = h.speaker("s1", docs, join=["s2"])
    s2 = h.speaker("s2", docs, join=["s1"])
    for sp in (s1, s2):
        wait_for(lambda sp=sp: {m.name for m in sp.membership.members() if m.state == "alive"} == {"s1", "s2"},
                 10, "join")
        loops.append(run_loop(sp))
    for sp in (s1, s2):
        wait_for(lambda sp=sp: sp.ready, 10, "ready")
    yield h, s1, s2, vips
    for sp, (thread, _out) in zip((s1, s2), loops, strict=True):
        sp.post("stop")
        thread.join(timeout=5)
    h.close()


def test_drain_is_confirmed_by_the_peer_and_moves_every_vip(pair):
    _h, s1, s2, vips = pair
    mine = {ip for ip, n in vips.items() if n == "s1"}
    wait_for(lambda: set(s1.journal.announced()) == mine, 10, "s1 announcing its VIPs")
    res = run_module("node_drain", {"socket": s1.holder.current.socket, "timeout": 10})
    assert not res.get("failed"), res
    assert res["confirmed_by"] == "s2" and set(res["moved"]) == mine
    wait_for(lambda: set(s2.journal.announced()) == set(vips), 10, "s2 announcing every VIP")


def test_drain_that_peers_never_see_fails_and_the_node_keeps_its_vips(pair):
    _h, s1, s2, vips = pair
    mine = {ip for ip, n in vips.items() if n == "s1"}
    wait_for(lambda: set(s1.journal.announced()) == mine, 10, "s1 announcing its VIPs")

    def too_large(meta):
        import kinship

        raise kinship.MetaTooLarge("encoded metadata is larger than max_meta_bytes")

    s1.membership.set_meta = too_large  # the drain label can never be published
    res = run_module("node_drain", {"socket": s1.holder.current.socket, "timeout": 4})
    assert res.get("failed"), f"node_drain reported success for a drain no peer saw: {res}"
    assert DRAIN_LABEL not in s1.my_labels()  # rolled back
    # nobody lost an answer meanwhile: s1 still answers for its VIPs, s2 never took them
    assert set(s1.journal.announced()) == mine
    assert not set(s2.journal.announced()) & mine
