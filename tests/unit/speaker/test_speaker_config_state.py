"""Config loading (the core's messages, last good kept), runtime labels persisted atomically."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from nocloudlb.config import ConfigHolder, load, parse
from nocloudlb.core.errors import ConfigError
from nocloudlb.daemon import validate
from nocloudlb.membership import generate_key
from nocloudlb.state import LabelStore, atomic_write

POOL = {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "default"},
        "spec": {"addresses": ["198.51.100.200-198.51.100.220"]}}
L2 = {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "default"},
      "spec": {"ipAddressPools": ["default"]}}


def svc(name: str, ip: str, policy: str = "Cluster", annotations: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "prod", "annotations": annotations or {}},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": policy,
                     "ports": [{"port": 80, "protocol": "TCP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}


# a cluster (join names another member) needs a key file: one for every base() config, removed at exit
_KEY_DIR = tempfile.TemporaryDirectory(prefix="nocloudlb-test-key-")
KEY_FILE = Path(_KEY_DIR.name) / "memberlist.key"
KEY_FILE.write_text(generate_key() + "\n")


def base(**over) -> dict:
    doc = {"node": {"name": "n1", "labels": {"zone": "a"}},
           "memberlist": {"bind": "198.51.100.11:7946", "join": ["198.51.100.11:7946", "198.51.100.12:7946"],
                          "keyFile": str(KEY_FILE), "profile": "fast", "probeInterval": 0.25},
           "stateDir": "/tmp/x", "socket": "/tmp/x.sock", "metrics": {"bind": ""},
           "resources": [POOL, L2, svc("web", "198.51.100.200")]}
    doc.update(over)
    return doc


def test_good_config_parses():
    cfg = parse(base())
    assert cfg.node_name == "n1" and cfg.node_labels == {"zone": "a"}
    assert cfg.profile == "fast" and cfg.overrides == {"probe_interval": 0.25}
    assert [s.key for s in cfg.parsed.services] == ["prod/web"]
    assert cfg.metrics_bind == "" and len(cfg.digest) == 8


def test_every_problem_reported_at_once_with_field_and_value():
    bad = base(memberlist={"bind": "nope", "join": ["1.2.3.4:99999"], "profile": "slow", "probeIntervall": 1},
               node={"labels": []}, extra=1)
    bad["resources"] = [dict(POOL, spec={"addresses": ["198.51.100.300/32"]})]
    with pytest.raises(ConfigError) as err:
        parse(bad)
    text = str(err.value)
    for needle in ("unknown key 'extra'", "node.name: None", "node.labels: must be a mapping",
                   "memberlist.bind: 'nope'", "memberlist.join[0]: '1.2.3.4:99999'", "memberlist.profile: 'slow'",
                   "unknown key 'probeIntervall'", "198.51.100.300/32"):
        assert needle in text, (needle, text)


@pytest.mark.parametrize(("handover", "grace", "error"), [
    (None, 30.0, None),
    ({"grace": 0}, 0.0, None),
    ({"grace": 7.5}, 7.5, None),
    ({"grace": -1}, None, "handover.grace: -1 must be a number of seconds from 0 (off) to 3600"),
    ({"grace": "30"}, None, "handover.grace: '30' must be a number"),
    ({"grace": True}, None, "handover.grace: True must be a number"),
    ({"grase": 3}, None, "handover: must be a mapping like {grace: 30}, got {'grase': 3}"),
    ([30], None, "handover: must be a mapping"),
])
def test_handover_grace(handover, grace, error):
    doc = base() if handover is None else base(handover=handover)
    if error:
        with pytest.raises(ConfigError, match=re.escape(error)):
            parse(doc)
    else:
        assert parse(doc).handover_grace == grace


def test_kinship_rejects_bad_timing_naming_the_field():
    with pytest.raises(ConfigError, match="memberlist: .*gossip_interval|memberlist: .*probe"):
        parse(base(memberlist={"bind": "198.51.100.11:7946", "profile": "fast", "probeInterval": 0.1,
                               "gossipInterval": 0.5}))


def test_holder_keeps_last_good(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base()))
    holder = ConfigHolder(str(path))
    ok, cfg = holder.reload()
    assert ok and holder.status()["state"] == "ok"
    good_at = holder.last_good_at
    bad = base()
    bad["resources"] = [dict(POOL, spec={"addresses": ["not-an-ip"]}), L2]
    path.write_text(yaml.safe_dump(bad))
    ok2, cfg2 = holder.reload()
    assert not ok2 and cfg2 is cfg
    st = holder.status()
    assert st["state"] == "error" and any("not-an-ip" in e for e in st["errors"])
    assert st["lastGoodAt"] == good_at and st["digest"] == cfg.digest


def test_validate_command_checks_key_file_and_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    doc = base()
    doc["memberlist"]["keyFile"] = str(tmp_path / "missing.key")
    path.write_text(yaml.safe_dump(doc))
    ok, errors = validate(str(path))
    assert not ok and "memberlist.keyFile" in errors[0] and "missing.key" in errors[0]
    path.write_text("node: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(path)


def test_label_store_persists_and_survives_reload(tmp_path):
    store = LabelStore(tmp_path / "state")
    assert store.apply({"zone": "a"}) == {"zone": "a"}
    store.update({"node.kubernetes.io/exclude-from-external-load-balancers": ""}, ["zone"])
    again = LabelStore(tmp_path / "state")
    assert again.apply({"zone": "a", "rack": "1"}) == {
        "rack": "1", "node.kubernetes.io/exclude-from-external-load-balancers": ""}
    again.update(None, ["node.kubernetes.io/exclude-from-external-load-balancers"])
    again.update({"zone": "b"})
    assert LabelStore(tmp_path / "state").apply({"zone": "a"}) == {"zone": "b"}
    assert json.loads((tmp_path / "state" / "labels.json").read_text())["set"] == {"zone": "b"}
    # no temp files left behind
    assert os.listdir(tmp_path / "state") == ["labels.json"]


def test_atomic_write_leaves_old_file_when_write_fails(tmp_path):
    target = tmp_path / "f.json"
    atomic_write(target, b"old")

    with pytest.raises(TypeError):
        atomic_write(target, object())  # type: ignore[arg-type]
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.json"]


def test_corrupt_label_file_is_set_aside_not_raised(tmp_path):
    """A corrupt file no longer stops the speaker (test_state_files_corrupt.py has the whole rule)."""
    (tmp_path / "labels.json").write_text("{oops")
    store = LabelStore(tmp_path)
    assert store.corrupt["reason"].startswith("not JSON")
    assert "node.kubernetes.io/exclude-from-external-load-balancers" in store.apply({})


def test_cli_validate_and_keygen(tmp_path, capsys):
    from nocloudlb.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base()))
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: ok"
    bad = base()
    bad["memberlist"]["profile"] = "turbo"
    path.write_text(yaml.safe_dump(bad))
    assert main(["validate", str(path)]) == 1
    assert "memberlist.profile: 'turbo' is not one of fast, lan" in capsys.readouterr().err
    assert main(["keygen"]) == 0
    key = capsys.readouterr().out.strip()
    (tmp_path / "k").write_text(key + "\n")
    from nocloudlb.membership import read_key_file

    assert read_key_file(tmp_path / "k") == [key]
    with pytest.raises(SystemExit) as exc:
        main(["status", "--socket", str(tmp_path / "nope.sock")])
    assert exc.value.code == 2 and "cannot reach the speaker" in capsys.readouterr().err
