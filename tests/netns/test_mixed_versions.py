"""Wire compatibility between the previous release and this code (docs/speaker.md, "Wire compatibility").

The previous release is the commit release/previous.json names, materialised from the repository's
history by previous_release.py and run from its own tree (``PYTHONPATH`` first, ahead of the editable
install).

- Reading each other: each side encodes its gossip metadata and a heartbeat datagram carrying it; the
  other side decodes both. The old side must read everything the new one sends as it reads its own
  (labels, health, MACs, flags), ignoring what it does not know; the new side reads an old member
  with the version it publishes (none from 0.1.0).
- A rolling upgrade and a rollback on the wire: three real speakers (lan profile), one VIP led by each,
  slow HTTP servers behind them (a request is nearly always in flight). All start from the previous
  release; then one node at a time goes through what ``rolling_restart.yml`` does: drained (its VIP
  moves to the next node), the grace period, SIGTERM, started from this code, ready (full membership
  everywhere), undrained, and waited for (every VIP past its checks, answered by its elected node
  alone); then the same back, node by node, to the previous release. Throughout, a client asks ARP
  for every VIP every 0.1 s and records every MAC that answers (arp_sampler.py), and GETs every VIP
  back to back. No sample may be without an owner when the previous release hands a VIP off as this
  code does (its tree has l2/handoff.py: the giver answers until the taker announces). No sample may
  have two owners at a move whose taker runs this code: it announces, then answers (l2/responder.py
  ``T``). A taker of a release that answers first (0.2.0 and before) leaves one instant when both
  answer (it has begun, its announcement has not reached the giver: about a millisecond), which a
  sample catches now and then (once in 12 moves in one run of five here): allowed for such a taker
  only, as a single sample at a move, at most two in the run, never a window. A
  previous release without the hand-off (0.1.0) stops answering at its decision and the
  taker announces once its handover forwarding is in place: a no-answer window around the VIP's own
  leader's drain and undrain that a 0.1 s sample catches now and then, allowed then and only there.
  What the old side can do is read from its tree, so ``NOCLOUDLB_PREVIOUS=<commit>`` runs the test
  against any other commit (0.1.0's is 8998b708). No GET fails: at
  each move the new owner passes the connections in flight on to the node giving the VIP up
  (handover forwarding, which both versions run, whichever side is old). While the cluster is mixed,
  the new members' status answers, and ``nocloudlb status --cluster`` asked of a new member, show
  both versions (a 0.1.0 member as "-": it publishes none).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import arp_sampler
import pytest
from nocloudlb import WIRE_VERSION, __version__
from nocloudlb.core.election import DRAIN_LABEL, election_order
from nocloudlb.membership import generate_key
from previous_release import check_tree, env_for, materialise, previous_commit
from speaker_harness import HttpPoller, SpeakerCluster, VipWatch, pool_docs, service_doc, spread_vips

pytestmark = pytest.mark.timeout(600)
NODES = ["n1", "n2", "n3"]
INTERVAL, WINDOW = 0.1, 0.08
#: rolling_restart.yml's grace_period: the drained node serves the connections passed on to it meanwhile
GRACE = 2.0
#: With a previous release that does not hand off (0.1.0): the longest no-answer window allowed, and only
#: on the restarted node's own VIP while it takes it back (the interim owner withdraws, then the node runs
#: its RFC 5227 check, about 0.3 s, before it announces). Measured 0.3-0.5 s, the same with 0.1.0 alone.
TAKEBACK_MAX = 1.0

#: Run by each side's Python: encodes its metadata and a heartbeat carrying it, and decodes what the other
#: side sent (stdin: {} or the other side's "sent"). Only APIs both versions have.
CODEC = r"""
import json, sys
import nocloudlb
from nocloudlb import heartbeat_wire as hw
from nocloudlb.core.election import DRAIN_LABEL
from nocloudlb.metadata import MetaCodec
other = json.loads(sys.stdin.read())
keys = hw.derive_keys([sys.argv[1]])
codec = MetaCodec(["test/svc0", "test/svc1", "test/svc2"], [DRAIN_LABEL, "rack"], "abcd1234")
meta = codec.encode({"rack": "r1", DRAIN_LABEL: "true", "zone": "z"}, ["test/svc1", "test/svc2"],
                    [bytes.fromhex("020000000001"), bytes.fromhex("020000000002")])
