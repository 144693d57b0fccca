"""Issue 10 (scale), the announcer's scheduler: a takeover's first gratuitous round goes before any
queued re-announcement, and a full re-announcement queue never drops it. No sockets: the interface
is a recorder, the scheduler's own methods run as its event loop would run them."""

from __future__ import annotations

import ipaddress
import logging
import time

from nocloudlb.l2.announcer import L2Announcer
from nocloudlb.l2.tables import Iface

MAC = bytes.fromhex("020000000001")


class RecordingSock:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, frame: bytes) -> int:
        self.sent.append(frame)
        return len(frame)

    def close(self) -> None:
        pass


def announcer(**kw) -> tuple[L2Announcer, RecordingSock]:
    a = L2Announcer("n1", logging.getLogger("test"), registry=None, garp_rounds=1, **kw)
    sock = RecordingSock()
    a._links.ifaces["eth0"] = Iface("eth0", 2, MAC, sock)  # type: ignore[arg-type]
    a._links.eligible = ["eth0"]
    return a, sock


def drain(a: L2Announcer, tokens: float = 1e6) -> None:
    with a._lock:
        a._lifecycle.run_timers()
        for _round in range(200):
            a._links.ifaces["eth0"].tokens = tokens
            a._links.ifaces["eth0"].refilled = time.monotonic()  # no refill beyond what the test grants
            a._pacer.transmit()


def sent_ips(sock: RecordingSock) -> list[str]:
    """The sender address of each gratuitous ARP sent, in order (one per frame)."""
    return [str(ipaddress.ip_address(f[28:32])) for f in sock.sent]


def ips(first: int, n: int) -> list[str]:
    return [f"198.51.100.{i}" for i in range(first, first + n)]


def test_takeover_frames_go_before_a_queued_reannouncement():
    a, sock = announcer(burst=100000)
    old = ips(1, 60)
    a.set_announced(dict.fromkeys(old, []), skip_check=old)
    drain(a)
    assert set(sent_ips(sock)) == set(old)
    sock.sent.clear()
    # a re-announcement of everything led is queued, then a takeover arrives before it has left
    assert a.reannounce(old) == old
    with a._lock:
        a._lifecycle.run_timers()  # the re-announcement's frames are queued, none sent (no tokens granted)
    assert len(a._links.ifaces["eth0"].queue) == 2 * len(old) and not sock.sent
    new = ips(100, 40)
    a.set_announced(dict.fromkeys(old + new, []), skip_check=new)
    drain(a)
    order = sent_ips(sock)
    assert len(order) == 2 * (len(old) + len(new)), len(order)
    first_old = min(i for i, ip in enumerate(order) if ip in old)
    last_new = max(i for i, ip in enumerate(order) if ip in new)
    assert last_new < first_old, "a re-announcement frame left before the takeover's frames"
    assert a.stats()["queued"] == {"eth0": 0}


def test_a_takeover_displaces_queued_reannouncements_in_a_full_queue():
    a, sock = announcer(burst=100000, max_queue=64)
    old = ips(1, 32)
    a.set_announced(dict.fromkeys(old, []), skip_check=old)
    drain(a)
    sock.sent.clear()
    a.reannounce(old)
    with a._lock:
        a._lifecycle.run_timers()
    assert len(a._links.ifaces["eth0"].queue) == 64  # the queue is full of re-announcement frames
    new = ips(100, 30)  # 60 takeover frames
    a.set_announced(dict.fromkeys(old + new, []), skip_check=new)
    assert a.stats()["queued"]["eth0"] <= 64
    drain(a)
    assert sum(1 for ip in sent_ips(sock) if ip in new) == 2 * len(new)  # every takeover frame left
    assert a._links.ifaces["eth0"].dropped >= 60  # re-announcement frames made room for them


def test_pacing_holds_for_takeovers_too():
    """Urgent frames share the token bucket: one pass with 10 tokens sends 10 frames, takeovers first."""
    a, sock = announcer(burst=10, rate=1)
    new = ips(1, 30)
    a.set_announced(dict.fromkeys(new, []), skip_check=new)
    with a._lock:
        a._lifecycle.run_timers()
        a._links.ifaces["eth0"].tokens = 10.0
        a._links.ifaces["eth0"].refilled = time.monotonic()
        a._pacer.transmit()
    assert len(sock.sent) == 10


def test_ipv6_joins_take_a_fraction_of_a_token_so_a_takeover_s_nas_are_not_held_behind_them():
    """3,300 IPv6 VIPs taken over queue 3,300 solicited-node joins before their first NA; at one token a
    join the first NA left after 0.66 s of tokens (5,000/s). The kernel packs the joins' MLD records
    into a few reports, so a join takes MCAST_COST of a token: with as many tokens as VIPs (+ the joins'
    share), every VIP's NA leaves in the same pass."""
    a, sock = announcer(burst=100000)
    a._groups.reconcile = lambda iface, group: True  # type: ignore[method-assign] # no kernel groups here
    v6 = [str(ipaddress.IPv6Address("2001:db8:100::1") + i) for i in range(64)]
    a.set_announced(dict.fromkeys(v6, []), skip_check=v6)
    with a._lock:
        a._lifecycle.run_timers()
        iface = a._links.ifaces["eth0"]
        iface.tokens, iface.refilled = 64 + 4.5, time.monotonic()  # the 64 joins fit in 4 tokens
        a._pacer.transmit()
    assert iface.sent["mcast"] == 64
    assert len(sock.sent) == 64, f"{len(sock.sent)} NAs left: the joins took the tokens"
