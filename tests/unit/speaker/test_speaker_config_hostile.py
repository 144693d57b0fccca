"""Defect 5 (issue 8): a bad file on reload never escapes ``load``; the last good config stays.

Each case here crashed ``load`` / ``validate`` / a reload with an exception other than
ConfigError before the fix (TypeError, ValueError from the digest, UnicodeDecodeError,
RecursionError, or an exponential blow-up), or produced unbounded error text.
"""

from __future__ import annotations

import time

import pytest
import yaml
from nocloudlb.cli import main as cli_main
from nocloudlb.config import MAX_ERROR_CHARS, ConfigHolder, load
from nocloudlb.core.errors import ConfigError
from nocloudlb.daemon import Speaker, validate

# the same base config and documents as the config/state tests: one definition of them
from test_speaker_config_state import base, svc

GOOD = yaml.safe_dump(base())

HOSTILE: dict[str, bytes] = {
    "probeInterval list (TypeError)": yaml.safe_dump(
        base(memberlist={"bind": "198.51.100.11:7946", "probeInterval": [1]})).encode(),
    "probeInterval string": yaml.safe_dump(
        base(memberlist={"bind": "198.51.100.11:7946", "probeInterval": "fast"})).encode(),
    "probeInterval NaN": GOOD.replace("probeInterval: 0.25", "probeInterval: .nan").encode(),
    "probeInterval inf": GOOD.replace("probeInterval: 0.25", "probeInterval: .inf").encode(),
    "suspicionMult huge int": GOOD.replace("probeInterval: 0.25", "suspicionMult: 99999999999999999999999").encode(),
    "recursive anchor in resources": b"node: {name: n1}\nmemberlist: {bind: '198.51.100.11:7946'}\n"
                                     b"resources: &r [*r]\n",
    "recursive anchor in labels": b"node: &n {name: n1, labels: {x: *n}}\nmemberlist: {bind: '198.51.100.11:7946'}\n",
    "exponential anchors": (b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
                            + b"".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n"
                                       .encode() for i in range(8))
                            + b"node: {name: n1}\nmemberlist: {bind: '198.51.100.11:7946'}\nresources: [*i]\n"),
    "deeply nested": b"node: {name: n1}\nmemberlist: {bind: '198.51.100.11:7946'}\nresources: "
                     + b"[" * 5000 + b"]" * 5000 + b"\n",
    "not UTF-8": GOOD.encode().replace(b"n1", b"n\xff\xfe1"),
    "control characters in node name": GOOD.replace("name: n1", 'name: "n1\\e[31m\\x07"').encode(),
    "newline in a label": GOOD.replace("zone: a", 'zone: "a\\nb"').encode(),
    "health interval NaN": yaml.safe_dump(base(resources=[
        base()["resources"][0], base()["resources"][1],
        svc("web", "198.51.100.200", "Local",
            {"nocloud.io/health-check": '{"type": "tcp", "port": 80, "interval": NaN, "timeout": 1}'})])).encode(),
    "health interval tiny": yaml.safe_dump(base(resources=[
        base()["resources"][0], base()["resources"][1],
        svc("web", "198.51.100.200", "Local",
            {"nocloud.io/health-check": '{"type": "exec", "command": ["true"], "interval": 0.000001,'
                                        ' "timeout": 0.0000001}'})])).encode(),
    "huge bad value": yaml.safe_dump(base(node=["x" * 200] * 5000)).encode(),
    "many bad documents": yaml.safe_dump(base(resources=[{"kind": f"K{i}"} for i in range(5000)])).encode(),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_is_refused_with_bounded_errors(tmp_path, name):
    path = tmp_path / "config.yaml"
    path.write_bytes(HOSTILE[name])
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        cfg = load(path)
        ok, errors = validate(str(path))  # the schema passed: the extra checks must refuse it
        assert not ok, (name, cfg)
        raise ConfigError(errors)
    assert time.monotonic() - t0 < 20
    text = "\n".join(info.value.errors)
    assert 0 < len(text) <= MAX_ERROR_CHARS, len(text)
    assert all(c.isprintable() for c in text.replace("\n", "")), text[:300]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_reload_keeps_last_good_and_validate_agrees(tmp_path, name, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    sp = Speaker(str(path))
    ok, cfg = sp._load()
    assert ok and cfg is not None
    sp.cfg = cfg
    path.write_bytes(HOSTILE[name])
    ok2, cfg2 = sp._load()  # never raises
    assert not ok2 and cfg2 is cfg
    st = sp.holder.status()
    assert st["state"] == "error" and st["errors"] and st["digest"] == cfg.digest
    assert cli_main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert 0 < len(err) <= MAX_ERROR_CHARS + 100


def test_holder_survives_an_unexpected_exception(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text(GOOD)
    holder = ConfigHolder(str(path))
    ok, cfg = holder.reload()
    assert ok

    def boom(_data, _path=""):
        raise KeyError("surprise")

    monkeypatch.setattr("nocloudlb.config.parse", boom)
    path.write_text(GOOD + "# edited\n")  # an unchanged file is not parsed again (digest first)
    ok2, cfg2 = holder.reload()
    assert not ok2 and cfg2 is cfg and "surprise" in holder.errors[0]


def test_key_file_that_is_not_utf8_is_refused_by_validate_and_reload(tmp_path):
    key = tmp_path / "memberlist.key"
    key.write_bytes(b"\xff\xfe not a key\n")
    path = tmp_path / "config.yaml"
    doc = base()
    path.write_text(GOOD)
    sp = Speaker(str(path))
    ok, cfg = sp._load()
    assert ok
    sp.cfg = cfg
    doc["memberlist"]["keyFile"] = str(key)
    path.write_text(yaml.safe_dump(doc))
    ok2, cfg2 = sp._load()  # raised UnicodeDecodeError before
    assert not ok2 and cfg2 is cfg and "not base64 text" in sp.holder.errors[0]
    ok3, errors = validate(str(path))
    assert not ok3 and "not base64 text" in errors[0]
