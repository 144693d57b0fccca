"""The gossip key file (memberlist.keyFile) as the speaker uses it.

- A config with more than one member and no key file is refused (by ``nocloudlb validate`` and the
  daemon alike), naming the field and why: heartbeats and gossip would be unauthenticated, so two
  forged datagrams could make a node believe it is cut off. A single member may run without one.
- The keyring is read again on SIGHUP and when the file changes (no signal): gossip (kinship's
  keyring) and heartbeats (their HMAC keys) take it together, so a key the file no longer lists
  is refused for heartbeats at once, and a node (re)started at any step of a rotation verifies what
  its peers sign.

The speakers here are real (``inproc_speaker``: real config loading, kinship, heartbeat sockets on
loopback); the datagrams are crafted with the heartbeat module's own ``encode``.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest
import yaml
from inproc_speaker import pool_docs, run_loop, wait_for
from nocloudlb import config
from nocloudlb.config import parse
from nocloudlb.core.errors import ConfigError
from nocloudlb.daemon import validate
from nocloudlb.heartbeat import Packet, derive_keys, encode
from nocloudlb.membership import generate_key


def doc(bind: str = "198.51.100.11:7946", join: list[str] | None = None, key_file: str | None = None) -> dict:
    ml: dict = {"bind": bind, "join": join if join is not None else [bind, "198.51.100.12:7946"], "profile": "fast"}
    if key_file is not None:
        ml["keyFile"] = key_file
    return {"node": {"name": "n1"}, "memberlist": ml, "stateDir": "/tmp/x", "socket": "/tmp/x.sock",
            "metrics": {"bind": ""}, "resources": pool_docs()}


# -- no key file -------------------------------------------------------------------------------

@pytest.mark.parametrize("join", [
    ["198.51.100.11:7946", "198.51.100.12:7946"],  # itself and another
    ["198.51.100.12:7946"],  # another only
    ["198.51.100.11:7947"],  # itself on another port is another member
    ["[2001:db8::12]:7946"],
])
def test_more_than_one_member_without_a_key_file_is_refused_naming_the_field_and_why(join):
    with pytest.raises(ConfigError) as err:
        parse(doc(join=join))
    [text] = [e for e in err.value.errors if "memberlist.keyFile" in e]
    assert "required" in text and "unauthenticated" in text and "heartbeat" in text and "gossip" in text, text
    assert join[-1] in text, text  # the member that makes it a cluster


def test_validate_says_why_a_cluster_needs_a_key_file(tmp_path, capsys):
    from nocloudlb.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc()))
    ok, errors = validate(str(path))
    assert not ok and any("memberlist.keyFile" in e and "unauthenticated" in e for e in errors), errors
    assert main(["validate", str(path)]) == 1
    assert "memberlist.keyFile: required" in capsys.readouterr().err
    key = tmp_path / "memberlist.key"
    key.write_text(generate_key() + "\n")
    path.write_text(yaml.safe_dump(doc(key_file=str(key))))
    assert validate(str(path)) == (True, [])


@pytest.mark.parametrize(("bind", "join"), [
    ("198.51.100.11:7946", []),
    ("198.51.100.11:7946", ["198.51.100.11:7946"]),
    ("[2001:db8::11]:7946", ["[2001:db8:0:0::11]:7946"]),  # the same address written another way
])
def test_a_single_member_may_run_without_a_key(bind, join):
    cfg = parse(doc(bind=bind, join=join))
    assert cfg.key_file is None


# -- the watch on the key file (its stat, polled from the decision loop) ---------------------------

def test_the_watch_sees_a_change_once_the_file_is_stable(tmp_path):
    path = tmp_path / "k"
    path.write_text("a\n")
    w = config.KeyFileWatch(str(path))
    assert not w.changed(0.0) and not w.changed(1.0)  # unchanged
    path.write_text("ab\n")  # in place, another size
    assert not w.changed(2.0)  # seen once: maybe half written
    assert not w.changed(2.1)  # polled too soon: not even looked at
    assert w.changed(3.0)  # the same at the next poll: take it
    w = config.KeyFileWatch(str(path))  # the daemon starts a new watch when it reads the file
    tmp = tmp_path / "k.new"
    tmp.write_text("ab\n")
    os.replace(tmp, path)  # atomic replacement (Ansible's copy): another inode, same size and text
    assert not w.changed(10.0) and w.changed(11.0)
    w = config.KeyFileWatch(str(path))
    path.unlink()
    assert not w.changed(20.0) and w.changed(21.0)  # gone: reported (the daemon keeps its keys and says so)
    w = config.KeyFileWatch(str(path))
    assert not w.changed(30.0) and not w.changed(31.0)  # still gone: nothing new


# -- the running speaker: SIGHUP and file changes --------------------------------------------------

def hb_port(sp) -> int:
    assert sp.heartbeat is not None
    return sp.heartbeat.port


def send_signed(sp, key: str, seq: list[int]) -> None:
    """One heartbeat datagram to ``sp`` from a sender it does not know, signed with ``key``'s HMAC key."""
    seq[0] += 1
    data = encode(Packet("intruder", sp.cfg.node_name, 1, seq[0], 0, 0), derive_keys([key])[0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(data, ("127.0.0.1", hb_port(sp)))


def verdict(sp, key: str, seq: list[int]) -> str:
    """How ``sp`` takes a datagram signed with ``key``: "refused" (bad HMAC) or "authenticated" (its HMAC
    verifies; then only the unknown sender is refused)."""
    before = dict(sp.heartbeat.counters)
    send_signed(sp, key, seq)

    def seen() -> str:
        c = sp.heartbeat.counters
        if c["rejectedAuth"] > before["rejectedAuth"]:
            return "refused"
        if c["rejectedOther"] > before["rejectedOther"]:
            return "authenticated"
        return ""

    return wait_for(seen, 5, f"the heartbeat thread judged a datagram signed with key {key[:6]}...")


def test_sighup_makes_heartbeats_follow_the_key_file_and_refuse_the_retired_key(harness):
    old, new = harness.keys[0], generate_key()
    sp = harness.speaker("n1", pool_docs())
    seq = [0]
    assert verdict(sp, old, seq) == "authenticated"
    assert verdict(sp, new, seq) == "refused"
    # the rotation's three steps, each a SIGHUP with the config file itself unchanged
    harness.set_keys("n1", [old, new])  # 1: new beside old, old signs
    sp.reload()
    assert (verdict(sp, old, seq), verdict(sp, new, seq)) == ("authenticated", "authenticated")
    assert sp.membership.keys == [old, new]
    harness.set_keys("n1", [new, old])  # 2: new signs, old still verifies
    sp.reload()
    assert (verdict(sp, old, seq), verdict(sp, new, seq)) == ("authenticated", "authenticated")
    assert sp.membership.keys == [new, old]
    harness.set_keys("n1", [new])  # 3: old retired
    sp.reload()
    assert (verdict(sp, old, seq), verdict(sp, new, seq)) == ("refused", "authenticated")
    assert sp.membership.keys == [new]


def test_a_key_file_change_without_sighup_is_taken_by_gossip_and_heartbeats(harness, caplog):
    caplog.set_level(logging.INFO)
    old, new = harness.keys[0], generate_key()
    sp = harness.speaker("n1", pool_docs())
    run_loop(sp)
    seq = [0]
    assert verdict(sp, old, seq) == "authenticated"
    t = time.monotonic()
    harness.set_keys("n1", [new])
    wait_for(lambda: sp.membership.keys == [new], 10, "gossip's keyring follows the file")
    took = time.monotonic() - t
    assert (verdict(sp, old, seq), verdict(sp, new, seq)) == ("refused", "authenticated")
    assert took < 5, took  # polled every 0.5 s, taken once stable (about 0.5-2 s)
    assert any(getattr(r, "event", "") == "keyFileChanged" for r in caplog.records)


def test_a_broken_key_file_keeps_the_keys_in_use_and_says_so(harness, caplog):
    caplog.set_level(logging.INFO)
    old = harness.keys[0]
    sp = harness.speaker("n1", pool_docs())
    run_loop(sp)
    seq = [0]
    harness.key_file("n1").write_text("not a key\n")  # no signal: found by the poll
    wait_for(lambda: any(getattr(r, "event", "") == "keyFileRefused" for r in caplog.records), 10,
             "the refusal of the key file logged")
    assert verdict(sp, old, seq) == "authenticated" and sp.membership.keys == [old]
    harness.key_file("n1").unlink()  # and on SIGHUP: the config is refused as stale, keys kept
    res = sp.reload()
    assert not res["ok"] and any("memberlist.keyFile" in e for e in res["config"]["errors"]), res
    assert verdict(sp, old, seq) == "authenticated" and sp.membership.keys == [old]
