"""Stable per-service health ids (issue 8, defect 6) and the metadata size bound (defect 4), on the
codec alone: readers on either side of a rollout decode each other's health."""

from __future__ import annotations

import random

from nocloudlb.core.election import DRAIN_LABEL
from nocloudlb.metadata import MAX_META, MetaCodec, meta_size, pack_macs, unpack_macs

OLD = [f"ns/svc-{i:03d}" for i in range(200)]
NEW = OLD[5:] + ["ns/added-1", "ns/added-2"]  # a rollout: two added, five removed
KEYS = {DRAIN_LABEL, "zone"}


def test_new_config_reads_old_and_old_reads_new():
    old = MetaCodec(OLD, KEYS, "c0")
    new = MetaCodec(NEW, KEYS, "c1", previous=OLD)
    healthy_old = set(random.Random(3).sample(OLD, 120))
    healthy_new = set(random.Random(4).sample(NEW, 120))
    seen_by_new = new.decode(old.encode({}, healthy_old))
    assert seen_by_new.health_known
    assert seen_by_new.healthy == healthy_old & set(NEW)  # the removed ones are not ours any more
    seen_by_old = old.decode(new.encode({}, healthy_new))
    assert seen_by_old.health_known, seen_by_old.error
    assert seen_by_old.healthy == healthy_new & set(OLD)  # "added" is unknown to the old config: unhealthy


def test_unrelated_list_is_unknown_and_counts_unhealthy():
    a = MetaCodec(OLD, KEYS, "c0")
    b = MetaCodec([f"other/{i}" for i in range(10)], KEYS, "c9")
    info = a.decode(b.encode({}, [f"other/{i}" for i in range(10)]))
    assert not info.health_known and info.healthy == frozenset()


def test_macs_travel_in_order_and_bad_ones_are_ignored():
    macs = [bytes.fromhex("020000000001"), bytes.fromhex("020000000002")]
    assert unpack_macs(pack_macs(macs)) == tuple(macs)
    codec = MetaCodec(OLD, KEYS, "c0")
    meta = codec.encode({}, [], macs)
    assert codec.decode(meta).macs == tuple(macs)
    assert codec.decode(dict(meta, m="not base64!")).macs == ()


def test_worst_case_bounds_every_real_encoding():
    codec = MetaCodec([f"ns/s{i}" for i in range(1000)], KEYS, "abcdef01", previous=[])
    worst = codec.worst_case_size()
    assert worst <= MAX_META
    rnd = random.Random(9)
    for _dummy in range(20):
        healthy = [k for k in codec.order if rnd.random() < 0.5]
        meta = codec.encode({DRAIN_LABEL: "v" * 63, "zone": "z" * 63}, healthy, [b"\x02" * 6] * 4)
        assert meta_size(meta) <= worst


def test_two_services_with_one_id_are_reported():
    keys = [f"ns/s{i}" for i in range(20000)]  # 24-bit ids: this many collide somewhere
    codec = MetaCodec(keys, KEYS, "c0")
    assert codec.collisions