pkt = hw.Packet("n1", "n2", 7, 9, 2, 3, suspect_you=True, meta=meta, missing=("n3",))
out = {"file": nocloudlb.__file__, "version": getattr(nocloudlb, "__version__", None),
       "wire": getattr(nocloudlb, "WIRE_VERSION", None),
       "sent": {"meta": meta, "datagram": hw.encode(pkt, keys[0], no_quorum=True, deaf=True).hex()}}
if other:
    info = codec.decode(other["meta"])
    got = hw.decode(bytes.fromhex(other["datagram"]), keys)
    out["read"] = {"labels": info.labels, "healthy": sorted(info.healthy), "config": info.config_hash,
                   "known": info.health_known, "error": info.error, "macs": [m.hex() for m in info.macs],
                   "version": getattr(info, "version", None), "wireVersion": getattr(info, "wire", None)}
    out["packet"] = {"fields": [got.sender, got.recipient, got.boot, got.seq, got.suspicions, got.meta_seq],
                     "flags": [got.suspect_you, got.no_quorum, got.deaf, got.partial],
                     "missing": list(got.missing), "meta": got.meta}
print(json.dumps(out))
"""


@pytest.fixture
def netns_prefix() -> str:
    return "nmv"


class Old(NamedTuple):
    """The previous release's import root and what its tree can do."""

    root: Path
    version: str | None  # what it publishes (None: nothing, as 0.1.0)
    wire: int | None
    hands_off: bool  # l2/handoff.py: it answers a VIP it gives up until the taker announces


@pytest.fixture(scope="module")
def old(tmp_path_factory) -> Old:
    """The previous release (or ``NOCLOUDLB_PREVIOUS``'s commit), checked to import from its own tree."""
    root = materialise(tmp_path_factory.mktemp("previous"))
    where = check_tree(root)
    wire = where["wire"]
    found = Old(root, where["version"] if wire is not None else None, wire,
                (root / "nocloudlb" / "l2" / "handoff.py").is_file())
    print(f"previous release {previous_commit()[:12]} from {where['nocloudlb']}: version {found.version}, wire "
          f"{found.wire}, hands off {found.hands_off}")
    return found


def published(old: Old) -> tuple[str, int | None]:
    """How this code reads an old member's version: what it publishes, or ("", None) for none."""
    return (old.version, old.wire) if old.version is not None else ("", None)


