"""A BGPPeer's passwordFile: read at every (re)load on the node; missing -> refused, last good kept, never shown."""

from __future__ import annotations

import yaml
from nocloudlb.bgp.render import render
from nocloudlb.cli import main as cli_main
from nocloudlb.core.bgp import bgp_decision
from nocloudlb.core.election import NodeView
from nocloudlb.daemon import Speaker, validate
from test_speaker_config_state import base

SECRET = "Frr-md5.key_42"


def bgp_config(tmp_path, password_file: str) -> str:
    doc = base()
    doc["stateDir"] = str(tmp_path / "state")
    doc["socket"] = str(tmp_path / "s.sock")
    doc["resources"] = [
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "bgp"},
         "spec": {"addresses": ["203.0.113.10-203.0.113.20"]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "BGPAdvertisement", "metadata": {"name": "bgp"},
         "spec": {"ipAddressPools": ["bgp"]}},
        {"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer", "metadata": {"name": "r1"},
         "spec": {"myASN": 64512, "peerASN": 64500, "peerAddress": "198.51.100.1", "passwordFile": password_file}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "prod"},
         "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
         "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}},
    ]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_validate_and_reload_refuse_a_missing_password_file(tmp_path, capsys):
    pw = tmp_path / "r1.password"
    pw.write_text(SECRET + "\n")
    path = bgp_config(tmp_path, str(pw))
    assert validate(path) == (True, [])
    sp = Speaker(path)
    ok, cfg = sp._load()
    assert ok and cfg is not None and cfg.parsed.bgp_peers[0].password == SECRET
    sp.cfg = cfg
    # the file the speaker would render from carries the password; the redacted text does not
    decision = bgp_decision("n1", [NodeView("n1", {}, "alive", frozenset())], cfg.parsed)
    rendered = render("n1", decision, cfg.parsed)
    assert f"neighbor 198.51.100.1 password {SECRET}" in rendered.text and SECRET not in rendered.redacted

    pw.unlink()
    ok2, cfg2 = sp._load()
    assert not ok2 and cfg2 is cfg  # last good kept
    st = sp.holder.status()
    assert st["state"] == "error" and st["errors"] == [
        f'BGPPeer "r1": spec.passwordFile: password file "{pw}" not found']
    assert cli_main(["validate", path]) == 1
    err = capsys.readouterr().err
    assert "spec.passwordFile" in err and str(pw) in err and SECRET not in err


def test_password_file_with_a_password_frr_cannot_take(tmp_path):
    pw = tmp_path / "r1.password"
    pw.write_text("has space\n")
    ok, errors = validate(bgp_config(tmp_path, str(pw)))
    assert not ok and errors == [f'BGPPeer "r1": spec.passwordFile: password file "{pw}": invalid BGP password: only '
                                 "printable ASCII without spaces, '!' or '#' fits on FRR's \"neighbor ... password\" "
                                 "line"]
