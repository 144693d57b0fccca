"""One failing step affects its own step or mode only; an error that persists fails closed by a planned move.

A real in-process speaker ("s", its layer-2 side effects recorded in order) and a bare kinship peer
("p"). Faults are injected into collaborators of the barriers (a toy mode whose apply raises, a
health checker or a membership whose read raises), never into the barriers themselves.

On main at b37e060, any exception escaping the decision loop's iteration made every mode
``withdraw_all()`` at once, while the peers still elected the node: no owner for every VIP of it.
``test_a_failing_view_keeps_what_the_node_holds_then_drains_then_withdraws`` fails there at its first
assertion (withdrawn within the first second). A raising health read or heartbeat peer update stopped
the whole reconcile (``test_failing_publish_steps_do_not_stop_the_modes`` fails there with the injected
error), and no step error was counted anywhere.
"""

from __future__ import annotations

import time
from typing import Any

import kinship
import pytest
from inproc_speaker import decided, pool_docs, run_loop, service_doc, vips_led, wait_for
from nocloudlb.core.election import DRAIN_LABEL
from nocloudlb.modes import FAIL_BOUND, ModeRunner
from prometheus_client import CollectorRegistry, generate_latest

pytestmark = pytest.mark.timeout(90)


def two_nodes(harness):
    vips = vips_led(["s", "p"], 2)
    docs = pool_docs() + [service_doc(f"svc{i}", ip) for i, ip in enumerate(sorted(vips))]
    sp = harness.speaker("s", docs, join=["p"])
    peer = harness.peer("p", sp.codec.encode({}, []), join=["s"])
    decided(sp, {"s", "p"})
    mine = {ip for ip, leader in vips.items() if leader == "s"}
    assert set(sp.journal.announced()) == mine
    return sp, peer, mine


class ToyMode:
    """A mode whose ``apply`` raises while ``failing`` (the fault a bug in a mode would make)."""

    name = "toy"

    def __init__(self, failing: bool = True) -> None:
        self.failing = failing
        self.applied = 0
        self.withdrawn = 0

    def start(self) -> None:
        pass

    def apply(self, me: str, nodes: list, parsed: Any) -> None:
        if self.failing:
            raise RuntimeError("injected: toy apply")
        self.applied += 1

    def withdraw_all(self) -> None:
        self.withdrawn += 1

    def status(self) -> dict:
        return {"applied": self.applied}

    def close(self) -> None:
        pass