def codec_run(root: Path | None, key: str, other: dict | None = None) -> dict:
    env = None if root is None else env_for(root, dict(os.environ))
    out = subprocess.run([sys.executable, "-c", CODEC, key], input=json.dumps(other or {}), capture_output=True,
                         text=True, check=False, timeout=60, env=env, cwd=str(root or Path(__file__).parent))
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_each_version_reads_what_the_other_sends(old):
    old_root = old.root
    key = generate_key()
    old0, new0 = codec_run(old_root, key), codec_run(None, key)
    assert Path(old0["file"]).resolve().is_relative_to(old_root.parent.resolve()), old0["file"]
    assert old0["wire"] == old.wire and new0["wire"] == WIRE_VERSION, (old0, new0)
    versioned = {"n", "p"}  # the metadata keys that carry the version and the wire version
    assert set(new0["sent"]["meta"]) - set(old0["sent"]["meta"]) == (versioned if old.wire is None else set())
    assert {k: v for k, v in new0["sent"]["meta"].items() if k not in versioned} == \
        {k: v for k, v in old0["sent"]["meta"].items() if k not in versioned}
    old_reads_new = codec_run(old_root, key, new0["sent"])
    old_reads_old = codec_run(old_root, key, old0["sent"])
    new_reads_old = codec_run(None, key, old0["sent"])
    new_reads_new = codec_run(None, key, new0["sent"])
    # the old speaker reads a new member exactly as it reads an old one (the keys it does not know are
    # ignored), but for the version, if it reads one
    unversioned = {k: v for k, v in old_reads_old["read"].items() if k not in ("version", "wireVersion")}
    assert {k: v for k, v in old_reads_new["read"].items() if k not in ("version", "wireVersion")} == unversioned
    if old.wire is not None:
        assert (old_reads_new["read"]["version"], old_reads_new["read"]["wireVersion"]) == (__version__, WIRE_VERSION)
    assert old_reads_new["read"]["known"] and not old_reads_new["read"]["error"], old_reads_new["read"]
    assert old_reads_new["read"]["healthy"] == ["test/svc1", "test/svc2"]
    assert old_reads_new["packet"]["meta"] == new0["sent"]["meta"], old_reads_new["packet"]
    assert old_reads_new["packet"]["flags"] == old_reads_old["packet"]["flags"] == [True, True, True, False]
    assert old_reads_new["packet"]["fields"] == old_reads_old["packet"]["fields"]
    # the new speaker reads an old member with the version it publishes (none: ""), everything else the same
    common = {k: v for k, v in new_reads_new["read"].items() if k not in ("version", "wireVersion")}
    assert {k: v for k, v in new_reads_old["read"].items() if k not in ("version", "wireVersion")} == common
    assert (new_reads_old["read"]["version"], new_reads_old["read"]["wireVersion"]) == published(old)
    assert (new_reads_new["read"]["version"], new_reads_new["read"]["wireVersion"]) == (__version__, WIRE_VERSION)
    print(f"old reads new: {old_reads_new['read']}; new reads old: {new_reads_old['read']}")


def settle(c: SpeakerCluster, vips: dict[str, str], what: str) -> None:
    c.wait(lambda: all(c.members_alive(n) == set(NODES) for n in NODES), 40, f"{what}: full membership")
    c.wait(c.settled, 30, f"{what}: every VIP past its checks")
    for ip, leader in vips.items():
        c.wait(lambda ip=ip, leader=leader: c.answered_by(ip, leader, 0.5), 20,
               f"{what}: {ip} answered by {leader} alone")


def served_by_other(poll: HttpPoller, node: str, since: float, streak: int = 3) -> bool:
    return sum(1 for s in list(poll.samples) if s["t"] > since and s["ok"] and s["body"] != node) >= streak


def taker_is_new(step: dict, ip: str, t: float) -> bool:
    """Whether the node taking ``ip`` at time ``t`` of ``step`` runs this code: before the restarted node is
    back, the next node in the VIP's order takes it (new if upgraded before this step); after, the restarted
    node takes it back (new when the step is an upgrade)."""
    if t >= step["start"]:
        return step["up"]
    nxt = next(n for n in election_order(NODES, ip) if n != step["node"])
    return nxt in step["new"]


def roll(c: SpeakerCluster, vips: dict[str, str], node: str, root: Path | None, label_: str,
         polls: dict[str, HttpPoller]) -> dict:
    """What ``rolling_restart.yml`` does to ``node``: drain it (its VIP moves to the next node, which
    passes the connections in flight on to it: handover forwarding), wait the grace period, stop it
    with SIGTERM, start it from ``root`` (None: this code), wait until it is ready (full membership),
    undrain it and wait until settled (its VIP back, answered by it alone)."""
    t_drain = time.time()
    c.label(node, "set", f"{DRAIN_LABEL}=true")
    for ip in (ip for ip, leader in vips.items() if leader == node):
        c.wait(lambda ip=ip: served_by_other(polls[ip], node, t_drain), 15,
               f"{label_}: {ip} served by another node once {node} is drained")
    time.sleep(GRACE)
    t_stop = c.send_signal(node, signal.SIGTERM)
    assert c.procs[node].wait(timeout=15) == 0, f"{label_}: {node} did not stop cleanly"
    if root is None:
        c.source.pop(node, None)
    else:
        c.source[node] = root
    t_start = time.time()
    c.start(node)
    c.wait(lambda: all(c.members_alive(n) == set(NODES) for n in NODES), 40, f"{label_}: full membership")
    c.label(node, "unset", DRAIN_LABEL)
    settle(c, vips, label_)
    return {"label": label_, "node": node, "drain": t_drain, "stop": t_stop, "start": t_start, "settled": time.time()}


