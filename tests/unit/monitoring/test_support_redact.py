"""support-bundle's redaction: secrets go, the rest of the config stays as it was."""

from __future__ import annotations

from nocloudlb.support import REDACTED, redact


def test_secret_values_are_redacted_everywhere_and_nothing_else():
    doc = {
        "node": {"name": "n1", "labels": {"zone": "a"}},
        "memberlist": {"keyFile": "/etc/nocloudlb/memberlist.key", "bind": "198.51.100.11:7946"},
        "resources": [
            {"kind": "BGPPeer", "metadata": {"name": "r1"},
             "spec": {"peerAddress": "198.51.100.1", "password": "s3cret", "passwordSecret": {"name": "bgp"}}},
            {"kind": "Secret", "metadata": {"name": "bgp"}, "data": {"password": "czNjcmV0"}},
            {"kind": "IPAddressPool", "metadata": {"name": "web"}, "spec": {"addresses": ["198.51.100.200/29"]}},
        ],
        "token": "abc",
    }
    out = redact(doc)
    assert out["memberlist"] == doc["memberlist"]  # a path, not a key
    assert out["resources"][0]["spec"] == {"peerAddress": "198.51.100.1", "password": REDACTED,
                                           "passwordSecret": {"name": REDACTED}}
    assert out["resources"][1]["data"] == {"password": REDACTED}
    assert out["resources"][2] == doc["resources"][2]
    assert out["token"] == REDACTED and out["node"] == doc["node"]
    assert "s3cret" not in repr(out) and "czNjcmV0" not in repr(out)
