"""Direct heartbeats (speaker/nocloudlb/heartbeat.py): packet auth and parsing, replay refusal,
profile validation, and the suspicion rule with real UDP sockets on loopback."""

from __future__ import annotations

import socket
import time

import pytest
from inproc_speaker import free_ports
from nocloudlb.config import parse
from nocloudlb.heartbeat import (
    MAX_PACKET,
    Heartbeat,
    Packet,
    PacketError,
    check_settings,
    decode,
    derive_keys,
    encode,
)
from nocloudlb.membership import PROFILES, MembershipSettings, generate_key

K1, K2 = generate_key(), generate_key()


def pkt(**kw) -> Packet:
    base = dict(sender="n1", recipient="n2", boot=7, seq=1, suspicions=0, meta_seq=1)
    base.update(kw)
    return Packet(**base)


def test_packet_roundtrip_with_flags_and_meta():
    key = derive_keys([K1])[0]
    p = pkt(suspect_you=True, meta={"l": '{"a":"b"}', "v": "1"}, suspicions=3, meta_seq=9, missing=("n3", "n4"))
    assert decode(encode(p, key), [key]) == p
    q = pkt()
    assert decode(encode(q, key), [key]) == q


def test_any_key_of_the_ring_verifies_and_another_key_is_refused():
    k1, k2 = derive_keys([K1, K2])
    data = encode(pkt(), k2)
    assert decode(data, [k1, k2]).sender == "n1"  # rotation: the second key of the ring verifies
    with pytest.raises(PacketError, match="HMAC"):
        decode(data, [k1])
    with pytest.raises(PacketError, match="HMAC"):
        decode(encode(pkt(), derive_keys(None)[0]), [k1])  # an unkeyed sender in a keyed cluster


@pytest.mark.parametrize("where", [0, 5, 10, 20, -1])
def test_any_flipped_bit_is_refused(where):
    key = derive_keys([K1])[0]
    data = bytearray(encode(pkt(meta={"x": "y"}), key))
    data[where] ^= 0x01
    with pytest.raises(PacketError):
        decode(bytes(data), [key])


def test_garbage_and_truncation_are_refused_not_raised():
    key = derive_keys([K1])[0]
    good = encode(pkt(meta={"x": "y"}), key)
    for data in (b"", b"NLH1", b"x" * 64, good[:-1], good[:20], b"NLH1" + b"\xff" * 3000):
        with pytest.raises(PacketError):
            decode(data, [key])
    # a correctly signed but malformed body (trailing bytes) is refused too
    import hashlib
    import hmac

    body = good[:-16] + b"junk"
    with pytest.raises(PacketError, match="trailing"):
        decode(body + hmac.new(key, body, hashlib.sha256).digest()[:16], [key])


def test_settings_validation_names_field_and_value():
    assert check_settings(0.025, 4, 1, 0.6) == []
    assert "memberlist.heartbeatInterval: 0.001" in check_settings(0.001, 4, 1)[0]
    assert "memberlist.heartbeatInterval: 'x'" in check_settings("x", 4, 1)[0]
    assert "memberlist.heartbeatMiss: 1" in check_settings(0.1, 1, 1)[0]
    assert "memberlist.heartbeatMiss: 2.5" in check_settings(0.1, 2.5, 1)[0]
    assert "memberlist.heartbeatPortOffset: -1" in check_settings(0.1, 3, -1)[0]
    err = check_settings(0.5, 4, 1, 1.5)
    assert len(err) == 1 and "2 s must be shorter than gossip's" in err[0], err


def test_every_profile_validates_and_overrides_are_checked():
    for name in PROFILES:
        s = MembershipSettings("a", "127.0.0.1:7946", profile=name)
        s.kinship_config()
        interval, miss, offset = s.heartbeat()
        assert miss >= 2 and offset >= 1 and interval * miss < 1.0
    fast = MembershipSettings("a", "127.0.0.1:7946", profile="fast").heartbeat()
    lan = MembershipSettings("a", "127.0.0.1:7946", profile="lan").heartbeat()
    assert fast[0] * fast[1] < lan[0] * lan[1]  # the trade-off: fast suspects sooner
    with pytest.raises(ValueError, match="memberlist.heartbeatMiss: 1 "):
        MembershipSettings("a", "127.0.0.1:7946", profile="fast", overrides={"heartbeat_miss": 1}).kinship_config()


def config_doc(**ml):
    memberlist = {"bind": "198.51.100.11:7946", "join": [], "profile": "fast", **ml}
    return {"node": {"name": "n1"}, "memberlist": memberlist, "resources": []}


