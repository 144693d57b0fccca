"""Membership against real kinship nodes on loopback (no mocks): profiles, join, leave,
wrong key, key rotation without losing members, metadata of 1,000 Local services."""

from __future__ import annotations

import logging
import time

import kinship
import pytest
from inproc_speaker import free_ports
from nocloudlb.membership import (
    PROFILES,
    KeyFileError,
    Membership,
    MembershipSettings,
    generate_key,
    read_key_file,
)

pytestmark = pytest.mark.timeout(60)


def wait_for(pred, timeout: float = 10.0, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"condition not met within {timeout}s")


@pytest.fixture
def cluster_of():
    started: list[Membership] = []

    def make(n: int, keys=None, key_for=None, profile="fast"):
        ports = free_ports(n)
        addrs = [f"127.0.0.1:{p}" for p in ports]
        nodes = []
        for i in range(n):
            k = key_for(i) if key_for else keys
            s = MembershipSettings(name=f"n{i + 1}", bind=addrs[i], join=addrs, keys=k, profile=profile)
            m = Membership(s, on_change=lambda: None, logger=logging.getLogger(f"test.n{i + 1}"))
            m.start({"v": "1"})
            started.append(m)
            nodes.append(m)
        return nodes

    yield make
    for m in started:
        m.leave(timeout=0.5)


def alive_names(m: Membership) -> set[str]:
    return {v.name for v in m.members() if v.state == "alive"}


def test_profiles_build_valid_kinship_configs():
    for profile in PROFILES:
        cfg = MembershipSettings("a", "127.0.0.1:1", profile=profile, keys=[generate_key()]).kinship_config()
        assert cfg.gossip_interval <= cfg.probe_interval
    with pytest.raises(ValueError, match="memberlist.profile: 'slow'"):
        MembershipSettings("a", "127.0.0.1:1", profile="slow").kinship_config()
    cfg = MembershipSettings("a", "127.0.0.1:1", profile="lan", overrides={"probe_interval": 0.3}).kinship_config()
    assert cfg.probe_interval == 0.3 and cfg.gossip_interval == 0.2


def test_key_file(tmp_path):
    k1, k2 = generate_key(), generate_key()
    f = tmp_path / "key"
    f.write_text(f"# gossip keys\n{k1}\n\n{k2}\n")
    assert read_key_file(f) == [k1, k2]
    f.write_text("bm90IGEga2V5\n")
    with pytest.raises(KeyFileError, match=r"line 1: a key is 32 bytes \(base64\), got 9 bytes"):
        read_key_file(f)
    f.write_text("%%%\n")
    with pytest.raises(KeyFileError, match="line 1: not base64"):
        read_key_file(f)
    with pytest.raises(KeyFileError, match="cannot read"):
        read_key_file(tmp_path / "missing")


def test_join_leave_and_metadata(cluster_of):
    key = generate_key()
    a, b, c = cluster_of(3, keys=[key])
    wait_for(lambda: all(alive_names(m) == {"n1", "n2", "n3"} for m in (a, b, c)))
    # the state follows the member events (a thread of its own), so it may lag the member list a moment
    wait_for(lambda: all(m.join_state in ("joined", "alone") for m in (a, b, c)), timeout=5)
    assert not any(m.join_refused for m in (a, b, c))
    b.set_meta({"v": "1", "l": '{"zone":"b"}'})
    wait_for(lambda: next(v for v in a.members() if v.name == "n2").meta.get("l") == '{"zone":"b"}')
    t0 = time.monotonic()
    c.leave(timeout=1.0)
    wait_for(lambda: next((v.state for v in a.members() if v.name == "n3"), None) == "left", timeout=5)
    # a graceful leave is seen far faster than the dead timer of the fast profile (~0.6-0.95 s)
    assert time.monotonic() - t0 < 1.5


def test_wrong_key_cannot_join_and_says_why(cluster_of, caplog):
    good, bad = generate_key(), generate_key()
    caplog.set_level(logging.INFO)
    a, b = cluster_of(2, key_for=lambda i: [good] if i == 0 else [bad])
    wait_for(lambda: b.join_state == "joinFailed", timeout=15)
    assert "gossip key" in b.join_error
    assert alive_names(a) == {"n1"} and alive_names(b) == {"n2"}
    assert any(getattr(r, "event", "") == "memberlistJoinFailed" for r in caplog.records)
    wait_for(lambda: any(getattr(r, "event", "") == "memberlistDecryptFailures" for r in caplog.records), 15)


def test_key_rotation_keeps_membership(cluster_of):
    old, new = generate_key(), generate_key()
    nodes = cluster_of(3, keys=[old])
    wait_for(lambda: all(len(alive_names(m)) == 3 for m in nodes))
    suspects_before = [m.stats()["suspicions"] for m in nodes]
    for step in ([old, new], [new, old], [new]):
        for m in nodes:
            m.set_keys(step)
        time.sleep(0.5)
        assert all(alive_names(m) == {"n1", "n2", "n3"} for m in nodes)
    time.sleep(1.5)  # several probe rounds encrypted with the new key only
    assert all(alive_names(m) == {"n1", "n2", "n3"} for m in nodes)
    assert [m.stats()["suspicions"] for m in nodes] == suspects_before
    assert all(len(m.key_ids()) == 1 for m in nodes)
    # the old key is gone: a node holding only it cannot join any more
    ports = free_ports(1)
    s = MembershipSettings("n9", f"127.0.0.1:{ports[0]}", join=[nodes[0].cluster.local.addr], keys=[old],
                           profile="fast")
    late = Membership(s, on_change=lambda: None)
    late.start({})
    try:
        wait_for(lambda: late.join_state == "joinFailed", timeout=15)
    finally:
        late.leave(timeout=0.2)


def test_rotation_refuses_switch_to_plaintext(cluster_of):
    (a,) = cluster_of(1, keys=[generate_key()])
    with pytest.raises(kinship.KeyringError, match="needs a restart"):
        a.set_keys([])
