"""Delivery: VIPs on lo with arp_ignore=1/arp_announce=2 (the LVS-DR recipe), managed with pyroute2.

Proves on a real segment that the kernel accepts traffic for a VIP on lo but never
answers ARP or NDP for it, and that with arp_ignore=0 every node holding the VIP answers:
the double-owner bug.
"""

from __future__ import annotations

import json
import re

import pytest
from netns import Segment

pytestmark = pytest.mark.timeout(60)

VIP4, VIP6 = "198.51.100.210", "2001:db8:1::210"


def _py(seg: Segment, ns: str, code: str):
    return seg.python_json(ns, "import json\nfrom nocloudlb.l2 import delivery\n" + code)


def _probe(seg: Segment, ip: str) -> list[str]:
    found = seg.python_json(seg.client.ns, f"import json; from nocloudlb.l2 import probe; "
                                           f"print(json.dumps(probe({ip!r}, 'eth0', 0.4)))")
    return sorted(f["mac"] for f in found)


def _lo(seg: Segment, ns: str) -> dict[str, str]:
    out = json.loads(seg.run(ns, ["ip", "-j", "addr", "show", "dev", "lo"]).stdout)
    return {a["local"]: a.get("label", "") for a in out[0]["addr_info"]}


def test_prepare_host_and_sync_lo_vips_touch_only_their_own(segment, tmp_path):
    seg = segment
    n1 = seg.hosts[0]
    state = str(tmp_path / "lo-vips.json")
    changed = _py(seg, n1.ns, "print(json.dumps(delivery.prepare_host()))")
    assert changed == {"net.ipv4.conf.all.arp_ignore": {"old": "0", "new": "1"},
                       "net.ipv4.conf.all.arp_announce": {"old": "0", "new": "2"}}
    assert _py(seg, n1.ns, "print(json.dumps([delivery.prepare_host(), delivery.check_host()]))") == [{}, []]
    # An address the operator put on lo before us.
    seg.run(n1.ns, "ip addr add 198.51.100.250/32 dev lo")
    res = _py(seg, n1.ns, f"print(json.dumps(delivery.sync_lo_vips({[VIP4, VIP6, '198.51.100.250']!r}, "
                          f"state_file={state!r})))")
    assert res == {"added": [VIP4, VIP6], "removed": []}
    lo = _lo(seg, n1.ns)
    assert lo[VIP4] == "lo:nocloudlb" and VIP6 in lo and lo["198.51.100.250"] == "lo"
    addr6 = json.loads(seg.run(n1.ns, ["ip", "-j", "-6", "addr", "show", "dev", "lo"]).stdout)[0]["addr_info"]
    assert [a["prefixlen"] for a in addr6 if a["local"] == VIP6] == [128]
    assert json.loads(open(state).read()) == {"managed": [VIP4, VIP6]}
    # Idempotent; then everything withdrawn: only our two go, the operator's stays.
    again = f"delivery.sync_lo_vips({[VIP4, VIP6, '198.51.100.250']!r}, state_file={state!r})"
    assert _py(seg, n1.ns, f"print(json.dumps({again}))") == {"added": [], "removed": []}
    res = _py(seg, n1.ns, f"print(json.dumps(delivery.sync_lo_vips([], state_file={state!r})))")
    assert res == {"added": [], "removed": [VIP4, VIP6]}
    lo = _lo(seg, n1.ns)
    assert VIP4 not in lo and VIP6 not in lo and "198.51.100.250" in lo and "127.0.0.1" in lo
    # Without the state file, an IPv4 VIP is still recognised as ours by its label.
    _py(seg, n1.ns, f"delivery.sync_lo_vips([{VIP4!r}], state_file={state!r}); print(1)")
    res = _py(seg, n1.ns, f"print(json.dumps(delivery.sync_lo_vips([], state_file={state + '.new'!r})))")
    assert res == {"added": [], "removed": [VIP4]}
    with pytest.raises(Exception, match="'nope' is not an IP address"):
        _py(seg, n1.ns, f"delivery.sync_lo_vips(['nope'], state_file={state!r})")


def test_kernel_accepts_vip_on_lo_but_never_answers_and_arp_ignore_0_double_owner(segment, tmp_path):
    seg = segment
    n1, n2 = seg.hosts[0], seg.hosts[1]
    for h in (n1, n2):
        _py(seg, h.ns, f"delivery.prepare_host(); delivery.sync_lo_vips({[VIP4, VIP6]!r}, "
                       f"state_file={str(tmp_path / h.ns)!r}); print(1)")
    # No kernel answers ARP or NS for the VIP, from either node.
    assert _probe(seg, VIP4) == []
    assert _probe(seg, VIP6) == []
    ndisc = seg.run(seg.client.ns, ["ndisc6", "-n", "-r", "1", "-w", "300", VIP6, "eth0"], check=False)
    assert ndisc.returncode != 0 and "Target link-layer" not in ndisc.stdout
    # Yet traffic for it is delivered: with the neighbour entry pinned to n1, pings answer.
    seg.run(seg.client.ns, f"ip neigh replace {VIP4} lladdr {n1.mac} dev eth0 nud permanent && "
                           f"ip neigh replace {VIP6} lladdr {n1.mac} dev eth0 nud permanent")
    seg.run(seg.client.ns, ["ping", "-c", "1", "-W", "2", VIP4])
    seg.run(seg.client.ns, ["ping", "-6", "-c", "1", "-W", "2", VIP6])
    # The replies really came from n1 (its counters moved), not from some other path.

    def echoes(ns: str) -> int:
        out = seg.run(ns, ["nstat", "-az", "IcmpInEchos"]).stdout
        return int(re.search(r"IcmpInEchos\s+(\d+)", out).group(1))

    assert (echoes(n1.ns), echoes(n2.ns)) == (1, 0)
    # arp_ignore=0 (the default): every node holding the VIP answers. Two owners.
    for h in (n1, n2):
        seg.run(h.ns, ["sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=0"])
    assert _probe(seg, VIP4) == sorted([n1.mac, n2.mac])
    # And check_host() says what is wrong.
    problems = _py(seg, n1.ns, "print(json.dumps(delivery.check_host()))")
    assert problems == ["sysctl net.ipv4.conf.all.arp_ignore is 0, must be 1"]