def versions(c: SpeakerCluster) -> dict[str, dict]:
    """Each node's own status answer: its version fields (absent from an old speaker's) and, for a new
    one, the version it sees published by every member."""
    out = {}
    for n in NODES:
        st = c.status(n)
        out[n] = {"own": (st.get("version"), st.get("wireVersion")),
                  "members": {m["name"]: (m.get("version"), m.get("wireVersion")) for m in st["members"]}}
    return out


def check_mixed(c: SpeakerCluster, old: Old, new: set[str], label: str) -> str:
    """Every new node's status shows every member's version; ``status --cluster`` says the cluster is mixed."""
    seen = versions(c)
    for n in NODES:
        if n in new:
            assert seen[n]["own"] == (__version__, WIRE_VERSION), (label, n, seen[n])
            want = {m: (__version__, WIRE_VERSION) if m in new else published(old) for m in NODES}
            c.wait(lambda n=n, want=want: versions(c)[n]["members"] == want, 10,
                   f"{label}: {n} sees every member's version")
        else:  # an old speaker: its own version, or no version fields at all (0.1.0)
            assert seen[n]["own"] == (old.version, old.wire), (label, n, seen[n])
    if not new or new == set(NODES):
        return ""
    asker = sorted(new)[0]
    res = c.seg.run(c.host(asker).ns, [sys.executable, "-m", "nocloudlb.cli", "status", "--socket", c.sock(asker),
                                       "--cluster", "-o", "json"], check=False, timeout=30)
    view = json.loads(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert {m["name"]: m["version"] for m in view["members"]} == \
        {m: __version__ if m in new else published(old)[0] for m in NODES}
    assert all(v["verdict"] == "ok" for v in view["vips"]), view["vips"]
    table = c.seg.run(c.host(asker).ns, [sys.executable, "-m", "nocloudlb.cli", "status", "--socket",
                                         c.sock(asker), "--cluster"], check=False, timeout=30).stdout
    line = next((x for x in table.splitlines() if x.startswith("mixed versions:")), "")
    assert line, table
    return line


def test_rolling_upgrade_and_rollback_keep_one_owner_per_vip(make_segment, tmp_path, old):
    old_root = old.root
    vips = spread_vips(NODES)
    docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
    c = SpeakerCluster(make_segment(hosts=3), tmp_path / "cluster", profile="lan", resources=docs)
    for n in NODES:
        c.write_config(n, c.config(n, metrics={"bind": "0.0.0.0:7472"}))
        c.source[n] = old_root
    c.start_all(timeout=40)
    settle(c, vips, "start (all previous release)")
    check_mixed(c, old, set(), "all old")
    samples = tmp_path / "samples.jsonl"
    watch = VipWatch(c, vips, samples, INTERVAL, WINDOW, 900)
    polls = watch.polls
    t0 = time.time()
    steps, mixed_lines = [], []
    new: set[str] = set()
    for node in NODES:  # upgrade, one node at a time
        steps.append({**roll(c, vips, node, None, f"upgrade {node}", polls), "new": set(new), "up": True})
        new.add(node)
        mixed_lines.append(check_mixed(c, old, new, f"upgrade {node}"))
    for node in NODES:  # rollback, one node at a time
        steps.append({**roll(c, vips, node, old_root, f"rollback {node}", polls), "new": set(new), "up": False})
        new.discard(node)
        mixed_lines.append(check_mixed(c, old, new, f"rollback {node}"))
    for ip, leader in vips.items():
        c.wait(lambda ip=ip, leader=leader: polls[ip].served_by(leader, steps[-1]["settled"]), 15,
               f"{ip} served by {leader} at the end")
    t_end = time.time()
    per_vip, failed = watch.stop(t0, t_end)  # failed GETs: not the start-up's
    counts = {ip: {k: sum(1 for _t, m in smp if min(len(m), 2) == k) for k in (0, 1, 2)} for ip, smp in per_vip.items()}
    gaps = {ip: arp_sampler.longest(smp, (len(m) == 0 for _t, m in smp), t_end) for ip, smp in per_vip.items()}
    phase = {"handover": 0, "take-back": 0}  # no-owner samples: the leader's drain, its take-back (undrain)
    stray, crossed = [], []  # not one owner outside the leader's restart; two MACs at one of its moves
    for ip, smp in per_vip.items():
        for t, m in smp:
            step = next((x for x in steps if x["node"] == vips[ip] and x["drain"] <= t <= x["settled"]), None)
            if len(m) == 1:
                continue
            if step is None:
                stray.append((ip, round(t - t0, 2), len(m)))
            elif m:
                crossed.append((ip, round(t - t0, 2), step["label"], taker_is_new(step, ip, t)))
            else:
                phase["handover" if t < step["start"] else "take-back"] += 1
    longest_two = {ip: arp_sampler.longest(smp, (len(m) > 1 for _t, m in smp), t_end) for ip, smp in per_vip.items()}
    print(f"{sum(len(smp) for smp in per_vip.values())} ARP samples over {t_end - t0:.1f} s "
          f"({len(steps)} restarts as rolling_restart.yml does them: drain, SIGTERM, start, undrain)")
    for ip in sorted(vips):
        print(f"  {ip} (led by {vips[ip]}): samples with 0/1/2+ owners {counts[ip][0]}/{counts[ip][1]}/"
              f"{counts[ip][2]}, longest no-answer window {gaps[ip] * 1000:.0f} ms; HTTP {len(polls[ip].samples)} "
              f"GETs, {len(failed[ip])} failed ({sorted({f['body'][:40] for f in failed[ip]})}), "
              f"{polls[ip].moves} moves")
    print(f"  samples without an owner: {phase['handover']} while a leader was drained, "
          f"{phase['take-back']} while it took its VIP back; with two: {crossed}; not one owner elsewhere: {stray}")
    for s in steps:
        print(f"  {s['label']}: stopped {s['stop'] - s['drain']:.2f} s, started {s['start'] - s['drain']:.2f} s "
              f"and settled {s['settled'] - s['drain']:.2f} s after its drain")
    for line in mixed_lines:
        if line:
            print(f"  {line}")
    # two MACs for one request: a taker of this code announces before it answers (l2/responder.py ``T``), so
    # never at its moves; a taker of a release that answers first, only the instant before its announcement
    # reaches the giver, a single sample at a move, never a window (a giver that missed the announcement
    # would answer on for a gratuitous round, 1.1 s)
    assert not [x for x in crossed if x[3]], f"two MACs at a move whose taker runs this code: {crossed}"
    assert max(longest_two.values()) <= 1.5 * INTERVAL and len(crossed) <= 2, (crossed, longest_two)
    if old.hands_off:  # both sides hand a VIP off: no sample without an owner, drains and undrains included
        assert all(counts[ip][0] == 0 for ip in vips), (counts, phase)
    # not one owner only while the VIP's own leader restarts: its handover (ms) and its take-back
    assert not stray, f"not one owner outside the leader's restart (VIP, s from the start, MACs): {stray}"
    assert max(gaps.values()) <= TAKEBACK_MAX, gaps
    # the new owner passes the connections in flight on to the node giving the VIP up (handover
    # forwarding, both versions): no request lost; each VIP moves four times (its leader drained and undrained, twice)
    assert all(polls[ip].moves >= 4 for ip in vips), {ip: p.moves for ip, p in polls.items()}
    assert not any(failed.values()), failed
    expected = (t_end - t0) / INTERVAL * 0.5
    assert all(len(smp) >= expected for smp in per_vip.values()), "the sampler fell behind or died"
