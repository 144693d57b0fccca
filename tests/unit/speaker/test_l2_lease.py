"""The answering lease (l2/lease.py): the deadline in shared memory, the responder and the announcer's
own answering path obeying it, gratuitous frames held while it has run out, and the decision loop's
renewal rule (steady renewal, stall, settle, reconcile, renewal).

Frames go through real sockets (AF_UNIX datagram pairs stand in for the AF_PACKET sockets, which the
namespace tests use: tests/netns/test_l2_lease.py and test_speaker_lease.py); the lease is shared
with a real child process.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import subprocess
import sys
import time

import pytest
from nocloudlb.l2 import arp, ndp
from nocloudlb.l2.announcer import L2Announcer
from nocloudlb.l2.lease import ENV, OPEN, Lease, Renewal, lease_seconds
from nocloudlb.l2.responder import Responder, _Port
from nocloudlb.l2.tables import Iface
from nocloudlb.membership import PROFILES
from prometheus_client import CollectorRegistry

pytestmark = pytest.mark.timeout(60)

MAC = bytes.fromhex("020000000001")
CLIENT_MAC = bytes.fromhex("0200000000c1")
VIP4 = ipaddress.IPv4Address("198.51.100.200").packed
VIP6 = ipaddress.IPv6Address("2001:db8:1::200").packed
CLIENT4 = ipaddress.IPv4Address("192.0.2.10").packed
CLIENT6 = ipaddress.IPv6Address("2001:db8:2::10").packed


def _past(seconds: float = 5.0) -> int:
    return time.monotonic_ns() - int(seconds * 1e9)


# -- the lease itself ------------------------------------------------------------------------
def test_a_new_lease_is_open_and_renewals_move_its_deadline():
    lease = Lease.create()
    try:
        assert lease.deadline_ns == OPEN and lease.valid() and lease.remaining() is None
        lease.renew(30)
        assert lease.valid() and 29 < (lease.remaining() or 0) <= 30
        lease.renew(1.0, start_ns=_past(2.0))  # counted from a moment 2 s ago: already over
        assert not lease.valid() and lease.remaining() == 0.0
        lease.renew(30)
        lease.expire()
        assert not lease.valid()
        lease.open()
        assert lease.valid()
        with pytest.raises(ValueError, match="seconds must be >= 0, got -1"):
            lease.renew(-1)
    finally:
        lease.close()


def test_a_short_lease_runs_out_by_itself():
    lease = Lease.create()
    try:
        lease.renew(0.2)
        assert lease.valid()
        time.sleep(0.4)
        assert not lease.valid()
    finally:
        lease.close()


CHILD = """
import os, sys
from nocloudlb.l2.lease import ENV, Lease
lease = Lease.attach(int(os.environ[ENV]))
try:
    lease.renew(1)
    print("writable", flush=True)
except TypeError:
    print("read-only", flush=True)
for line in sys.stdin:
    print(int(lease.valid()), flush=True)
