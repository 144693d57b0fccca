"""The namespace harness itself: a segment is wired as documented and leaves nothing behind."""

from __future__ import annotations

import subprocess

import pytest
from netns import NetnsError, leftover_namespaces, make_segment


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_segment_wiring_and_teardown(netns_prefix):
    seg = make_segment(netns_prefix, hosts=2)
    procs = []
    try:
        assert [h.ns for h in seg.hosts] == [f"{seg.prefix}-n1", f"{seg.prefix}-n2"]
        assert seg.client.ns == f"{seg.prefix}-c"
        assert set(seg.namespaces) <= _netns_names()
        # Every host reaches every other over IPv4 and IPv6, and sees the right MAC.
        for h in seg.hosts:
            seg.run(seg.client.ns, ["ping", "-c1", "-W2", h.ipv4])
            seg.run(seg.client.ns, ["ping", "-6", "-c1", "-W2", h.ipv6])
            neigh = seg.run(seg.client.ns, ["ip", "neigh", "show", h.ipv4]).stdout
            assert h.mac in neigh
            assert seg.mac(h.ns) == h.mac
        assert len({h.mac for h in [*seg.hosts, seg.client]}) == 3
        # The machine's own interfaces are untouched: a host namespace sees only lo and eth0.
        links = seg.run(seg.hosts[0].ns, ["ip", "-o", "link"]).stdout
        assert sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()) == ["eth0", "lo"]
        procs.append(seg.popen(seg.hosts[0].ns, ["sleep", "300"]))
        with pytest.raises(NetnsError, match="failed"):
            seg.run(seg.client.ns, ["false"])
    finally:
        seg.close()
    assert procs[0].poll() is not None, "popen'd process survived teardown"
    assert not set(seg.namespaces) & _netns_names()
    assert seg.prefix not in " ".join(leftover_namespaces(netns_prefix))


def test_fixture_prefix_is_unique(make_segment):
    a = make_segment(hosts=1, client=False)
    b = make_segment(hosts=1, client=False)
    assert a.prefix != b.prefix
    assert a.prefix.startswith("nl2-") and b.prefix.startswith("nl2-")
    assert a.client.ns == ""
