"""Connection sync (dataplane/connsync.py): the config section, the bounded commit, the health of
conntrackd and its peer, the status line and metrics, and layer 2's hook before a takeover announces.

A stand-in ``conntrackd`` (a shell script) plays the client: it answers, fails, hangs or prints
garbage as each test asks. The real conntrackd is exercised in tests/netns/test_connsync_speaker.py.
"""

from __future__ import annotations

import os
import stat
import time

import pytest
from inproc_speaker import Journal, RecordingAnnouncer, RecordingDelivery, pool_docs, service_doc
from nocloudlb.config import ConfigError, parse
from nocloudlb.core.election import NodeView
from nocloudlb.core.schema import ConnectionSync, parse_connection_sync, parse_resources
from nocloudlb.dataplane import connsync
from nocloudlb.dataplane.connsync import ConnSync, client_conf, received_packets
from nocloudlb.l2.mode import L2Mode
from nocloudlb.modes import ModeRunner
from nocloudlb.modeset import ModeSet
from nocloudlb.runtime import Runtime
from nocloudlb.statusview import connsync_text
from prometheus_client import CollectorRegistry, generate_latest

pytestmark = pytest.mark.timeout(60)

STATS = """UDP traffic (active device=sync0):
                  40 Bytes sent                   40 Bytes recv
                   3 Pckts sent                  {recv} Pckts recv
                   0 Error send                    0 Error recv
"""


