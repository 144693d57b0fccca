"""Issue 10 (scale): the config is read in one libyaml pass that still refuses alias bombs, recursive
anchors and deep nesting, builds exactly what ``yaml.safe_load`` builds, and a reload of the very
file in use parses nothing."""

from __future__ import annotations

import ipaddress

import pytest
import yaml
from nocloudlb.config import ConfigHolder, _read_yaml, load
from nocloudlb.core.errors import ConfigError
from test_speaker_config_state import base, svc

POOL6 = {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "big"},
         "spec": {"addresses": ["2001:db8:100::/112"]}}
L2BIG = {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "big"},
         "spec": {"ipAddressPools": ["big"]}}


def big_doc(n: int) -> dict:
    first = ipaddress.ip_address("2001:db8:100::1")
    doc = base()
    doc["resources"] = doc["resources"] + [POOL6, L2BIG] + [svc(f"s{i}", str(first + i)) for i in range(n)]
    return doc


def test_large_file_reads_as_safe_load(tmp_path):
    text = yaml.safe_dump(big_doc(1000))
    assert _read_yaml(text, "x") == list(yaml.load_all(text, Loader=yaml.CSafeLoader))
    path = tmp_path / "config.yaml"
    path.write_text(text)
    cfg = load(path)
    assert len(cfg.parsed.services) == 1001 and cfg.file_digest


BOMB = ("bomb:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)))


@pytest.mark.parametrize("tail, words", [
    (BOMB, "expands to more than"),
    ("loop: &r [*r]\n", "recursive YAML anchor"),
    ("deep: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than"),
])
def test_large_file_keeps_refusing_hostile_yaml(tmp_path, tail, words):
    """The hostile part sits after thousands of services: the fast path does not skip the checks."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(big_doc(1000)) + tail)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert words in info.value.errors[0]


@pytest.mark.parametrize("text", [
    "a: 1\nb: [1.5, .nan, true, null, ~, 2001-01-01, 'x', !!str 3, 0x1F, 0o17, 1_000, +.inf, yes, On]\n",
    "", "---\n---\n", "x: &a [1]\ny: *a\n", "<<: {a: 1}\nb: 2\n", "? [a]\n: b\n", "- ! x\n- !!int '3'\n",
    "a: |\n  12\nb: >\n  x\n", "a: 1\na: 2\n", "k: =\n", "? {a: 1}\n: 2\n", "x: [[1, {a: [2]}], 3]\n---\n- z\n",
    "t: 2002-12-14t21:59:43.10-05:00\n", "'<<': 1\n", "e: ''\nf: \"\"\n",
])
def test_reads_as_safe_load_all(text):
    try:
        want: object = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        want = type(exc)
    try:
        got: object = _read_yaml(text, "x")
    except yaml.YAMLError as exc:
        got = type(exc)
    assert str(got) == str(want)


def test_reload_of_the_same_bytes_parses_nothing(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(big_doc(50)))
    holder = ConfigHolder(str(path))
    ok, cfg = holder.reload()
    assert ok and not holder.unchanged

    def boom(*_a, **_k):
        raise AssertionError("parsed again")

    monkeypatch.setattr("nocloudlb.config._read_yaml", boom)
    ok2, cfg2 = holder.reload()
    assert ok2 and cfg2 is cfg and holder.unchanged and holder.state == "ok"
    path.write_text(path.read_text() + "# edited\n")  # other bytes: parsed (and here the parser fails)
    ok3, cfg3 = holder.reload()
    assert not ok3 and cfg3 is cfg and not holder.unchanged and "parsed again" in holder.errors[0]


@pytest.mark.parametrize("announce, ok", [
    ({"rate": 2000, "burst": 50}, True), ({}, True), ({"rate": 0}, False), ({"rate": "fast"}, False),
    ({"burst": 1.5}, False), ({"rate": float("nan")}, False), ({"pace": 1}, False), ([1], False),
])
def test_announce_pacing_is_a_checked_setting(tmp_path, announce, ok):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base(announce=announce)))
    if ok:
        cfg = load(path)
        assert cfg.announce_rate == float(announce.get("rate", 5000))
        assert cfg.announce_burst == announce.get("burst", 200)
    else:
        with pytest.raises(ConfigError) as info:
            load(path)
        assert "announce" in info.value.errors[0]
