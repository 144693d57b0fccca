"""Issue 10 (scale): hundreds of VIPs go on lo in one ``ip -batch`` run and come off the same way,
touching only the addresses the speaker added (the operator's stay), recorded in the state file."""

from __future__ import annotations

import ipaddress
import json
import sys

import pytest
from netns import Segment

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def netns_prefix():
    return "sclo"


def _lo(seg: Segment, ns: str) -> dict[str, str]:
    out = json.loads(seg.run(ns, ["ip", "-j", "addr", "show", "dev", "lo"]).stdout)
    return {a["local"]: a.get("label", "") for a in out[0]["addr_info"]}


def test_many_vips_on_lo_in_one_batch_and_only_ours_removed(make_segment, tmp_path):
    seg = make_segment(hosts=1, client=False)
    ns = seg.hosts[0].ns
    state = str(tmp_path / "lo-vips.json")
    v4 = [f"203.0.113.{i}" for i in range(1, 201)]
    first6 = ipaddress.ip_address("2001:db8:100::1")
    v6 = [str(first6 + i) for i in range(200)]
    seg.run(ns, "ip addr add 203.0.113.250/32 dev lo")  # the operator's own, also wanted: used, left
    code = ("import json, sys\nfrom nocloudlb.l2 import delivery\nips = json.loads(sys.argv[1])\n"
            f"print(json.dumps(delivery.sync_lo_vips(ips, state_file={state!r})))")

    def sync(ips: list[str]) -> dict:
        res = seg.run(ns, [sys.executable, "-c", code,
                           json.dumps(ips)])
        return json.loads(res.stdout.strip().splitlines()[-1])

    res = sync(v4 + v6 + ["203.0.113.250"])
    assert sorted(res["added"]) == sorted(v4 + v6) and res["removed"] == []
    lo = _lo(seg, ns)
    assert all(lo.get(ip) == "lo:nocloudlb" for ip in v4) and all(ip in lo for ip in v6)
    assert lo["203.0.113.250"] == "lo"
    assert set(json.loads(open(state).read())["managed"]) == set(v4 + v6)
    assert sync(v4 + v6 + ["203.0.113.250"]) == {"added": [], "removed": []}  # idempotent
    res = sync(v4[:50] + v6[:50])  # most withdrawn
    assert sorted(res["removed"]) == sorted(v4[50:] + v6[50:]) and res["added"] == []
    lo = _lo(seg, ns)
    assert not any(ip in lo for ip in v4[50:] + v6[50:]) and "203.0.113.250" in lo
    res = sync([])
    lo = _lo(seg, ns)
    assert not any(ip in lo for ip in v4 + v6) and "203.0.113.250" in lo and "127.0.0.1" in lo
    assert json.loads(open(state).read()) == {"managed": []}
