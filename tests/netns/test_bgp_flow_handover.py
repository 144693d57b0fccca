"""Point 8's flow handover on the wire (bgp/flows.py): a rehash moves held connections to a node
that does not know them, and none of them is reset.

Two nodes hold the VIP on lo and run an echo server; each has the flow-handover tables that the
speaker writes (``FlowHandover``, the real nft and ip in its namespace). The client's route to
the VIP stands for the router's ECMP choice: it goes through n1 while the connections open, then
through n2 (what a drain of n1 does at the router). Found with the molecule scenario bgp, where
0 to 13 of a drained node's ~40 connections broke: every segment is sent at once on all
connections, as a rehash delivers them, and with nft's default limit burst (5 segments) n2
answered most of them with resets.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from nocloudlb.bgp.flows import FLOW_TABLE, FlowHandover, netlink_resolver
from prometheus_client import REGISTRY

VIP, PORT = "203.0.113.10", 8093
VIP2 = "203.0.113.11"
DEAD = "192.0.2.66"  # a peer n2 cannot reach: a blackhole route to it (the route lookup fails)

SERVER = r"""
import socket, socketserver, sys
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(4096)
            if not data:  # the client's FIN (a half-close): answer, then close
                self.request.sendall(b"bye")
                return
            self.request.sendall(data)
class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512
Server(("0.0.0.0", int(sys.argv[1])), Echo).serve_forever()
"""

# opens N connections, says "ready", waits for a line on stdin (the route moved), then sends one
# byte on every connection at once, reads every echo, twice; then half-closes the first one and
# reads to its end. Prints {"reset": r, "silent": s, "ok": o, "half_close": "..."}.
CLIENT = r"""
import json, socket, sys
vip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conns = [socket.create_connection((vip, port), timeout=5) for _ in range(n)]
for c in conns:
    c.sendall(b"a")
    assert c.recv(1) == b"a"
print("ready", flush=True)
sys.stdin.readline()
state = ["ok"] * n
for _round in range(2):
    for i, c in enumerate(conns):
        if state[i] == "ok":
            try:
                c.sendall(b"x")
            except OSError:
                state[i] = "reset"
    for i, c in enumerate(conns):
        if state[i] != "ok":
            continue
        c.settimeout(float(sys.argv[4]))
        try:
            if c.recv(1) != b"x":
                state[i] = "reset"
        except ConnectionResetError:
            state[i] = "reset"
        except OSError:
            state[i] = "silent"
half = "not tried"
if state[0] == "ok":
    conns[0].shutdown(socket.SHUT_WR)
    conns[0].settimeout(5)
    got = b""
    try:
        while True:
            chunk = conns[0].recv(16)
            if not chunk:
                break
            got += chunk
        half = got.decode()
    except OSError as exc:
        half = type(exc).__name__
print(json.dumps({"reset": state.count("reset"), "silent": state.count("silent"), "ok": state.count("ok"),
                  "half_close": half}), flush=True)
