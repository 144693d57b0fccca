"""A director whose speaker is killed and started again keeps forwarding (issue 21, point 5).

In BGP mode the router goes on sending a VIP to a node whose speaker was killed (FRR keeps
announcing it) and the node holds the VIP on lo. Found with the molecule scenario ``bgp``: per
``kill -9`` of a speaker, 15-22 of about 1,300 new connections to the DR VIP in 6 s were refused by
the node's own TCP, because ``DataplaneMode.start`` deleted the tables and the first programming,
before the backends' checks had a result, wrote them without servers. Here: directors n1 (the
client's next hop) with the VIP on lo as BGP mode holds it, real servers n3, n4 by DR with Maglev and
a TCP check; the director is killed and started again while the client opens connections.
"""

from __future__ import annotations

import json
import sys
import time

import pytest
from dataplane_harness import VIP, directors, in_table, point_client, prepare, resources

HEALTH = '{"type": "tcp", "interval": 0.5, "timeout": 0.4, "rise": 2, "fall": 2}'

# opens a connection to VIP:80 every 2 ms for SECONDS s; prints {"ok": n, "failed": {error: n}}
LOOP = r"""
import json, socket, sys, time
vip, seconds = sys.argv[1], float(sys.argv[2])
ok, failed, end = 0, {}, time.monotonic() + seconds
while time.monotonic() < end:
    try:
        s = socket.create_connection((vip, 80), timeout=2)
        s.sendall(b"hi\n")
        if not s.recv(100):
            raise ConnectionError("closed")
        s.close()
        ok += 1
    except OSError as exc:
        failed[type(exc).__name__] = failed.get(type(exc).__name__, 0) + 1
    time.sleep(0.002)
print(json.dumps({"ok": ok, "failed": failed}), flush=True)
"""


@pytest.fixture
def netns_prefix() -> str:
    return "ndr"


@pytest.fixture
def lab(make_segment):
    seg = make_segment(hosts=4)
    with directors(seg) as director:
        yield seg, director


def test_a_killed_director_starts_again_without_refusing_a_connection(lab):
    seg, director = lab
    prepare(seg, "dr")
    n1 = seg.hosts[0]
    seg.run(n1.ns, f"ip addr add {VIP}/32 dev lo")  # as BGP mode holds it: what is not forwarded, n1 answers
    docs = resources("dr", "maglev", health=HEALTH, ports=((80, "TCP"),))
    d1 = director(0)
    d1.apply(docs)
    d1.wait_programmed(lambda st: len(in_table(st)) == 2)
    point_client(seg, n1)
    loop = seg.popen(seg.client.ns, [sys.executable, "-u", "-c", LOOP, VIP, "4"])
    time.sleep(1.0)
    seg.kill(d1.proc, sig=9)  # killed: the tables it wrote stay
    time.sleep(0.3)
    d1 = director(0)  # started again (what systemd's Restart= does), then its config
    d1.apply(docs)
    st = d1.wait_programmed(lambda st: len(in_table(st)) == 2 and not st.get("waitingFirstChecks"))
    out, err = loop.communicate(timeout=60)
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err}
    # the old start deleted the tables and the first programming wrote them without the servers: the
    # connections of those moments went to n1's own TCP, which refused them
    assert result.get("failed") == {} and result.get("ok", 0) > 200, (result, st)