def test_config_file_refuses_bad_heartbeat_timings_naming_the_field():
    from nocloudlb.core.errors import ConfigError

    cfg = parse(config_doc(heartbeatInterval=0.05, heartbeatMiss=3))
    assert cfg.overrides["heartbeat_interval"] == 0.05
    for bad, field in (({"heartbeatMiss": 1}, "memberlist.heartbeatMiss: 1 "),
                       ({"heartbeatInterval": 0.001}, "memberlist.heartbeatInterval: 0.001"),
                       ({"heartbeatInterval": 0.3, "heartbeatMiss": 4}, "heartbeatInterval x heartbeatMiss"),
                       ({"heartbeatPortOffset": 5000}, "memberlist.heartbeatPortOffset: 5000")):
        with pytest.raises(ConfigError) as info:
            parse(config_doc(**bad))
        assert any(e.startswith(field) or field in e for e in info.value.errors), info.value.errors


# -- the rule, with real sockets ---------------------------------------------------------------

def wait_for(pred, timeout=5.0, what=""):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    raise AssertionError(f"timed out: {what}")


@pytest.fixture
def trio():
    names = ["n1", "n2", "n3"]
    ports = dict(zip(names, free_ports(3), strict=True))
    hbs = {n: Heartbeat(n, "127.0.0.1", ports[n], [K1], 0.02, 4) for n in names}
    for hb in hbs.values():
        hb.start()

    def connect(exclude: set[str] = frozenset(), states: dict | None = None):
        for n, hb in hbs.items():
            hb.set_peers({m: (("127.0.0.1", ports[m]), (states or {}).get(m, "alive"))
                          for m in names if m != n and m not in exclude})

    connect()
    yield hbs, ports, connect
    for hb in hbs.values():
        hb.close()


def test_a_silent_member_is_suspected_by_the_others_and_is_cut_off_itself(trio):
    hbs, _ports, _connect = trio

    def everyone_heard() -> bool:
        return all(hb.status()["peers"] and all(p["heardMsAgo"] is not None for p in hb.status()["peers"].values())
                   for hb in hbs.values())

    wait_for(everyone_heard, what="everyone heard")
    assert all(not hb.view().suspected for hb in hbs.values())
    hbs["n1"]._sock.close()  # n1 neither sends nor receives any more (its thread survives the error)
    wait_for(lambda: hbs["n2"].view().suspected == {"n1"} and hbs["n3"].view().suspected == {"n1"},
             what="n2 and n3 suspect n1")
    wait_for(lambda: hbs["n1"].view().cut_off, what="n1 cut off")
    # it cannot tell their death from its isolation: it keeps what it holds (nobody to yield to that it
    # could hear), has no quorum, so takes nothing; the others keep quorum (two of three)
    assert hbs["n1"].view().suspecters == frozenset()
    assert not hbs["n1"].view().quorum
    assert hbs["n2"].view().quorum and hbs["n3"].view().quorum
    assert not hbs["n1"].view().suspected  # and grabs nothing
    assert hbs["n2"].view().suspecters == frozenset()
    # its own gossip comes to suspect them too (it hears nobody): still cut off, still grabs nothing
    # (a node that suspected them here took every VIP an isolated node cannot serve: two owners)
    hbs["n1"].set_peers({m: (("127.0.0.1", 1), "suspect") for m in ("n2", "n3")})
    time.sleep(0.3)
    assert hbs["n1"].view().cut_off and not hbs["n1"].view().suspected


def test_a_member_hears_that_it_is_suspected_and_hears_the_suspicion_end(trio):
    hbs, ports, _connect = trio
    wait_for(lambda: all(len(hb.view().suspected) == 0 and hb.counters["received"] > 10 for hb in hbs.values()))
    # nobody hears n1 any more (its packets go to dead ports) while n1 hears them: both suspect n1
    # (each confirms the other's miss), n1 learns it from their packets and is not cut off
    hbs["n1"].set_peers({m: (("127.0.0.1", free_ports(1)[0]), "alive") for m in ("n2", "n3")})
    wait_for(lambda: hbs["n2"].view().suspected == {"n1"} == hbs["n3"].view().suspected, what="n1 suspected")
    wait_for(lambda: hbs["n1"].view().suspecters == {"n2", "n3"}, what="n1 knows they suspect it")
    assert not hbs["n1"].view().cut_off and not hbs["n1"].view().suspected
    hbs["n1"].set_peers({m: (("127.0.0.1", ports[m]), "alive") for m in ("n2", "n3")})
    wait_for(lambda: not hbs["n2"].view().suspected and not hbs["n1"].view().suspecters, what="healed")