def fake(tmp_path, body: str) -> str:
    """A stand-in conntrackd: ``body`` is shell run with the arguments in "$@"; every call is logged."""
    path = tmp_path / "conntrackd"
    path.write_text(f"#!/bin/sh\necho \"$$ $*\" >> {tmp_path}/calls\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def sync_with(tmp_path, body: str, timeout: float = 0.3) -> ConnSync:
    s = ConnSync(ConnectionSync(enabled=True, socket="/run/ct.ctl", binary=fake(tmp_path, body),
                                commit_timeout=timeout), str(tmp_path / "state"), registry=None)
    os.makedirs(tmp_path / "state", exist_ok=True)
    (tmp_path / "state" / "conntrackd-client.conf").write_text(client_conf("/run/ct.ctl"))
    return s


# -- the config section ---------------------------------------------------------------------
def test_absent_is_off_and_defaults_are_documented():
    assert parse_connection_sync(None) == (ConnectionSync(), [])
    got, errors = parse_connection_sync({"enabled": True})
    assert errors == [] and got.enabled and got.commit_timeout == 0.3 and got.socket == "/var/run/conntrackd.ctl"


@pytest.mark.parametrize(("raw", "error"), [
    ([1], "connectionSync: must be a mapping"),
    ({"enabled": "yes"}, 'connectionSync.enabled: "yes" must be true or false'),
    ({"socket": "run/ct.ctl"}, 'connectionSync.socket: "run/ct.ctl" must be an absolute path'),
    ({"binary": 3}, 'connectionSync.binary: "3" must be an absolute path'),
    ({"commitTimeout": 0}, 'connectionSync.commitTimeout: "0" must be a number of seconds from 0.01 to 5.0'),
    ({"commitTimeout": True}, 'connectionSync.commitTimeout: "True" must be'),
    ({"comitTimeout": 1}, 'connectionSync: unknown key "comitTimeout" (known: binary, commitTimeout, enabled, socket)'),
])
def test_bad_fields_and_values_are_named(raw, error):
    _got, errors = parse_connection_sync(raw)
    assert any(e.startswith(error) for e in errors), errors


def test_the_speaker_config_carries_it_and_refuses_a_bad_one():
    base = {"node": {"name": "n1"}, "memberlist": {"bind": "198.51.100.11:7946", "join": []}}
    cfg = parse({**base, "connectionSync": {"enabled": True, "commitTimeout": 0.5}})
    assert cfg.connection_sync.enabled and cfg.connection_sync.commit_timeout == 0.5
    assert parse(base).connection_sync == ConnectionSync()
    with pytest.raises(ConfigError) as exc:
        parse({**base, "connectionSync": {"enabled": 1}})
    assert 'connectionSync.enabled: "1" must be true or false' in str(exc.value)


# -- the commit -----------------------------------------------------------------------------
def test_a_commit_runs_conntrackd_c_with_the_client_config(tmp_path):
    s = sync_with(tmp_path, "exit 0")
    last = s.commit(["198.51.100.200"])
    assert last["result"] == "ok" and last["vips"] == ["198.51.100.200"] and last["seconds"] < 0.3
    call = (tmp_path / "calls").read_text().split()
    assert call[1:] == ["-C", str(tmp_path / "state" / "conntrackd-client.conf"), "-c"]
    assert s.commits["ok"] == 1


def test_a_failing_commit_is_recorded_with_its_output(tmp_path):
    s = sync_with(tmp_path, "echo can\\'t connect: is conntrackd running; exit 1")
    last = s.commit(["198.51.100.200"])
    assert last["result"] == "failed" and "exit 1" in last["detail"] and "is conntrackd running" in last["detail"]


def test_a_hanging_commit_is_killed_at_the_timeout(tmp_path):
    s = sync_with(tmp_path, "exec sleep 30", timeout=0.2)
    t0 = time.monotonic()
    last = s.commit(["198.51.100.200"])
    took = time.monotonic() - t0
    assert last["result"] == "timeout" and 0.2 <= took < 0.6, (last, took)
    pid = int((tmp_path / "calls").read_text().split()[0])  # the client itself (exec keeps the PID)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


def test_a_daemon_that_missed_its_health_checks_is_not_waited_for(tmp_path):
    s = sync_with(tmp_path, "exec sleep 30", timeout=0.2)  # hangs: every health check and commit
    for n in range(1, connsync.SKIP_AFTER + 1):
        s.poll(now=float(n))  # each one a second's wait, then no answer
    calls = len((tmp_path / "calls").read_text().splitlines())
    t0 = time.monotonic()
    last = s.commit(["198.51.100.200"])
    took = time.monotonic() - t0
    assert last["result"] == "skipped" and took < 0.05, (last, took)
    assert f"missed its last {connsync.SKIP_AFTER} health checks (no answer in 1 s)" in last["detail"], last
    assert len((tmp_path / "calls").read_text().splitlines()) == calls  # conntrackd was not even asked
    assert s.commits["skipped"] == 1
    s.observe(3, "", 10.0)  # it answers again: the next takeover commits (and waits, bounded) again
    assert s.commit(["198.51.100.200"])["result"] == "timeout"


def test_one_missed_health_check_still_commits(tmp_path):
    s = sync_with(tmp_path, "exit 0")
    s.observe(None, "no answer in 1 s", 1.0)  # a slow moment: not yet a reason to skip
    assert s.commit(["198.51.100.200"])["result"] == "ok"


def test_a_missing_binary_never_raises(tmp_path):
    s = ConnSync(ConnectionSync(enabled=True, binary=str(tmp_path / "none")), str(tmp_path), registry=None)
    assert s.commit(["198.51.100.200"])["result"] == "error"


# -- health -----------------------------------------------------------------------------------
def test_received_packets_are_read_from_the_network_statistics():
    assert received_packets(STATS.format(recv=7)) == 7
    assert received_packets("garbage\n") is None


def test_peer_up_while_packets_arrive_down_after_silence_unknown_without_daemon(tmp_path):
    s = sync_with(tmp_path, "exit 0")
    assert s.peer(now=0.0) == "unknown" and s.status()["daemon"] == "unknown"
    s.observe(5, "", 100.0)
    assert s.peer(now=100.5) == "unknown"  # watched too briefly to call it down
    s.observe(6, "", 101.0)
    assert s.peer(now=101.0) == "up"
    assert s.peer(now=101.0 + connsync.PEER_SILENCE + 0.1) == "down"
    s.observe(None, "no answer in 1 s", 110.0)
    assert s.peer(now=110.0) == "unknown" and s.status()["daemon"] == "down"


@pytest.mark.parametrize(("body", "daemon", "error"), [
    (f"printf '{STATS.format(recv=9)}'", "up", ""),
    ("echo garbage", "down", "no sync link statistics"),
    ("echo nope >&2; exit 1", "down", "exit 1: nope"),
    ("exec sleep 30", "down", "no answer in 1 s"),
])
def test_poll_reads_the_daemon_or_its_absence(tmp_path, body, daemon, error):
    s = sync_with(tmp_path, body)
    s.poll(now=5.0)
    st = s.status()
    assert st["daemon"] == daemon and error in st["daemonError"], st
    if daemon == "up":
        assert st["received"] == 9


def test_status_line_and_metrics(tmp_path):
    registry = CollectorRegistry()
    s = ConnSync(ConnectionSync(enabled=True, binary=fake(tmp_path, "exit 0")), str(tmp_path / "st"),
                 registry=registry)
    s.start()
    try:
        s.commit(["198.51.100.200"])
        text = connsync_text(s.status())
        assert text.startswith("connection sync: conntrackd ") and "last commit ok in " in text
        metrics = generate_latest(registry).decode()
        assert 'nocloudlb_connsync_commits_total{result="ok"} 1.0' in metrics
        assert "nocloudlb_connsync_last_commit_ok 1.0" in metrics
        assert 'nocloudlb_connsync_peer_state{state="unknown"}' in metrics
        assert (tmp_path / "st" / "conntrackd-client.conf").read_text() == client_conf("/var/run/conntrackd.ctl")
    finally:
        s.close()
    assert "nocloudlb_connsync" not in generate_latest(registry).decode()


# -- the takeover hook --------------------------------------------------------------------------
def test_layer2_calls_the_hook_before_it_announces_what_it_gains(tmp_path):
    journal = Journal()
    mode = L2Mode(RecordingAnnouncer(journal, "n1", None), RecordingDelivery(journal), str(tmp_path),
                  before_gain=lambda ips: journal.append(("gain", list(ips))))
    parsed = parse_resources(pool_docs() + [service_doc("a", "198.51.100.200")])
    healthy = frozenset(s.key for s in parsed.services)
    nodes = [NodeView("n1", {}, "alive", healthy), NodeView("n2", {}, "alive", healthy)]
    mode.apply("n1", nodes, parsed)
    mode.apply("n2", nodes, parsed)  # whichever of the two leads it
    gains = [i for i, e in enumerate(journal) if e[0] == "gain"]
    announces = [i for i, e in enumerate(journal) if e[0] == "announce" and "198.51.100.200" in e[1]]
    assert gains and announces and gains[0] < announces[0], journal
    assert journal[gains[0]][1] == ["198.51.100.200"]


def test_a_failing_hook_never_stops_the_takeover(tmp_path):
    journal = Journal()

    def boom(ips):
        raise RuntimeError("conntrackd exploded")

    mode = L2Mode(RecordingAnnouncer(journal, "n1", None), RecordingDelivery(journal), str(tmp_path),
                  before_gain=boom)
    parsed = parse_resources(pool_docs() + [service_doc("a", "198.51.100.200")])
    mode.apply("n1", [NodeView("n1", {}, "alive", frozenset(s.key for s in parsed.services))], parsed)
    assert "198.51.100.200" in journal.announced()


class _Forwarding:
    name = "dataplane"

    def forwarded_vips(self):
        return {"198.51.100.200"}


def test_the_speaker_commits_only_for_vips_the_data_plane_forwards(tmp_path):
    rt = Runtime(post=lambda *a: None)
    rt.modes.append(ModeRunner(_Forwarding()))
    calls = []

    class Sync:
        def commit(self, ips):
            calls.append(ips)

    rt.connsync = Sync()
    ms = ModeSet(rt, None, lambda: "", dict)
    ms.before_gain(["198.51.100.201"])
    ms.before_gain(["198.51.100.200", "198.51.100.201"])
    assert calls == [["198.51.100.200"]]
