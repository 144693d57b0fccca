"""Member metadata: 1,000 Local-policy services fit in kinship's 512 bytes, through a real cluster."""

from __future__ import annotations

import random
import time

import kinship
import pytest
from inproc_speaker import free_port
from kinship.blocking import Cluster
from nocloudlb.core.election import DRAIN_LABEL
from nocloudlb.metadata import MAX_META, MAX_OFF_WIRE, MetaCodec, decode_bitmap, encode_bitmap, meta_size

pytestmark = pytest.mark.timeout(30)

SERVICES = [f"ns{i % 7}/svc-{i:04d}" for i in range(1000)]
LABEL_KEYS = {DRAIN_LABEL, "topology.kubernetes.io/zone", "rack"}
LABELS = {"topology.kubernetes.io/zone": "eu-west-1a", "rack": "r12", DRAIN_LABEL: "", "ignored": "x" * 200}


def test_bitmap_roundtrip():
    order = sorted(SERVICES)
    healthy = set(random.Random(1).sample(order, 500))
    assert decode_bitmap(order, encode_bitmap(order, healthy)) == healthy
    assert decode_bitmap(order, encode_bitmap(order, [])) == frozenset()


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_thousand_local_services_fit_through_kinship(fraction):
    codec = MetaCodec(SERVICES, LABEL_KEYS, "abcdef01")
    healthy = set(random.Random(7).sample(sorted(SERVICES), int(len(SERVICES) * fraction)))
    meta = codec.encode(LABELS, healthy)
    assert "ignored" not in meta["l"]  # only labels that matter travel
    port = free_port()
    cfg = kinship.Config.lan(name="m", bind=f"127.0.0.1:{port}", insecure_plaintext=True)
    with Cluster(cfg) as cl:
        cl.set_meta(meta, timeout=2)  # raises MetaTooLarge past 512 bytes
        got = cl.local.meta
    info = MetaCodec(SERVICES, LABEL_KEYS, "abcdef01").decode(got)
    assert info.health_known and info.healthy == frozenset(healthy)
    assert info.labels == {k: v for k, v in LABELS.items() if k in LABEL_KEYS}
    assert info.config_hash == "abcdef01"


def test_vips_led_off_the_wire_travel_and_any_doubt_reads_as_all():
    """``x``: the VIPs a node leads without answering them; a peer taking one checks it first (plan.py)."""
    codec = MetaCodec(SERVICES, LABEL_KEYS, "abcdef01")
    off = ["198.51.100.200", "2001:db8:1::201"]
    info = codec.decode(codec.encode(LABELS, [], off_wire=off))
    assert info.leads_off_wire("198.51.100.200") and info.leads_off_wire("2001:DB8:1:0::201")  # canonical text
    assert not info.leads_off_wire("198.51.100.201")
    assert "x" not in codec.encode(LABELS, [])  # none: nothing extra on the wire
    assert not codec.decode(codec.encode(LABELS, [])).leads_off_wire("198.51.100.200")
    many = [f"198.51.100.{i}" for i in range(MAX_OFF_WIRE + 1)]
    meta = codec.encode(LABELS, [], off_wire=many)
    assert meta["x"] == "*" and codec.decode(meta).leads_off_wire("203.0.113.9")  # more than travel: all
    for garbage in ("!!", "AAA=", "A" * 64):  # not base64, not 4-byte keys, too many keys: all
        assert codec.decode({**meta, "x": garbage}).leads_off_wire("203.0.113.9"), garbage


def test_the_list_of_vips_off_the_wire_gives_way_to_a_star_when_it_does_not_fit():
    keys = {f"k{i}" for i in range(5)}  # the most selector labels a config may have with the most MACs
    codec = MetaCodec([], keys, "abcdef01")
    labels = {k: "v" * 63 for k in keys}
    macs = [bytes([2, 0, 0, 0, 0, i]) for i in range(4)]
    off = [f"198.51.100.{i}" for i in range(MAX_OFF_WIRE)]
    assert codec.worst_case_size() <= MAX_META  # the config is accepted at load
    meta = codec.encode(labels, [], macs, off_wire=off)
    assert meta_size(meta) <= MAX_META and meta["x"] == "*"  # the list would not fit: "*"
    assert meta_size(codec.encode(labels, [], macs, off_wire=off[:1])) <= MAX_META
    assert len(codec.encode(labels, [], off_wire=off)["x"]) > 1  # without the MACs the list fits


def test_too_much_is_refused_by_kinship():
    codec = MetaCodec(SERVICES, {"big"}, "x")
    meta = codec.encode({"big": "y" * 600}, [])
    port = free_port()
    with Cluster(kinship.Config.lan(name="m", bind=f"127.0.0.1:{port}", insecure_plaintext=True)) as cl:
        with pytest.raises(kinship.MetaTooLarge):
            cl.set_meta(meta, timeout=2)


def test_peer_with_other_service_list_counts_as_unknown_health():
    mine = MetaCodec(SERVICES, LABEL_KEYS, "aaaa0000")
    theirs = MetaCodec(SERVICES + ["new/svc"], LABEL_KEYS, "bbbb0000")
    info = mine.decode(theirs.encode({DRAIN_LABEL: ""}, SERVICES))
    assert not info.health_known and info.healthy == frozenset()
    assert info.labels == {DRAIN_LABEL: ""} and info.config_hash == "bbbb0000"
    assert "differs" in info.error
    assert not mine.decode({"v": "9"}).health_known


def test_encoding_is_fast_enough():
    codec = MetaCodec(SERVICES, LABEL_KEYS, "x")
    t0 = time.perf_counter()
    for _dummy in range(100):
        codec.decode(codec.encode(LABELS, SERVICES[::2]))
    assert time.perf_counter() - t0 < 2.0