def test_one_silent_path_alone_suspects_nobody(trio):
    """n2 stops hearing n1 but n3 still hears it: no second opinion, so no suspicion (lost packets on
    one path, or n2's own trouble, move nothing); n2 tells the others it misses n1."""
    hbs, ports, _connect = trio
    wait_for(lambda: all(hb.counters["received"] > 10 for hb in hbs.values()))
    hbs["n1"].set_peers({"n2": (("127.0.0.1", free_ports(1)[0]), "alive"),
                         "n3": (("127.0.0.1", ports["n3"]), "alive")})
    wait_for(lambda: "n1" in hbs["n3"]._peers["n2"].missing, what="n2 says it misses n1")
    time.sleep(0.3)
    assert hbs["n2"].view().suspected == frozenset() and hbs["n3"].view().suspected == frozenset()
    assert hbs["n1"].view().suspecters == frozenset()
    # once gossip suspects n1 too, n2 acts on its own miss
    hbs["n2"].set_peers({"n1": (("127.0.0.1", ports["n1"]), "suspect"),
                         "n3": (("127.0.0.1", ports["n3"]), "alive")})
    wait_for(lambda: hbs["n2"].view().suspected == {"n1"}, what="suspected with gossip")


def test_two_nodes_suspect_only_with_gossip(trio):
    hbs, ports, _connect = trio
    hbs["n3"].close()
    for n, other in (("n1", "n2"), ("n2", "n1")):
        hbs[n].set_peers({other: (("127.0.0.1", ports[other]), "alive")})
    wait_for(lambda: hbs["n1"].counters["received"] > 5)
    hbs["n2"]._sock.close()
    time.sleep(0.3)
    assert hbs["n1"].view().suspected == frozenset()  # alone with n2: its own link may be the dead one
    assert not hbs["n1"].view().cut_off
    hbs["n1"].set_peers({"n2": (("127.0.0.1", ports["n2"]), "suspect")})  # gossip agrees
    wait_for(lambda: hbs["n1"].view().suspected == {"n2"}, what="suspected once gossip suspects")


def test_replayed_packets_are_refused(trio):
    hbs, ports, _connect = trio
    wait_for(lambda: hbs["n1"].counters["received"] > 5)
    key = derive_keys([K1])[0]
    hb = hbs["n1"]
    peer = hb._peers["n2"]
    old = encode(Packet("n2", "n1", peer.boot, peer.seq, 0, 0, suspect_you=True), key)
    before = hb.counters["rejectedReplay"]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(old, ("127.0.0.1", ports["n1"]))
    wrong = encode(Packet("n2", "n1", peer.boot, peer.seq + 10**6, 0, 0), derive_keys([K2])[0])
    s.sendto(wrong, ("127.0.0.1", ports["n1"]))
    s.close()
    wait_for(lambda: hb.counters["rejectedReplay"] > before and hb.counters["rejectedAuth"] >= 1)
    assert hb.view().suspecters == frozenset()  # the replayed "I suspect you" changed nothing


def test_meta_is_pushed_at_once_and_only_the_latest_counts(trio):
    hbs, _ports, _connect = trio
    wait_for(lambda: hbs["n2"].counters["received"] > 5)
    hbs["n1"].set_meta({"l": '{"drain":""}'})
    wait_for(lambda: hbs["n2"].view().metas.get("n1") == {"l": '{"drain":""}'}, timeout=1.0, what="meta pushed")
    hbs["n1"].set_meta({"l": "{}"})
    wait_for(lambda: hbs["n3"].view().metas.get("n1") == {"l": "{}"}, timeout=1.0, what="second meta")


def test_packet_rate_is_members_over_interval(trio):
    hbs, _ports, _connect = trio
    hb = hbs["n1"]
    time.sleep(0.2)
    a = hb.counters["sent"]
    time.sleep(1.0)
    rate = hb.counters["sent"] - a
    # 2 peers every 20 ms: about 100 per second; wide margins (a loaded machine sends fewer)
    assert 30 <= rate <= 130, rate


# -- the cost: one wake-up per interval when nothing happens ---------------------------------------