class Raising:
    """Raises ``times`` times (forever with None), then calls ``real``."""

    def __init__(self, real: Any, times: int | None = None, exc: BaseException | None = None) -> None:
        self.real, self.times, self.calls = real, times, 0
        self.exc = exc or RuntimeError("injected fault")

    def __call__(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        if self.times is None or self.calls <= self.times:
            raise self.exc
        return self.real(*args, **kw)


def metrics_text(sp) -> str:
    from nocloudlb.metrics import SpeakerCollector

    reg = CollectorRegistry()
    reg.register(SpeakerCollector(sp.metrics_snapshot))
    return generate_latest(reg).decode()


def record_meta(sp) -> None:
    """Journal every metadata publication (its labels), in order with the announcements."""
    real = sp.membership.set_meta

    def set_meta(meta):
        real(meta)
        sp.journal.append(("meta", dict(sp.codec.decode(meta).labels)))

    sp.membership.set_meta = set_meta


def withdrawals(journal, since: int, mine: set[str]) -> list[int]:
    return [i for i, e in enumerate(journal) if i >= since and e[0] == "announce" and set(e[1]) != mine]


def peer_sees_drained(peer) -> bool:
    import json

    return any(m.name == "s" and DRAIN_LABEL in json.loads(m.meta.get("l", "{}")) for m in peer.members())


# -- mode level ----------------------------------------------------------------------------------
def test_a_failing_mode_withdraws_that_mode_only_and_is_counted(harness):
    sp, _peer, mine = two_nodes(harness)
    toy = ToyMode()
    sp.modes.insert(0, ModeRunner(toy, sp.steps))
    for _dummy in range(3):
        sp.reconcile()
    assert toy.withdrawn == 3, "the failing mode did not withdraw"
    assert set(sp.journal.announced()) == mine, "another mode's failure took layer 2's VIPs"
    assert not withdrawals(sp.journal, 0, mine)
    st = sp.status()
    assert "injected: toy apply" in st["modes"]["toy"]["failing"]
    assert st["steps"]["toy.apply"]["errors"] == 3 and "RuntimeError" in st["steps"]["toy.apply"]["failing"]
    assert 'nocloudlb_speaker_step_errors_total{step="toy.apply"} 3.0' in metrics_text(sp)
    toy.failing = False
    sp.reconcile()
    st = sp.status()
    assert "failing" not in st["modes"]["toy"] and st["steps"]["toy.apply"]["failing"] == ""
    assert st["steps"]["toy.apply"]["errors"] == 3


def test_failing_publish_steps_do_not_stop_the_modes(harness):
    """Health, heartbeat peers, a mode's meta/status/busy hooks: each raises, each is counted, and the
    reconcile goes on; a label change is still published (and so decided on)."""
    sp, _peer, mine = two_nodes(harness)

    class Hooks(ToyMode):
        def meta(self) -> dict:
            raise RuntimeError("injected: meta")

        def status(self) -> dict:
            raise RuntimeError("injected: status")

    sp.modes.insert(0, ModeRunner(Hooks(failing=False), sp.steps))
    sp.health.healthy = Raising(sp.health.healthy)
    assert sp.heartbeat is not None, "the harness runs heartbeats"
    sp.heartbeat.set_peers = Raising(sp.heartbeat.set_peers)
    sp.reconcile()
    assert set(sp.journal.announced()) == mine
    st = sp.status()  # a raising status hook: the status still answers
    assert st["node"] == "s"
    for step in ("health", "heartbeatPeers", "toy.hook.meta", "toy.status"):
        assert st["steps"][step]["errors"] >= 1, (step, st["steps"])
    sp.labels.update({DRAIN_LABEL: "true"})
    sp.reconcile()
    assert DRAIN_LABEL in sp.published().labels, "the drain was not published"
    sp.reconcile()
    assert sp.journal.announced() == {}, "the published drain was not decided on"
    text = metrics_text(sp)
    assert 'nocloudlb_speaker_step_errors_total{step="health"}' in text


def test_a_mode_failing_past_the_bound_excludes_the_node_by_a_planned_move(harness):
    """A mode that keeps failing has withdrawn while its peers still elect the node: after the bound the
    node publishes itself drained (every mode then hands over by the usual planned move), and returns
    once the mode has applied again for the hold time."""
    sp, peer, mine = two_nodes(harness)
    toy = ToyMode()
    sp.modes.insert(0, ModeRunner(toy, sp.steps))
    thread, out = run_loop(sp)
    try:
        t0 = time.monotonic()
        sp.post()
        wait_for(lambda: peer_sees_drained(peer), 15, "the peer sees the node drained")
        assert time.monotonic() - t0 >= FAIL_BOUND - 0.5, "drained before the bound"
        wait_for(lambda: sp.journal.announced() == {}, 5, "layer 2 hands over once drained")
        assert "toy" in sp.status()["failClosed"]["reason"]
        toy.failing = False
        sp.post()
        wait_for(lambda: set(sp.journal.announced()) == mine and not peer_sees_drained(peer), 20,
                 "back to normal once the mode applies again")
        assert sp.status()["failClosed"] == {}
    finally:
        sp.post("stop")
        thread.join(timeout=5)
    assert out.get("code") == 0, out


# -- loop level ----------------------------------------------------------------------------------
def test_a_failing_view_keeps_what_the_node_holds_then_drains_then_withdraws(harness):
    sp, peer, mine = two_nodes(harness)
    record_meta(sp)
    thread, out = run_loop(sp)
    try:
        time.sleep(0.3)
        start = len(sp.journal)
        real_members = sp.membership.members
        sp.membership.members = Raising(real_members)  # the view cannot be built
        t0 = time.monotonic()
        sp.post()
        time.sleep(1.0)  # the bound is 3 s: a second of errors changes nothing the wire sees
        assert not withdrawals(sp.journal, start, mine), "withdrew at the first error: no owner"
        assert set(sp.journal.announced()) == mine
        wait_for(lambda: sp.journal.announced() == {}, 15, "withdrawn once the errors persist")
        took = time.monotonic() - t0
        assert took >= FAIL_BOUND - 0.5, f"withdrawn after {took:.2f}s, before the bound"
        drained = [i for i, e in enumerate(sp.journal) if i >= start and e[0] == "meta" and DRAIN_LABEL in e[1]]
        first_withdrawal = withdrawals(sp.journal, start, mine)[0]
        assert drained and drained[0] < first_withdrawal, "withdrew before publishing the drain"
        wait_for(lambda: peer_sees_drained(peer), 5, "the peer sees the drain (it takes over)")
        sp.membership.members = real_members  # healed; still drained for the hold time (3 s) after it
        st = sp.status()
        assert "view" in st["failClosed"]["reason"] and st["steps"]["view"]["errors"] >= 3, st["steps"]
        assert 'nocloudlb_speaker_fail_closed_bool 1.0' in metrics_text(sp)
        wait_for(lambda: set(sp.journal.announced()) == mine and not peer_sees_drained(peer), 20,
                 "back to normal after the errors stop")
        assert sp.status()["failClosed"] == {} and thread.is_alive()
    finally:
        sp.membership.members = real_members
        sp.post("stop")
        thread.join(timeout=5)
    assert out.get("code") == 0, out


def test_errors_shorter_than_the_bound_change_nothing(harness):
    sp, peer, mine = two_nodes(harness)
    record_meta(sp)
    thread, out = run_loop(sp)
    try:
        time.sleep(0.3)
        start = len(sp.journal)
        sp.membership.members = Raising(sp.membership.members, times=2)
        sp.post()
        wait_for(lambda: sp.membership.members.calls > 3, 10, "the view works again")
        time.sleep(FAIL_BOUND + 1.0)
        assert not withdrawals(sp.journal, start, mine), "a short error withdrew"
        assert not [e for e in sp.journal[start:] if e[0] == "meta" and DRAIN_LABEL in e[1]], "a short error drained"
        assert sp.status()["steps"]["view"] == {"errors": 2, "failing": ""}
    finally:
        sp.post("stop")
        thread.join(timeout=5)
    assert out.get("code") == 0, out


def test_when_the_drain_cannot_be_published_the_node_withdraws_at_once(harness):
    sp, _peer, mine = two_nodes(harness)
    thread, out = run_loop(sp)
    try:
        time.sleep(0.3)
        start = len(sp.journal)
        sp.membership.set_meta = Raising(sp.membership.set_meta, exc=kinship.KinshipError("injected: gossip"))
        sp.membership.members = Raising(sp.membership.members)
        t0 = time.monotonic()
        sp.post()
        wait_for(lambda: sp.journal.announced() == {}, 15, "withdrawn")
        took = time.monotonic() - t0
        assert FAIL_BOUND - 0.5 <= took <= FAIL_BOUND + 3.0, took
        assert withdrawals(sp.journal, start, mine)
        assert DRAIN_LABEL not in sp.published().labels  # it could not say so: withdrawing is all that is left
    finally:
        sp.post("stop")
        thread.join(timeout=5)
    assert out.get("code") == 0, out


# -- a corrupt labels file at start ----------------------------------------------------------------
def test_a_speaker_with_a_corrupt_labels_file_starts_drained_and_says_so(harness):
    from nocloudlb.core.control_client import request

    state = harness.tmp / "s" / "state"
    state.mkdir(parents=True)
    (state / "labels.json").write_text("\x00garbage{")
    sp, _peer, _mine = None, None, None
    vips = vips_led(["s", "p"], 2)
    docs = pool_docs() + [service_doc(f"svc{i}", ip) for i, ip in enumerate(sorted(vips))]
    sp = harness.speaker("s", docs, join=["p"])  # started: no crash
    harness.peer("p", sp.codec.encode({}, []), join=["s"])
    decided(sp, {"s", "p"})
    sp.reconcile()
    st = sp.status()
    assert DRAIN_LABEL in st["labels"] and DRAIN_LABEL in st["published"]["labels"], st["labels"]
    (rec,) = st["stateFiles"]
    assert rec["path"] == str(state / "labels.json") and ".corrupt-" in rec["setAside"] and rec["drained"]
    assert sp.journal.announced() == {}, "a node whose drain may have been lost announced"
    res = request(sp.cfg.socket, {"cmd": "label", "unset": [DRAIN_LABEL]}, 5.0)
    assert res["ok"], res
    sp.reconcile()
    sp.reconcile()
    assert set(sp.journal.announced()) == {ip for ip, leader in vips.items() if leader == "s"}


def test_step_events_are_rate_limited_and_counted(caplog):
    import logging

    from nocloudlb.modes import Steps

    caplog.set_level(logging.DEBUG)
    steps = Steps()
    for _dummy in range(50):  # a step that fails and works in turn, once per reconcile
        steps.run("health", Raising(None))
        steps.run("health", lambda: 1)
    loud = [r for r in caplog.records if getattr(r, "event", "") in ("stepFailed", "stepRecovered")
            and r.levelno >= logging.INFO]
    assert [r.event for r in loud] == ["stepFailed", "stepRecovered"], [r.event for r in loud]
    assert loud[0].levelno == logging.ERROR and loud[0].fields["step"] == "health"
    assert "RuntimeError: injected fault" in loud[0].fields["error"]
    assert steps.status() == {"health": {"errors": 50, "failing": ""}}
