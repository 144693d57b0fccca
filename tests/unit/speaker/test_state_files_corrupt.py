"""A corrupt state file is set aside with an event, never a crash loop.

``stateDir/labels.json`` that is not JSON, not an object or holds wrong types used to make
``LabelStore`` raise, so the speaker exited at start (``speakerFailed``) and systemd restarted it
into the same error: ``test_corrupt_labels_file_is_set_aside_and_the_store_starts_drained`` fails
on main at b37e060 with ``ValueError: .../labels.json: cannot read runtime labels``, and on
``{"set": {"zone": 5}}`` (accepted and stringified there) with "not set aside". The file is now
renamed ``labels.json.corrupt-<UTC time>`` beside it, ``stateFileCorrupt`` is logged (level error,
path and reason) and the node starts *drained*: the file may have held a drain, so the store is
rewritten with the drain label and the operator undrains with ``nocloudlb label unset``.

``lo-vips.json`` (the record of the addresses the layer-2 mode added to lo) that does not parse
into a list of addresses made every ``sync_lo_vips`` raise there (an object whose ``managed`` is
not a list, a list at the top, a non-address): every VIP stayed ``notOnLo``, never announced while
the peers still elected the node. It is set aside the same way and the record starts empty; no
drain (the record only decides which IPv6 addresses the speaker may remove from lo again).
"""

from __future__ import annotations

import json
import logging
import os
import re

import pytest
from nocloudlb.core.election import DRAIN_LABEL
from nocloudlb.state import LabelStore

CORRUPT = [
    ("notJson", b"{oops"),
    ("notUtf8", b"\xff\xfe{}"),
    ("list", b"[1, 2]"),
    ("string", b'"set"'),
    ("setNotObject", b'{"set": ["zone"], "unset": []}'),
    ("valueNotString", b'{"set": {"zone": 5}, "unset": []}'),
    ("unsetNotList", b'{"set": {}, "unset": "zone"}'),
    ("unsetNotStrings", b'{"set": {}, "unset": [1]}'),
    ("controlCharacters", b'{"set": {"zone": "a\\u001b[31m"}, "unset": []}'),
]