def unstarted(name: str, port: int, interval: float = 0.1) -> Heartbeat:
    """A Heartbeat with its sockets as start() makes them, and no thread reading them."""
    hb = Heartbeat(name, "127.0.0.1", port, [K1], interval, 4)
    hb._io.sock = hb._io.open_one(reuseport=True)
    hb._io.news = hb._io.split() if hb._io.stamped else None
    return hb


def test_routine_datagrams_and_news_reach_different_sockets():
    """The reuseport program steers "alive, nothing new" to the socket read at ticks and anything else
    (a suspicion, a miss, a meta) to the one read at once; every kind still verifies and decodes."""
    port = free_ports(1)[0]
    hb = unstarted("n1", port)
    try:
        assert hb._io.stamped and hb._io.news is not None, "this kernel takes the steering program"
        key = derive_keys([K1])[0]
        sent = {
            "routine": encode(pkt(sender="n2", recipient="n1"), key),
            "suspect": encode(pkt(sender="n2", recipient="n1", seq=2, suspect_you=True), key),
            "missing": encode(pkt(sender="n2", recipient="n1", seq=3, missing=("n3",)), key),
            "meta": encode(pkt(sender="n2", recipient="n1", seq=4, meta={"l": "{}"}), key),
            "long-names": encode(pkt(sender="a" * 200, recipient="n1", seq=5), key),
            "long-missing": encode(pkt(sender="a" * 200, recipient="b" * 50, seq=6, missing=("c" * 90,)), key),
        }
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for data in sent.values():
            s.sendto(data, ("127.0.0.1", port))
        s.close()
        time.sleep(0.1)

        def drain(sock: socket.socket) -> list[bytes]:
            out = []
            while True:
                try:
                    out.append(sock.recv(4096, socket.MSG_DONTWAIT))
                except BlockingIOError:
                    return out

        routine, news = drain(hb._io.sock), drain(hb._io.news)
        assert routine == [sent["routine"], sent["long-names"]]
        assert news == [sent["suspect"], sent["missing"], sent["meta"], sent["long-missing"]]
        for data in routine + news:
            decode(data, [key])
    finally:
        hb.close()


def test_heard_is_the_arrival_time_not_the_read_time():
    """A routine datagram read a tick later counts from when it arrived: no timeout moves."""
    p1, p2 = free_ports(2)
    hb = unstarted("n1", p1)
    try:
        hb.set_peers({"n2": (("127.0.0.1", p2), "alive")})
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(encode(pkt(sender="n2", recipient="n1"), derive_keys([K1])[0]), ("127.0.0.1", p1))
        s.close()
        sent = time.monotonic()
        time.sleep(0.15)
        hb._receive_all()
        assert hb.counters["received"] == 1
        assert abs(hb._peers["n2"].heard - sent) < 0.05, "heard when read, not when it arrived"
    finally:
        hb.close()


def test_a_quiet_node_wakes_about_once_an_interval(trio_slow):
    """Three nodes hearing each other: each thread wakes for its sends (the routine datagrams wait for
    them), not once more per datagram received (three wake-ups an interval before)."""
    hbs, counts = trio_slow
    wait_for(lambda: all(hb._quiet for hb in hbs.values()), what="quiet")
    before = dict(counts)
    sent = {n: hb.counters["sent"] for n, hb in hbs.items()}
    time.sleep(2.0)
    for n, hb in hbs.items():
        ticks = (hb.counters["sent"] - sent[n]) / 2  # two peers: two datagrams a tick
        wakes = counts[n] - before[n]
        assert ticks >= 10 and wakes < 2.2 * ticks, (n, wakes, ticks)
    assert all(not hb.view().suspected for hb in hbs.values())


@pytest.fixture
def trio_slow(monkeypatch):
    import threading

    from nocloudlb import heartbeat as hbmod

    counts: dict[str, int] = {"n1": 0, "n2": 0, "n3": 0}
    real = hbmod.select.select
    local = threading.local()

    class Select:
        @staticmethod
        def select(*args):
            name = getattr(local, "name", None)
            if name is not None:
                counts[name] += 1
            return real(*args)

    monkeypatch.setattr(hbmod, "select", Select)
    names = ["n1", "n2", "n3"]
    ports = dict(zip(names, free_ports(3), strict=True))
    hbs = {n: Heartbeat(n, "127.0.0.1", ports[n], [K1], 0.1, 4) for n in names}
    for n, hb in hbs.items():
        run = hb._run

        def named(run=run, n=n):
            local.name = n
            run()

        hb._run = named  # type: ignore[method-assign]
        hb.start()
    for n, hb in hbs.items():
        hb.set_peers({m: (("127.0.0.1", ports[m]), "alive") for m in names if m != n})
    yield hbs, counts
    for hb in hbs.values():
        hb.close()