"""


@pytest.fixture
def netns_prefix() -> str:
    return "nfh"


def _runner(seg, ns):
    def run(argv: list[str], stdin: str | None = None) -> str:
        return seg.run(ns, argv, input=stdin, timeout=30).stdout
    return run


def _setup(seg, rate: int | None = None, burst: int | None = None, dead: tuple[str, ...] = ()):
    n1, n2 = seg.hosts
    for h in (n1, n2):
        seg.run(h.ns, ["ip", "addr", "add", f"{VIP}/32", "dev", "lo"])
        seg.popen(h.ns, [sys.executable, "-c", SERVER, str(PORT)], stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL)
    seg.run(n1.ns, ["ping", "-c1", "-W2", n2.ipv4])  # the neighbour entries the handover reads
    handovers = []
    for me, other in ((n1, n2), (n2, n1)):
        kw = {} if rate is None else {"rate": rate, "burst": burst}
        fh = FlowHandover([*(dead if me is n2 else ()), other.ipv4], _runner(seg, me.ns),
                          resolve=netlink_resolver(me.ns), **kw)
        fh.refresh({VIP})
        assert fh.status()["active"], fh.status()
        handovers.append(fh)
    seg.run(seg.client.ns, ["ip", "route", "add", f"{VIP}/32", "via", n1.ipv4])
    for h in (n1, n2):  # both servers listen
        seg.run(h.ns, ["sh", "-c", f"for i in $(seq 50); do ss -Hltn sport = :{PORT} | grep -q . && exit 0; "
                                   "sleep 0.1; done; exit 1"])
    return n1, n2, handovers


def _move(seg, n2, conns: int, wait: float) -> dict:
    client = seg.popen(seg.client.ns, [sys.executable, "-u", "-c", CLIENT, VIP, str(PORT), str(conns), str(wait)],
                       stdin=subprocess.PIPE)
    assert client.stdout is not None and client.stdin is not None
    assert client.stdout.readline().strip() == "ready", client.stderr.read() if client.stderr else ""
    seg.run(seg.client.ns, ["ip", "route", "replace", f"{VIP}/32", "via", n2.ipv4])  # the rehash
    client.stdin.write("go\n")
    client.stdin.flush()
    out, err = client.communicate(timeout=120)
    assert out.strip(), err
    return json.loads(out.strip().splitlines()[-1])


def test_a_burst_of_moved_connections_is_handed_over_and_closes_on_its_node(make_segment):
    seg = make_segment(hosts=2, client=True)
    _n1, n2, _fh = _setup(seg)
    result = _move(seg, n2, 200, 3.0)
    # the old rules (limit without burst: 5 segments) reset most of the 200 here
    assert result == {"reset": 0, "silent": 0, "ok": 200, "half_close": "bye"}, result


def test_over_the_limit_a_segment_is_dropped_not_reset(make_segment):
    seg = make_segment(hosts=2, client=True)
    _n1, n2, _fh = _setup(seg, rate=1, burst=1)
    result = _move(seg, n2, 20, 0.5)
    # one copy a second: most segments wait for a retransmission, none is answered with a reset
    assert result["reset"] == 0 and result["silent"] > 0, result


def test_an_unreachable_peer_never_stops_the_refresh_toward_the_others(make_segment):
    # n2's route lookup for a blackholed peer once failed the whole refresh with it,
    # and n2 handed nothing over to n1 (the old code raised here, before any table was written)
    seg = make_segment(hosts=2, client=True)
    n2 = seg.hosts[1]
    seg.run(n2.ns, ["ip", "route", "add", "blackhole", f"{DEAD}/32"])
    n1, n2, handovers = _setup(seg, dead=(DEAD,))
    fh = handovers[-1]
    st = fh.status()
    assert st["peers"] == [n1.ipv4] and st["active"], st
    assert st["peerErrors"][DEAD]["state"] == "backoff" and st["peerErrors"][DEAD]["failures"] == 1, st
    assert f"route lookup of {DEAD}: Invalid argument" in st["peerErrors"][DEAD]["error"], st
    assert REGISTRY.get_sample_value("nocloudlb_backoff_tool_failures_total", {"tool": f"bgp-flows-peer {DEAD}"}) == 1
    # the tables go away (`nft flush ruleset` elsewhere) and the VIPs change: the next refresh, with the dead
    # peer still backing off, writes both VIPs with the copy to n1
    seg.run(n2.ns, ["nft", "delete", "table", "ip", FLOW_TABLE])
    fh.refresh({VIP, VIP2})
    listed = seg.run(n2.ns, ["nft", "list", "table", "ip", FLOW_TABLE]).stdout
    assert VIP2 in listed and f"dup to {n1.ipv4}" in listed and DEAD not in listed, listed
    fh.refresh({VIP})
    result = _move(seg, n2, 50, 3.0)
    assert result == {"reset": 0, "silent": 0, "ok": 50, "half_close": "bye"}, result