def events(caplog, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", "") == name]


@pytest.mark.parametrize(("body",), [(b,) for _n, b in CORRUPT], ids=[n for n, _b in CORRUPT])
def test_corrupt_labels_file_is_set_aside_and_the_store_starts_drained(tmp_path, caplog, body):
    caplog.set_level(logging.INFO)
    path = tmp_path / "labels.json"
    path.write_bytes(body)
    store = LabelStore(tmp_path)  # no exception: the speaker starts
    aside = [n for n in os.listdir(tmp_path) if n.startswith("labels.json.corrupt-")]
    assert len(aside) == 1, os.listdir(tmp_path)
    assert re.fullmatch(r"labels\.json\.corrupt-\d{8}T\d{6}Z", aside[0]), aside
    assert (tmp_path / aside[0]).read_bytes() == body, "the corrupt file is kept as it was, for the operator"
    # fail closed: the file may have held a drain; the node starts drained, and that is on disk
    assert DRAIN_LABEL in store.apply({"zone": "a"})
    assert DRAIN_LABEL in json.loads(path.read_text())["set"]
    assert DRAIN_LABEL in LabelStore(tmp_path).apply({}), "a restart keeps the node drained"
    assert store.corrupt and store.corrupt["setAside"] == str(tmp_path / aside[0]), store.corrupt
    (rec,) = events(caplog, "stateFileCorrupt")
    assert rec.levelno == logging.ERROR
    assert rec.fields["path"] == str(path) and rec.fields["setAside"] == str(tmp_path / aside[0])
    assert rec.fields["reason"] and rec.fields["drained"] is True, rec.fields
    assert "drained" in rec.getMessage() and "nocloudlb label unset" in rec.getMessage()
    # the operator undrains with the usual command; nothing else is left behind
    store.update(None, [DRAIN_LABEL])
    assert LabelStore(tmp_path).apply({"zone": "a"}) == {"zone": "a"}
    assert sorted(os.listdir(tmp_path)) == sorted(["labels.json", aside[0]])


def test_the_reason_names_what_is_wrong(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    (tmp_path / "labels.json").write_text('{"set": {"zone": 5}}')
    LabelStore(tmp_path)
    (rec,) = events(caplog, "stateFileCorrupt")
    assert "'set'" in rec.fields["reason"] and "zone" in rec.fields["reason"] and "5" in rec.fields["reason"]


def test_two_corrupt_files_in_one_second_are_both_kept(tmp_path):
    for body in (b"{oops", b"[1]"):
        (tmp_path / "labels.json").write_bytes(body)
        LabelStore(tmp_path)
    kept = sorted((tmp_path / n).read_bytes() for n in os.listdir(tmp_path) if ".corrupt-" in n)
    assert kept == sorted([b"{oops", b"[1]"])


def test_a_good_file_is_read_as_before_and_not_set_aside(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    (tmp_path / "labels.json").write_text('{"set": {"zone": "b"}, "unset": ["rack"]}')
    store = LabelStore(tmp_path)
    assert store.apply({"zone": "a", "rack": "1"}) == {"zone": "b"}
    assert store.corrupt == {} and os.listdir(tmp_path) == ["labels.json"]
    assert not events(caplog, "stateFileCorrupt")


def test_an_unwritable_state_dir_still_starts_drained(tmp_path, caplog):
    """When the file can be neither renamed nor rewritten (a read-only directory), the node still
    starts, drained in memory, and the event says the file stays where it is."""
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory anyway")
    caplog.set_level(logging.INFO)
    (tmp_path / "labels.json").write_text("{oops")
    tmp_path.chmod(0o500)
    try:
        store = LabelStore(tmp_path)
    finally:
        tmp_path.chmod(0o700)
    assert DRAIN_LABEL in store.apply({})
    (rec,) = events(caplog, "stateFileCorrupt")
    assert rec.fields["setAside"] == "" and rec.fields["drained"] is True


LO_CORRUPT = [
    ("notJson", b"{oops"),
    ("list", b'["198.51.100.200"]'),
    ("managedNotList", b'{"managed": 5}'),
    ("notAnAddress", b'{"managed": ["198.51.100.200", "no-such-address"]}'),
    ("notAString", b'{"managed": [7]}'),
]


@pytest.mark.parametrize(("body",), [(b,) for _n, b in LO_CORRUPT], ids=[n for n, _b in LO_CORRUPT])
def test_corrupt_lo_vips_record_is_set_aside_and_starts_empty(tmp_path, caplog, body):
    from nocloudlb.l2.delivery import _read_state

    caplog.set_level(logging.INFO)
    path = tmp_path / "lo-vips.json"
    path.write_bytes(body)
    assert _read_state(path) == set()
    aside = [n for n in os.listdir(tmp_path) if n.startswith("lo-vips.json.corrupt-")]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_bytes() == body, os.listdir(tmp_path)
    assert not path.exists()
    (rec,) = events(caplog, "stateFileCorrupt")
    assert rec.levelno == logging.ERROR and rec.fields["path"] == str(path) and rec.fields["reason"]
    assert rec.fields["drained"] is False
    assert _read_state(path) == set() and len(events(caplog, "stateFileCorrupt")) == 1


def test_a_good_lo_vips_record_is_read(tmp_path):
    from nocloudlb.l2.delivery import _read_state

    path = tmp_path / "lo-vips.json"
    path.write_text('{"managed": ["198.51.100.200", "2001:db8::0:1"]}')
    assert _read_state(path) == {"198.51.100.200", "2001:db8::1"}
    assert os.listdir(tmp_path) == ["lo-vips.json"]


def test_nocloudlb_status_says_the_node_started_drained(tmp_path):
    from nocloudlb.statusview import Paint, header

    (tmp_path / "labels.json").write_text("{oops")
    store = LabelStore(tmp_path)
    text = header({"node": "n1", "stateFiles": [store.corrupt],
                   "failClosed": {"reason": "the decision loop has failed for over 3s: view: RuntimeError: x",
                                  "since": "2026-12-03T07:00:00Z"}}, Paint(False))
    assert f"state file {tmp_path / 'labels.json'} was corrupt at start (not JSON" in text
    assert "set aside as " + store.corrupt["setAside"] in text and "the node started drained" in text
    assert "fail closed since 2026-12-03T07:00:00Z: this node publishes itself drained: the decision loop" in text