def test_the_precomputed_hmac_is_hmac_sha256():
    import hashlib
    import hmac

    from nocloudlb.heartbeat import _mac

    for key in (b"", derive_keys([K1])[0], b"k" * 64, b"x" * 100):
        for body in (b"", b"NLH2" + bytes(range(200)), b"y" * 1000):
            assert _mac(key).tag(body) == hmac.new(key, body, hashlib.sha256).digest()[:16]


def test_a_routine_datagram_is_taken_by_the_fast_path_and_anything_else_by_decode():
    port = free_ports(1)[0]
    hb = Heartbeat("n1", "127.0.0.1", port, [K1], 0.1, 4)
    key = derive_keys([K1])[0]
    routine = encode(pkt(sender="n2", recipient="n1", seq=9, suspicions=3, meta_seq=4), key)
    assert hb._reader.routine(routine) == decode(routine, [key])
    for other in (encode(pkt(sender="n2", recipient="n1", suspect_you=True), key),
                  encode(pkt(sender="n2", recipient="n1", missing=("n3",)), key),
                  encode(pkt(sender="n2", recipient="n3"), key),  # to another node
                  encode(pkt(sender="n2", recipient="n1"), derive_keys([K2])[0]),  # another key
                  routine[:-1] + bytes([routine[-1] ^ 1]), routine[:10], b"",
                  b"NLH2\x00\x00" + routine[6:], b"NLH2\x00\xff" + routine[6:]):  # empty, overlong sender
        assert hb._reader.routine(other) is None


def everyone_heard(hb: Heartbeat) -> bool:
    peers = hb.status()["peers"]
    return bool(peers) and all(p["heardMsAgo"] is not None and p["hearsMe"] for p in peers.values())


# -- when nodes disagree: hearing is not being heard, quorum, bounded datagrams, rejections by reason --------
def test_flags_for_quorum_deafness_and_cut_lists_roundtrip():
    key = derive_keys([K1])[0]
    p = decode(encode(pkt(missing=("n3",)), key, no_quorum=True, deaf=True), [key])
    assert p.no_quorum and p.deaf and not p.partial and p.missing == ("n3",)
    q = decode(encode(pkt(), key), [key])
    assert not q.no_quorum and not q.deaf


@pytest.mark.parametrize("members", [10, 100, 1000])
def test_a_datagram_never_exceeds_the_receive_limit_whatever_is_missing(members):
    """1,000 missing members with 63-byte names (and long own names, and a meta): the datagram stays
    within MAX_PACKET and decodes; the list is cut (F_PARTIAL) and rotates so every name travels."""
    key = derive_keys([K1])[0]
    names = tuple(sorted(f"{i:04d}-" + "x" * 58 for i in range(members)))
    assert all(len(n) == 63 for n in names)
    seen: set[str] = set()
    for seq in range(1, 400):
        p = pkt(sender="s" * 255, recipient="r" * 255, seq=seq, missing=names, meta={"m": "v" * 400})
        data = encode(p, key)
        assert len(data) <= MAX_PACKET
        got = decode(data, [key])
        assert set(got.missing) <= set(names)
        assert got.partial == (members > 15)
        seen |= set(got.missing)
    assert seen == set(names)


def test_a_meta_too_large_for_the_datagram_is_left_to_gossip():
    key = derive_keys([K1])[0]
    data = encode(pkt(meta={"m": "v" * 3000}), key)
    assert len(data) <= MAX_PACKET and decode(data, [key]).meta is None


def test_inbound_loss_is_told_apart_from_a_cut(trio):
    """n1 stops *receiving* (an inbound filter): it hears nobody, while n2 and n3 still hear it. n1 says
    so in the datagrams it still sends (F_DEAF, F_NO_QUORUM): the others know it is deaf and without
    quorum (they leave it out of the election), they keep quorum, and nobody suspects anybody."""
    hbs, ports, connect = trio
    wait_for(lambda: all(everyone_heard(hb) for hb in hbs.values()), what="everyone heard")
    assert all(hb.view().quorum for hb in hbs.values())
    deaf = hbs["n1"]
    # n1's sockets stop reading: what others send it goes nowhere (like an inbound drop rule)
    deaf._receive_all = lambda routine=True, news=True: None  # type: ignore[method-assign]
    wait_for(lambda: not deaf.view().quorum, what="n1 loses quorum")
    wait_for(lambda: hbs["n2"].view().no_quorum == {"n1"} and hbs["n3"].view().no_quorum == {"n1"},
             what="n2 and n3 know n1 has no quorum")
    assert hbs["n2"].view().deaf_to == {"n1"} and hbs["n2"].view().quorum and hbs["n3"].view().quorum
    assert not hbs["n2"].view().suspected and not hbs["n3"].view().suspected  # n1 is heard: nobody suspected
    assert deaf.view().suspecters == frozenset() and not deaf.view().suspected


