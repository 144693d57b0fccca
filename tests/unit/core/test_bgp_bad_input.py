# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 9's "Bad input": BGP resources FRR or MetalLB would refuse are refused at load, naming field and value.

The same messages come out of ``pool_validate`` (test_pool_validate.py), ``nocloudlb validate`` and
the speaker's reload (tests/unit/speaker/test_bgp_password_file.py), which all call these functions.
"""

from __future__ import annotations

import pytest
from conftest import bfd, bgpadv, errors_of, peer, pool
from nocloudlb.core.bgp import read_password_files
from nocloudlb.core.schema import parse_resources

POOL = pool("p", "203.0.113.0/28")
ADV = bgpadv("adv")

CASES = [
    ("hold above 65535", [POOL, ADV, peer(holdTime="65536s")],
     ['BGPPeer "router": spec.holdTime: invalid BGPPeer timers: invalid hold time "65536s": must be at most 65535s '
      "(BGP's 16-bit field; FRR refuses more)"]),
    ("hold from keepalive above 65535", [POOL, ADV, peer(keepaliveTime="7h")],
     ['BGPPeer "router": spec.holdTime: invalid BGPPeer timers: invalid hold time "75600s": must be at most 65535s '
      "(BGP's 16-bit field; FRR refuses more)"]),
    ("hold of 1s", [POOL, ADV, peer(holdTime="1s", keepaliveTime="1s")],
     ['BGPPeer "router": spec.holdTime: invalid BGPPeer timers: invalid hold time "1s": must be 0 or >=3s']),
    ("keepalive with hold 0", [POOL, ADV, peer(holdTime="0s", keepaliveTime="1s")],
     ['BGPPeer "router": spec.keepaliveTime: invalid BGPPeer timers: invalid keepaliveTime "1s", must be lower than '
      'holdTime "0s"']),
    ("peer ASN out of range", [POOL, ADV, peer(peerASN=-1)],
     ['BGPPeer "router": spec.peerASN: invalid value -1, must be in 0-4294967295 range',
      'BGPPeer "router": spec.peerASN: missing peer ASN and dynamicASN']),
    ("local ASN out of range", [POOL, ADV, peer(localASN=0)],
     ['BGPPeer "router": spec.localASN: invalid value 0, must be in 1-4294967295 range']),
    ("bfd interval out of range", [POOL, ADV, bfd("fast", receiveInterval=5), peer(bfdProfile="fast")],
     ['BFDProfile "fast": spec.receiveInterval: invalid receive interval value: invalid value 5, must be in 10-60000 '
      "range"]),
    ("bfd multiplier out of range", [POOL, ADV, bfd("fast", detectMultiplier=256)],
     ['BFDProfile "fast": spec.detectMultiplier: invalid detect multiplier value: invalid value 256, must be in '
      "2-255 range"]),
    ("password file relative", [POOL, ADV, peer(passwordFile="etc/pw")],
     ["BGPPeer \"router\": spec.passwordFile: must be an absolute path, got 'etc/pw'"]),
    ("password file and password", [POOL, ADV, peer(password="abc", passwordFile="/etc/pw")],
     ['BGPPeer "router": spec.passwordFile: can not have both passwordFile and password or passwordSecret set in '
      'peer config "router"']),
    ("password with a space", [POOL, ADV, peer(password="two words")],
     ["BGPPeer \"router\": spec.password: invalid BGP password: only printable ASCII without spaces, '!' or '#' fits "
      "on FRR's \"neighbor ... password\" line"]),
    ("password too long", [POOL, ADV, peer(password="x" * 81)],
     ['BGPPeer "router": spec.password: invalid BGP password: longer than 80 bytes (the TCP MD5 key limit)']),
    ("advertisement selecting no pool", [POOL, dict(pool("q", "203.0.113.32/28"), metadata={"name": "q"}),
                                         bgpadv("adv", ipAddressPoolSelectors=[{"matchLabels": {"use": "bgp"}}])],
     ['BGPAdvertisement "adv": spec.ipAddressPoolSelectors: BGPAdvertisement "adv" selects no IPAddressPool '
      '(defined pools: "p", "q")']),
    ("advertisement without any pool", [bgpadv("adv"), peer()],
     ['BGPAdvertisement "adv": spec: BGPAdvertisement "adv" selects no IPAddressPool (defined pools: none)']),
    ("unknown pool named once", [POOL, bgpadv("adv", ipAddressPools=["nope"])],
     ['BGPAdvertisement "adv": spec.ipAddressPools[0]: unknown pool "nope" (defined pools: "p")']),
]


@pytest.mark.parametrize("docs, expected", [pytest.param(d, e, id=i) for i, d, e in CASES])
def test_refused(docs, expected):
    assert errors_of(docs) == expected


@pytest.mark.parametrize("hold, keepalive", [("65535s", "21845s"), ("3s", "1s"), ("0s", "0s"), ("90s", None),
                                             ("3500ms", None)])
def test_accepted_timers_reach_frr_in_range(hold, keepalive):
    config = parse_resources([POOL, ADV, peer(holdTime=hold, keepaliveTime=keepalive)])
    (p,) = config.bgp_peers
    assert p.hold_time is not None and p.keepalive_time is not None
    assert int(p.hold_time) in range(0, 65536) and int(p.keepalive_time) <= int(p.hold_time) or int(p.hold_time) == 0


def test_password_file_fills_the_peer_and_no_message_shows_it(tmp_path):
    secret = "S3cret-file.Password"
    (tmp_path / "pw").write_text(secret + "\n")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "spaced").write_text("a b\n")
    (tmp_path / "dir").mkdir()
    docs = [POOL, ADV,
            peer("ok", peerAddress="198.51.100.1", passwordFile=str(tmp_path / "pw")),
            peer("missing", peerAddress="198.51.100.2", passwordFile=str(tmp_path / "absent")),
            peer("empty", peerAddress="198.51.100.3", passwordFile=str(tmp_path / "empty")),
            peer("spaced", peerAddress="198.51.100.4", passwordFile=str(tmp_path / "spaced")),
            peer("dir", peerAddress="198.51.100.5", passwordFile=str(tmp_path / "dir"))]
    config = parse_resources(docs)
    assert [p.password for p in config.bgp_peers] == ["", "", "", "", ""]  # the schema reads no file
    errors = read_password_files(config)
    assert errors == [
        f'BGPPeer "missing": spec.passwordFile: password file "{tmp_path}/absent" not found',
        f'BGPPeer "empty": spec.passwordFile: password file "{tmp_path}/empty": invalid BGP password: empty',
        f'BGPPeer "spaced": spec.passwordFile: password file "{tmp_path}/spaced": invalid BGP password: only '
        "printable ASCII without spaces, '!' or '#' fits on FRR's \"neighbor ... password\" line",
        f'BGPPeer "dir": spec.passwordFile: password file "{tmp_path}/dir" cannot be read: Is a directory',
    ]
    assert config.bgp_peers[0].password == secret
    assert not any(secret in e or "a b" in e for e in errors)


def test_password_file_reader_is_injectable():
    config = parse_resources([POOL, ADV, peer(passwordFile="/etc/nocloudlb/bgp/router.password")])
    seen = []
    assert read_password_files(config, lambda path: seen.append(path) or "from-reader") == []
    assert seen == ["/etc/nocloudlb/bgp/router.password"] and config.bgp_peers[0].password == "from-reader"
