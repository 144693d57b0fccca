"""The L2 layer's fast address reading (``nocloudlb.l2.addresses.parse``: inet_pton, 10,000 VIPs on the
decision path) gives exactly what ``ipaddress`` gives, for canonical and other spellings alike, and the
lo sync's sort key orders as (version, integer) did."""

from __future__ import annotations

import ipaddress
import random

import pytest
from nocloudlb.l2.addresses import canonical_ips, parse
from nocloudlb.l2.delivery import _sort_key

EDGES = ["::", "::1", "1::", "2001:db8::1", "2001:db8:0:1:0:0:0:1", "2001:0:0:1::1", "2001:db8::", "0.0.0.0",
         "255.255.255.255", "::ffff:1.2.3.4", "::ffff:102:304", "::1.2.3.4", "::102:304", "fe80::1%eth0",
         "2001:DB8::1", "1:0:0:0:0:0:0:0", "0:0:0:0:0:0:0:1", "1:0:1:0:0:1:0:0", "2001:db8:0:0:1:0:0:1",
         "198.51.100.010", "01.2.3.4", "1.2.3", "1.2.3.4.5", "", "x", "2001:db8::1::2", " 1.2.3.4", "::ffff:0:0"]


def spellings(rng: random.Random, n: int) -> list[str]:
    out = list(EDGES)
    for _i in range(n):
        words = [rng.choice([0, 0, 0, 1, 0xFFFF, rng.randrange(65536)]) for _w in range(8)]
        a = ipaddress.IPv6Address(b"".join(w.to_bytes(2, "big") for w in words))
        out += [str(a), a.exploded, str(ipaddress.IPv4Address(rng.randrange(2**32)))]
    return out


def reference(ip: str):
    try:
        a = ipaddress.ip_address(ip)
    except ValueError:
        return None
    return str(a), a.packed, a.version


def test_parse_is_ipaddress():
    for ip in spellings(random.Random(5), 20000):
        try:
            got = parse(ip)
        except ValueError:
            got = None
        assert got == reference(ip), ip


def test_canonical_ips_names_the_bad_entry():
    assert canonical_ips(["2001:DB8::1", "198.51.100.1"], "x:") == ["2001:db8::1", "198.51.100.1"]
    with pytest.raises(ValueError, match="sync_lo_vips: '203.0.113.300' is not an IP address"):
        canonical_ips(["203.0.113.300"], "sync_lo_vips:")


def test_lo_sort_key_orders_as_version_then_integer():
    ips = [ip for ip in spellings(random.Random(6), 3000) if reference(ip) is not None and "%" not in ip]
    want = sorted(ips, key=lambda ip: (ipaddress.ip_address(ip).version, int(ipaddress.ip_address(ip))))
    assert sorted(ips, key=_sort_key) == want
