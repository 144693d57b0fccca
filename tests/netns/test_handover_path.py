"""Handover forwarding off the decision path (issue 8, defect 2), with the real ``nft`` in a
namespace of the test's own (through a wrapper that enters it, counts calls and can be slow).

- ending forwardings the kernel already expired, or never installed, costs at most one nft call
  (the old code fell back to two nft processes per VIP on the decision thread);
- a speaker that loses a forwarded VIP withdraws it at once, while the nft teardown is slow.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "speaker"))

from nocloudlb.core.election import DRAIN_LABEL  # noqa: E402
from nocloudlb.l2.handover import TABLE, HandoverForwarder  # noqa: E402

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def nft_ns(tmp_path):
    """A namespace of our own and an ``nft`` wrapper that runs in it: (wrapper, calls file, ns)."""
    ns = f"nho{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
    calls = tmp_path / "calls"
    delay = tmp_path / "delay"
    delay.write_text("0")
    wrapper = tmp_path / "nft"
    wrapper.write_text(f"#!/bin/sh\necho x >> {calls}\nsleep $(cat {delay})\nexec ip netns exec {ns} nft \"$@\"\n")
    wrapper.chmod(0o755)
    yield wrapper, calls, delay, ns
    subprocess.run(["ip", "netns", "del", ns], check=False)


def count(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_ending_expired_or_unknown_forwardings_costs_one_nft_call(nft_ns):
    wrapper, calls, _delay, ns = nft_ns
    fw = HandoverForwarder(logging.getLogger("test"), grace=1, nft=str(wrapper))
    assert fw.start()
    ips = ["198.51.100.210", "198.51.100.211", "198.51.100.212", "2001:db8:1::210"]
    assert fw.forward({ip: ("02:00:00:00:0b:01", ["lo"]) for ip in ips}) == sorted(ips)
    time.sleep(2.5)  # the kernel expires them (grace 1 s)
    listed = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "set", "netdev", TABLE, "vips4"],
                            capture_output=True, text=True, check=True).stdout
    assert "198.51.100.210" not in listed, listed
    before = count(calls)
    fw.stop_forwarding(ips + ["198.51.100.250"])  # expired ones, and one never forwarded
    assert count(calls) - before <= 1, f"{count(calls) - before} nft calls to end {len(ips)} expired forwardings"
    before = count(calls)
    fw.stop_forwarding(["198.51.100.251", "198.51.100.252"])  # never forwarded here
    assert count(calls) - before <= 1
    # and the table still works: forward again, end again, nothing left behind
    assert fw.forward({ips[0]: ("02:00:00:00:0b:02", ["lo"])}) == [ips[0]]
    fw.stop_forwarding([ips[0]])
    table = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "table", "netdev", TABLE],
                           capture_output=True, text=True, check=True).stdout
    assert "198.51.100.21" not in table and "2001:db8:1::210" not in table, table
    fw.close()


def test_losing_a_forwarded_vip_withdraws_before_the_slow_nft_teardown(nft_ns, tmp_path, monkeypatch):
    import nocloudlb.metrics
    from inproc_speaker import Harness, mac_field, pool_docs, service_doc, vips_led, wait_for

    monkeypatch.setattr(nocloudlb.metrics, "serve", lambda bind, snapshot, registry=None: None)
    wrapper, _calls, delay, _ns = nft_ns
    h = Harness(tmp_path)
    try:
        vips = vips_led(["s", "p"], 1)
        ip = next(v for v, leader in vips.items() if leader == "p")
        docs = pool_docs() + [service_doc(f"svc{i}", v) for i, v in enumerate(sorted(vips))]
        sp = h.speaker("s", docs, join=["p"])
        sp.announcer.ifaces = ["lo"]
        fw = HandoverForwarder(logging.getLogger("test"), grace=30, nft=str(wrapper))
        assert fw.start()
        sp.l2.handover = fw
        base = dict(sp.codec.encode({}, []))
        base["m"] = mac_field("02:00:00:00:0b:07")
        peer = h.peer("p", base, join=["s"])
        wait_for(lambda: {m.name for m in sp.membership.members() if m.state == "alive"} == {"s", "p"}, 10, "join")
        sp.reconcile()
        assert ip not in sp.journal.announced()
        drained = dict(sp.codec.encode({DRAIN_LABEL: ""}, []))
        drained["m"] = base["m"]
        peer.set_meta(drained)  # a planned move: p drains, s takes ip over and forwards to p's MAC
        wait_for(lambda: sp.reconcile() or ip in sp.journal.announced(), 10, "s announcing the drained VIP")
        assert fw.forwarded() == [ip]
        delay.write_text("0.8")  # from now on every nft call takes 0.8 s
        peer.set_meta(base)  # p undrains: s loses ip
        wait_for(lambda: next(n for n in sp.node_views() if n.name == "p").labels == {}, 10, "s sees the undrain")
        t0 = time.monotonic()
        sp.reconcile()
        took = time.monotonic() - t0
        assert ip not in sp.journal.announced(), "still answering for a VIP it lost"
        assert took < 0.5, f"the decision thread spent {took:.2f} s (nft teardown on the path that decides)"
        wait_for(lambda: fw.forwarded() == [], 10, "the forwarding ended in the background")
    finally:
        h.close()