"""


def test_a_child_reads_every_renewal_from_the_shared_page_and_cannot_write_it():
    lease = Lease.create()
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, pass_fds=(lease.fd,), env={**os.environ, ENV: str(lease.fd)})
    assert proc.stdin is not None and proc.stdout is not None

    def ask() -> str:
        proc.stdin.write("?\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()

    try:
        assert proc.stdout.readline().strip() == "read-only"
        lease.renew(30)
        assert ask() == "1"
        lease.expire()
        assert ask() == "0"
        lease.renew(30)
        assert ask() == "1"
        lease.renew(1, start_ns=_past())
        assert ask() == "0"
    finally:
        proc.stdin.close()
        proc.wait(10)
        lease.close()


# -- the responder child refuses after expiry -------------------------------------------------
@pytest.fixture
def responder():
    lease = Lease.create()
    ctl_r, ctl_w = os.pipe()
    out_r, out_w = os.pipe()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.setblocking(False)
    theirs.settimeout(0.5)
    r = Responder(ctl_r, out_w, lease=Lease.attach(os.dup(lease.fd)))
    port = _Port("eth0", 2, MAC, ours, MAC + b"\x08\x06" + b"\x00\x01\x08\x00\x06\x04" + b"\x00\x02" + MAC)
    port.answer.update({VIP4, VIP6})
    r.ports["eth0"] = port
    os.set_blocking(out_r, False)
    yield r, port, theirs, lease, out_r
    for fd in (ctl_r, ctl_w, out_r, out_w):
        os.close(fd)
    ours.close()
    theirs.close()
    lease.close()


def _ask(r: Responder, port: _Port, wire: socket.socket, frame: bytes) -> bytes | None:
    wire.send(frame)
    r.frames(port)
    try:
        return wire.recv(2048)
    except TimeoutError:
        return None


def _requests() -> tuple[bytes, bytes]:
    return (arp.probe(CLIENT_MAC, VIP4, CLIENT4),
            ndp.solicitation(CLIENT_MAC, VIP6, CLIENT6))


def test_the_responder_answers_while_the_lease_holds_and_refuses_after(responder):
    r, port, wire, lease, out_r = responder
    req4, req6 = _requests()
    lease.renew(30)
    reply4, reply6 = _ask(r, port, wire, req4), _ask(r, port, wire, req6)
    assert reply4 is not None and arp.parse(reply4) is not None and arp.parse(reply4).sha == MAC
    assert reply6 is not None and ndp.parse(reply6) is not None and ndp.parse(reply6).type == ndp.NA
    lease.renew(1, start_ns=_past())  # ran out: the daemon did not renew in time
    wire.settimeout(0.2)
    assert _ask(r, port, wire, req4) is None and _ask(r, port, wire, req6) is None
    assert r.refused == 2 and r.stats()["leaseRefused"] == 2 and port.answered == 2
    r.flush(force=True)
    line = os.read(out_r, 65536).decode().strip().splitlines()[-1]
    assert '"lx":2' in line and '"198.51.100.200":[2,1]' in line
    lease.renew(30)  # renewed: answering again at once
    assert _ask(r, port, wire, req4) is not None


def test_a_responder_without_a_lease_fd_answers_as_before(responder):
    r, port, wire, lease, _out = responder
    r.lease = None
    lease.expire()
    assert _ask(r, port, wire, _requests()[0]) is not None


# -- the announcer: its own answering path and its gratuitous frames --------------------------
@pytest.fixture
def announcer():
    reg = CollectorRegistry()
    a = L2Announcer("n1", logging.getLogger("test.lease"), registry=reg, check_probes=0)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    theirs.settimeout(0.2)
    iface = Iface("eth0", 2, MAC, ours, tokens=100.0, refilled=time.monotonic())
    a._links.ifaces["eth0"] = iface
    a._links.eligible = ["eth0"]
    yield a, iface, theirs, reg
    ours.close()
    theirs.close()


def test_the_announcers_own_answers_obey_the_lease(announcer):
    a, iface, wire, reg = announcer
    assert a._responder.fallback  # no child has the state: this thread answers
    a.set_announced({"198.51.100.200": [], "2001:db8:1::200": []}, skip_check=["198.51.100.200", "2001:db8:1::200"])
    req4, req6 = _requests()
    assert a.renew_lease(30) == 2
    a._answerer.on_arp(iface, req4)
    assert arp.parse(wire.recv(2048)).sha == MAC
    a.renew_lease(1, start_ns=_past())
    a._answerer.on_arp(iface, req4)
    a._answerer.on_nd(iface, req6)
    with pytest.raises(TimeoutError):
        wire.recv(2048)
    assert a.lease_status() == {"remainingMs": 0.0, "refused": 2}
    assert a.stats()["responder"]["lease"]["refused"] == 2
    assert reg.get_sample_value("nocloudlb_layer2_lease_expired_total") == 2
    assert reg.get_sample_value("nocloudlb_layer2_lease_remaining_seconds") == 0.0
    a.renew_lease(30)
    assert 29 < reg.get_sample_value("nocloudlb_layer2_lease_remaining_seconds") <= 30
    a._answerer.on_nd(iface, req6)
    assert ndp.parse(wire.recv(2048)).type == ndp.NA


def test_refusals_the_child_reports_are_counted(announcer):
    a, _iface, _wire, reg = announcer
    a._responder.on_message({"n": {"198.51.100.200": [3, 0]}, "s": {}, "lx": 3})
    assert a.lease_status()["refused"] == 3 and reg.get_sample_value("nocloudlb_layer2_lease_expired_total") == 3


def _gratuitous(wire: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(wire.recv(2048))
        except TimeoutError:
            return out


def test_gratuitous_frames_wait_for_the_lease_and_are_dropped_when_withdrawn_meanwhile(announcer):
    a, iface, wire, _reg = announcer
    a.renew_lease(1, start_ns=_past())  # ran out (a frozen daemon thawing)
    a.set_announced({"198.51.100.200": []}, skip_check=["198.51.100.200"])
    a._lifecycle.run_timers()
    a._pacer.transmit()
    assert _gratuitous(wire) == [] and len(iface.urgent) == 2  # request and reply form, kept in order
    a.renew_lease(30)
    a._pacer.transmit()
    sent = _gratuitous(wire)
    assert len(sent) == 2 and all(arp.parse(f).spa == arp.parse(f).tpa == VIP4 for f in sent)
    # held, then withdrawn before the renewal: never sent
    a.renew_lease(1, start_ns=_past())
    a.reannounce(["198.51.100.200"])
    a._lifecycle.run_timers()
    a._pacer.transmit()
    assert _gratuitous(wire) == [] and len(iface.queue) == 2
    a.set_announced({})
    a._pacer.transmit()  # the stale frames leave the queue without the lease
    assert not iface.queue and not iface.urgent
    a.renew_lease(30)
    a._pacer.transmit()
    assert _gratuitous(wire) == []


def test_a_lease_given_to_the_announcer_is_granted_at_start_and_validated():
    with pytest.raises(ValueError, match="lease must be > 0 seconds.*got 0"):
        L2Announcer("n1", logging.getLogger("test.lease"), registry=None, lease=0)
    a = L2Announcer("n1", logging.getLogger("test.lease"), registry=None)
    assert a.lease_status()["remainingMs"] is None  # open until the first renewal


# -- the decision loop's renewal ---------------------------------------------------------------
class _Renewer:
    def __init__(self, held: int = 1) -> None:
        self.held = held
        self.calls: list[tuple[float, int]] = []

    def __call__(self, seconds: float, start_ns: int) -> int:
        self.calls.append((seconds, start_ns))
        return self.held


MS = 1_000_000


def test_steady_renewal_wakes_every_third_of_the_lease_while_addresses_are_held():
    ren, renew = Renewal(0.3, settle=0.05), _Renewer(held=0)
    t = 1_000 * MS
    assert ren.step(t, renew) == (1.0, None)  # nothing held: the loop's own 1 s
    t += 900 * MS  # idle for longer than the lease with nothing to answer: not a stall
    renew.held = 4
    sleep, event = ren.step(t, renew)
    assert event is None and sleep == pytest.approx(0.1)
    for _pass in range(5):
        t += 250 * MS  # a pass of 150 ms after a 100 ms wait: still within the lease
        assert ren.step(t, renew) == (pytest.approx(0.1), None)
    assert [s for s, _t in renew.calls] == [0.3] * 7 and renew.calls[-1][1] == t  # counted from the check


def test_a_stall_holds_the_renewal_until_a_reconcile_after_the_heartbeats_caught_up():
    ren, renew = Renewal(0.3, settle=0.05), _Renewer(held=2)
    t = 1_000 * MS
    ren.step(t, renew)
    t += 3_000 * MS  # frozen for 3 s
    sleep, event = ren.step(t, renew)
    assert sleep == pytest.approx(0.05) and event == {"event": "l2LeaseStalled", "gapMs": 3000, "leaseMs": 300,
                                                      "settleMs": 50}
    assert len(renew.calls) == 1 and ren.stalled
    t += 20 * MS  # woken by an event during the settle: a pass reconciles, no renewal
    assert ren.step(t, renew) == (pytest.approx(0.03), None) and len(renew.calls) == 1
    t += 30 * MS  # settled: the next pass reconciles from what the heartbeat thread read
    assert ren.step(t, renew) == (0.0, None) and len(renew.calls) == 1
    t += 40 * MS  # that reconcile took 40 ms: renewed now
    sleep, event = ren.step(t, renew)
    assert event == {"event": "l2LeaseRenewed", "stalledMs": 3090} and sleep == pytest.approx(0.1)
    assert len(renew.calls) == 2 and not ren.stalled and ren.stalls == 1


def test_a_reconcile_pass_that_stalls_again_starts_the_settle_again():
    ren, renew = Renewal(0.3, settle=0.05), _Renewer()
    t = 1_000 * MS
    ren.step(t, renew)
    t += 1_000 * MS
    ren.step(t, renew)  # stalled
    t += 50 * MS
    assert ren.step(t, renew) == (0.0, None)  # settled: reconcile
    t += 2_000 * MS  # frozen again during that reconcile
    sleep, event = ren.step(t, renew)
    assert event is not None and event["event"] == "l2LeaseStalled" and len(renew.calls) == 1
    t += 50 * MS
    assert ren.step(t, renew) == (0.0, None)
    t += 10 * MS
    _sleep, event = ren.step(t, renew)
    assert event == {"event": "l2LeaseRenewed", "stalledMs": 3110} and len(renew.calls) == 2


def test_the_renewal_is_validated():
    with pytest.raises(ValueError, match="seconds must be > 0 and settle >= 0, got 0, 0.05"):
        Renewal(0, 0.05)


def test_lease_length_from_the_profiles():
    def of(profile: str) -> float:
        p = PROFILES[profile]
        return lease_seconds(p["heartbeat_interval"], p["heartbeat_miss"])

    assert of("fast") == pytest.approx(0.3)  # 25 ms x 4 = 0.1 s timeout, x 2 = 0.2 s: at least 0.3 s
    assert of("lan") == pytest.approx(1.2)  # 150 ms x 4 = 0.6 s timeout, x 2
    assert lease_seconds(0.01, 2) == 0.3 and lease_seconds(1.0, 4) == 2.0  # within [0.3 s, 2 s]
