#!/usr/bin/env python
"""ARP/NDP reply latency: our userspace responder against the kernel, side by side, one run.

Builds a throw-away segment of network namespaces (tests/netns/netns.py, prefix ``nl2b``):
node n1 runs the L2 responder (``python -m nocloudlb.l2 serve``) for a VIP held on lo
(arp_ignore=1, so only the responder answers), and n1's kernel answers for n1's own
address on eth0. The client asks alternately for one and the other (same client, same
wire, same host answering, same number of requests), measuring from just before the
send to the kernel receive timestamp of the answer (SIOCGSTAMPNS), and prints p50/p90/p99.

    sudo .venv/bin/python benchmarks/arp_latency.py [-n 500] [--gap-ms 2] [--json]

Root only; nothing leaves the namespaces; everything is removed at exit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "netns"))

from netns import L2Agent, make_segment  # noqa: E402

VIP4, VIP6 = "198.51.100.200", "2001:db8:1::200"

MEASURE = r"""
import json, sys, time
from nocloudlb.l2.probe import Prober
targets = json.loads(sys.argv[1]); n = int(sys.argv[2]); gap = float(sys.argv[3]) / 1000.0
out = {name: {"lat": [], "lost": 0, "macs": set()} for name in targets}
with Prober("eth0") as p:
    for i in range(n):
        for name, ip in targets.items():  # interleaved: both see the same conditions
            packed, sent = p.request(ip)
            ans = p.answers(packed, sent, 0.5, first_only=True)
            if ans:
                out[name]["lat"].append(ans[0]["latency_ms"])
                out[name]["macs"].add(ans[0]["mac"])
            else:
                out[name]["lost"] += 1
            time.sleep(gap)
print(json.dumps({k: {**v, "macs": sorted(v["macs"])} for k, v in out.items()}))
"""


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100.0 * len(s) + 0.5) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--requests", type=int, default=500, help="requests per responder and family")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="pause between requests")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("arp_latency: needs root (network namespaces)", file=sys.stderr)
        return 2
    with make_segment("nl2b", hosts=1) as seg:
        n1 = seg.hosts[0]
        seg.run(n1.ns, "sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2"
                       f" && ip addr add {VIP4}/32 dev lo && ip addr add {VIP6}/128 dev lo")
        agent = L2Agent(seg, n1.ns, "n1")
        agent.set({VIP4: [], VIP6: []}, skip_check=[VIP4, VIP6])
        time.sleep(5.0)  # let the gratuitous rounds finish so they do not mix in
        targets = {"speaker-arp": VIP4, "kernel-arp": n1.ipv4, "speaker-ndp": VIP6, "kernel-ndp": n1.ipv6}
        started = time.time()
        res = seg.run(seg.client.ns, [sys.executable, "-c", MEASURE, json.dumps(targets), str(args.requests),
                                      str(args.gap_ms)], timeout=600)
        took = time.time() - started
        data = json.loads(res.stdout.strip().splitlines()[-1])
        stats = agent.stats()
        agent.stop()
    load = os.getloadavg()
    rows = []
    for name, d in data.items():
        lat = d["lat"]
        rows.append({"responder": name, "target": targets[name], "answered": len(lat), "lost": d["lost"],
                     "p50_ms": round(pct(lat, 50), 3), "p90_ms": round(pct(lat, 90), 3),
                     "p99_ms": round(pct(lat, 99), 3), "max_ms": round(max(lat), 3) if lat else None,
                     "mean_ms": round(statistics.fmean(lat), 3) if lat else None, "macs": d["macs"]})
    meta = {"requests_each": args.requests, "gap_ms": args.gap_ms, "seconds": round(took, 1),
            "loadavg_1m": round(load[0], 2), "cpus": os.cpu_count(),
            "speaker_requests_received": stats["requests_received"], "kernel": os.uname().release}
    if args.json:
        print(json.dumps({"meta": meta, "results": rows}, indent=2))
        return 0
    print(f"ARP/NDP reply latency, {args.requests} requests each, interleaved, one run "
          f"({meta['seconds']} s, load {meta['loadavg_1m']} on {meta['cpus']} CPUs, kernel {meta['kernel']})")
    print(f"{'responder':<12} {'target':<16} {'answered':>8} {'lost':>5} {'p50 ms':>8} {'p90 ms':>8} "
          f"{'p99 ms':>8} {'max ms':>8}")
    for r in rows:
        print(f"{r['responder']:<12} {r['target']:<16} {r['answered']:>8} {r['lost']:>5} {r['p50_ms']:>8.3f} "
              f"{r['p90_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['max_ms'] or float('nan'):>8.3f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
