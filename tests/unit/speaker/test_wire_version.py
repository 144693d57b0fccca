"""The speaker's version and wire protocol number in the gossip metadata (keys ``n`` and ``p``), the
status answer and ``nocloudlb status`` / ``--cluster``: published, read back, bounded, and a member
that publishes none (a speaker from before them) read as before, shown as "-"."""

from __future__ import annotations

from dataclasses import replace

from nocloudlb import WIRE_VERSION, __version__
from nocloudlb import statusview as sv
from nocloudlb.core.election import DRAIN_LABEL
from nocloudlb.metadata import MAX_VERSION, MetaCodec, meta_size, version_text, wire_number

KEYS = {DRAIN_LABEL, "zone"}
SERVICES = [f"ns/svc-{i}" for i in range(5)]


def test_metadata_carries_the_version_and_wire_number():
    codec = MetaCodec(SERVICES, KEYS, "c0")
    meta = codec.encode({"zone": "a"}, SERVICES[:2])
    assert (meta["n"], meta["p"]) == (__version__, str(WIRE_VERSION))
    info = codec.decode(meta)
    assert (info.version, info.wire) == (__version__, WIRE_VERSION)
    assert info.health_known and info.healthy == frozenset(SERVICES[:2]) and info.labels == {"zone": "a"}


def test_a_member_without_version_keys_reads_as_before():
    codec = MetaCodec(SERVICES, KEYS, "c0")
    meta = codec.encode({"zone": "a"}, SERVICES[:2])
    old = {k: v for k, v in meta.items() if k not in ("n", "p")}  # what the previous release publishes
    info = codec.decode(old)
    assert (info.version, info.wire) == ("", None)
    assert info == replace(codec.decode(meta), version="", wire=None)


def test_the_version_is_reported_even_when_the_rest_cannot_be_read():
    codec = MetaCodec(SERVICES, KEYS, "c0")
    info = codec.decode({"v": "2", "n": "9.0.0", "p": "2"})
    assert info.error.startswith("unknown metadata version") and (info.version, info.wire) == ("9.0.0", 2)


def test_published_versions_are_bounded_and_checked():
    assert version_text("1.2.3\x00\n" + "x" * 100) == ("1.2.3" + "x" * 100)[:MAX_VERSION]
    numbers = [wire_number(v) for v in ("1", "12", "", "-1", "1.0", "１", "9" * 7)]
    assert numbers == [1, 12, None, None, None, None, None]
    codec = MetaCodec([f"ns/s{i}" for i in range(1000)], KEYS, "abcdef01", previous=[])
    meta = codec.encode({DRAIN_LABEL: "v" * 63, "zone": "z" * 63}, codec.order[::2], [b"\x02" * 6] * 4)
    assert meta_size(dict(meta, n="x" * MAX_VERSION)) <= codec.worst_case_size()


def member(name: str, version: str | None, wire: int | None) -> dict:
    m = {"name": name, "addr": f"198.51.100.1{name[-1]}:7946", "state": "alive", "labels": {}, "configDigest": "d"}
    if version is not None:
        m |= {"version": version, "wireVersion": wire}
    return m


def test_cluster_view_shows_each_members_version_and_a_mixed_cluster():
    st = {"node": "n1", "time": "t", "version": __version__, "wireVersion": WIRE_VERSION, "vips": [],
          "members": [member("n1", __version__, WIRE_VERSION), member("n2", "", None), member("n3", None, None)]}
    view = sv.cluster_view(st, 7472, get=lambda host, port: "")
    assert [(m["version"], m["wireVersion"]) for m in view["members"]] == [(__version__, WIRE_VERSION), ("", None),
                                                                           ("", None)]
    text = sv.render_cluster(view, sv.Paint(False))
    assert f"mixed versions: unpublished (older): n2,n3; {__version__} wire {WIRE_VERSION}: n1" in text
    header = next(line for line in text.splitlines() if line.startswith("MEMBER"))
    assert header.split()[:4] == ["MEMBER", "ADDRESS", "STATE", "VERSION"]
    row = next(line for line in text.splitlines() if line.startswith("n1 "))
    assert f"{__version__} wire {WIRE_VERSION}" in row
    same = sv.cluster_view(dict(st, members=st["members"][:1]), 7472, get=lambda host, port: "")
    assert "mixed versions" not in sv.render_cluster(same, sv.Paint(False))


def test_status_header_names_this_speakers_version():
    st = {"node": "n1", "ready": True, "config": {"state": "ok"}, "members": [], "memberlist": {},
          "profile": "lan", "version": "1.2.3", "wireVersion": 1}
    assert sv.header(st, sv.Paint(False)).endswith("profile lan  version 1.2.3 wire 1")
    old = {k: v for k, v in st.items() if k not in ("version", "wireVersion")}
    assert sv.header(old, sv.Paint(False)).endswith("profile lan  version -")