def test_a_node_alone_of_three_configured_has_no_quorum_until_it_hears_a_peer():
    """An isolated boot: configured for three, nobody heard: no quorum (it takes nothing)."""
    (port,) = free_ports(1)
    hb = Heartbeat("n1", "127.0.0.1", port, [K1], 0.02, 4)
    hb.set_quorum_basis(3, 1)
    hb.start()
    try:
        hb.set_peers({})
        time.sleep(0.2)
        assert not hb.view().quorum and hb.view().total == 3
        hb.set_quorum_basis(1, 1)  # a cluster of one has quorum alone
        wait_for(lambda: hb.view().quorum, what="quorum alone in a one-member cluster")
    finally:
        hb.close()


def test_a_witness_is_one_vote_more():
    (port,) = free_ports(1)
    hb = Heartbeat("n1", "127.0.0.1", port, [K1], 0.02, 4)
    answers = {"up": False}
    hb.set_quorum_basis(2, 2)
    hb.set_witness(lambda: answers["up"])
    hb.start()
    try:
        hb.set_peers({})  # the other node of two is gone
        time.sleep(0.2)
        assert not hb.view().quorum and hb.view().total == 3
        answers["up"] = True
        hb.witness_changed()
        wait_for(lambda: hb.view().quorum, what="quorum with the witness")
        assert hb.view().votes == 2
    finally:
        hb.close()


def test_rejected_datagrams_are_counted_by_reason(trio):
    hbs, ports, _connect = trio
    wait_for(lambda: all(everyone_heard(hb) for hb in hbs.values()), what="everyone heard")
    target = hbs["n2"]
    old = derive_keys([K2])[0]
    target.set_keys([K1])  # K2 was never in the ring: a bad MAC
    target._reader.retired = [old]  # as if K2 had been retired by a rotation
    key = derive_keys([K1])[0]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        dest = ("127.0.0.1", ports["n2"])
        s.sendto(encode(pkt(sender="n1", recipient="n2", boot=1, seq=1), key), dest)
        s.sendto(b"x" * (MAX_PACKET + 10), dest)
        s.sendto(b"garbage", dest)
        s.sendto(encode(pkt(sender="n1", recipient="n2", seq=1), old), dest)
        s.sendto(encode(pkt(sender="zz", recipient="n2", seq=1), key), dest)
        s.sendto(encode(pkt(sender="n1", recipient="n9", seq=1), key), dest)
        want = {"tooLong", "notHeartbeat", "retiredKey", "unknownSender", "notForMe", "oldBoot"}
        deadline = time.monotonic() + 3
        while not want <= set(target.status()["rejected"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert want <= set(target.status()["rejected"]), target.status()["rejected"]
    finally:
        s.close()
    assert target.view().quorum and not target.view().suspected  # nothing a datagram said changed its mind


def test_a_starting_speaker_never_counts_itself_a_majority_of_one(harness):
    """The heartbeats know the configured members from the start (daemon ``_start_heartbeat``): a node
    whose join list names two peers that are not there yet has no quorum from its first view on. Before,
    it counted 1 of 1 until gossip's first member list, "gained" quorum, lost it, and its next gain armed
    the settling of a quorum gained back (l2/disagree.py), which held a takeover soon after start for up
    to 1 s (a SIGTERM's successor, tests/netns/test_speaker_cluster.py)."""
    from inproc_speaker import pool_docs, service_doc

    sp = harness.speaker("n1", pool_docs() + [service_doc("svc0", ["198.51.100.200"])], join=["n2", "n3"])
    hb = sp.rt.heartbeat
    assert hb is not None
    seen = []
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        view = hb.view()
        seen.append((view.quorum, view.total))
        time.sleep(0.005)
    assert not any(quorum for quorum, _total in seen), sorted(set(seen))
    assert seen[-1] == (False, 3), seen[-1]  # (the view before its first computation says total 1, no quorum)
