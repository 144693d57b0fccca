"""The data plane's cost: requests/s and latency per method, and rule update time at scale.

1. Traffic (network namespaces, dataplane_harness's segment: director n1, real servers n3, n4,
   client 192.0.2.10): for each of direct (client -> real server, no director), NAT, full-NAT,
   DR, a client opens a fresh TCP connection per request (connect, one line, answer, close)
   for ``--seconds``; printed: requests/s, median and p99 latency in ms. Every request is a new
   flow, so this is the director's per-connection cost (conntrack + NAT or the netdev hook),
   the worst case for it. keepalived's ``virtual_server`` cannot run here: this kernel has no
   IPVS (ip_vs), so that row is printed as not measurable rather than left out.
2. Rules: ``--services`` services x ``--backends`` backends (rr and maglev): time to plan
   (``dataplane_plan``), to render, to apply the whole set with one ``nft -f`` in a fresh
   namespace, and to apply an update after one backend fails (still one transaction); the update
   is the median of 10 such changes (the backend fails, comes back, 5 times).
   Row ``maglev-1021`` is the form the tables had before per-service Maglev maps, measured in
   the same run: 1021 slots for every service, each rule's slots an inline interval vmap.

    sudo .venv/bin/python benchmarks/dataplane.py [--part all|traffic|rules] [--seconds 5] [--services 1000]
        [--backends 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "netns"))

from dataplane_harness import VIP, Director, in_table, point_client, prepare, resources  # noqa: E402
from netns import make_segment  # noqa: E402
from nocloudlb.core import backends as core  # noqa: E402
from nocloudlb.core.backends import PlanMemo, Rule, dataplane_plan  # noqa: E402
from nocloudlb.core.schema import parse_resources  # noqa: E402
from nocloudlb.dataplane import nft  # noqa: E402

LOAD = r"""
import json, socket, sys, time
host, seconds = sys.argv[1], float(sys.argv[2])
lat, errors = [], 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    t = time.perf_counter()
    try:
        s = socket.create_connection((host, 80), timeout=2)
        s.sendall(b"hi\n")
        s.recv(100)
        s.close()
        lat.append(time.perf_counter() - t)
    except OSError:
        errors += 1
print(json.dumps({"n": len(lat), "errors": errors, "lat": lat}))
"""


def traffic(seconds: float) -> list[dict]:
    rows = []
    for method in ("direct", "nat", "fullnat", "dr"):
        with make_segment("ndb", hosts=4) as seg:
            prepare(seg, "nat" if method == "direct" else method)
            target = VIP
            d = None
            if method == "direct":
                target = seg.hosts[2].ipv4
                seg.run(seg.client.ns, f"ip route add {target}/32 dev eth0 src 192.0.2.10")
                seg.run(seg.hosts[2].ns, "ip route replace default dev eth0")  # answer the client directly
            else:
                d = Director(seg, seg.hosts[0])
                sched = "sh" if method == "dr" else "rr"
                d.apply(resources(method, sched, ports=((80, "TCP"),)))
                d.wait_programmed(lambda st: len(in_table(st)) == 2)
                point_client(seg, seg.hosts[0])
            out = seg.run(seg.client.ns, [sys.executable, "-c", LOAD, target, str(seconds)],
                          timeout=seconds + 60).stdout
            r = json.loads(out.strip().splitlines()[-1])
            if d is not None:
                d.close()
        lat = sorted(r["lat"]) or [0.0]
        rows.append({"method": method, "requests": r["n"], "errors": r["errors"],
                     "rps": round(r["n"] / seconds, 1), "p50_ms": round(statistics.median(lat) * 1000, 3),
                     "p99_ms": round(lat[int(len(lat) * 0.99) - 1 if len(lat) > 1 else 0] * 1000, 3)})
    rows.append({"method": "keepalived virtual_server", "rps": None,
                 "note": "not measurable here: this kernel has no IPVS (ip_vs), which virtual_server drives"})
    return rows


def big_config(services: int, backends: int, scheduler: str) -> list[dict]:
    docs: list[dict] = [
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "big"},
         "spec": {"addresses": ["203.0.113.0/24"]}}]
    for i in range(services):
        name = f"svc{i}"
        vip = f"203.0.113.{i % 250 + 1}"
        port = 1000 + i // 250
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "b"},
                     "spec": {"type": "LoadBalancer", "ports": [{"port": port, "protocol": "TCP"}]},
                     "status": {"loadBalancer": {"ingress": [{"ip": vip}]}}})
        docs.append({"apiVersion": "nocloud.io/v1alpha1", "kind": "Backends",
                     "metadata": {"name": name, "namespace": "b"},
                     "spec": {"method": "nat", "scheduler": scheduler,
                              # a different server set per service: no table is shared
                              "servers": [{"address": f"198.51.100.{10 + (i + j) % 200}", "port": 8000 + i % 50}
                                          for j in range(backends)]}})
    return docs


FLIPS = 5  # health flips measured (down and up again): the update figures are their medians


def previous_form(rules: list[Rule]) -> list[Rule]:
    """The Maglev rules as they were programmed before per-service maps: 1021 slots whatever the
    server count, inline in the rule as an interval vmap (what ``nft.render`` does for any
    scheduler without a map)."""
    out = []
    for r in rules:
        if r.scheduler == "maglev":
            slots = core.maglev_with_health([t.ident for t in r.targets], [t.weight for t in r.targets],
                                            [t.healthy for t in r.targets], size=1021)
            r = dataclasses.replace(r, scheduler="maglev-1021", slots=slots)
        out.append(r)
    return out


def apply(ns: str, script: str) -> tuple[float, float]:
    """``nft -f`` of ``script`` in namespace ``ns``: (wall seconds, CPU seconds of nft and ip netns exec,
    user + system, which the machine's load does not inflate)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script, text=True, check=True,
                   capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def rules_bench(services: int, backends: int) -> list[dict]:
    rows = []
    for scheduler in ("rr", "maglev", "maglev-1021"):
        previous = scheduler == "maglev-1021"
        parsed = parse_resources(big_config(services, backends, "maglev" if previous else scheduler))
        idents = {f"b/svc{i} 198.51.100.{10 + (i + j) % 200}:{8000 + i % 50}" for i in range(services)
                  for j in range(backends)}
        memo = None if previous else PlanMemo()

        def plan(healthy: set[str], memo: PlanMemo | None = memo, previous: bool = previous,
                 parsed: object = parsed) -> list[Rule]:
            rules = dataplane_plan(parsed, healthy, memo)
            return previous_form(rules) if previous else rules
        core._maglev.cache_clear()
        t = time.perf_counter()
        rules = plan(idents)
        plan_s = time.perf_counter() - t
        ifaces = {"eth0": (2, ["198.51.100.1/24"])}
        t = time.perf_counter()
        first = nft.render(rules, ifaces)
        render_s = time.perf_counter() - t
        failed = idents - {"b/svc0 198.51.100.10:8000"}  # one backend of one service fails, comes back...
        ns = f"ndbr-{os.getpid()}"
        update_lines = 0
        subprocess.run(["ip", "netns", "add", ns], check=True)
        try:
            apply(ns, nft.base_script())
            full_s, full_cpu = apply(ns, first.script)
            listing = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "table", "inet", nft.TABLE],
                                     capture_output=True, text=True, check=True).stdout
            computes, applies, cpu, now = [], [], [], first
            for step in range(2 * FLIPS):
                t = time.perf_counter()
                now = nft.render(plan(failed if step % 2 == 0 else idents), ifaces, now)
                computes.append(time.perf_counter() - t)
                wall, used = apply(ns, now.script)
                applies.append(wall)
                cpu.append(used)
                update_lines = update_lines or now.script.count("\n")
            update_compute_s, update_s = statistics.median(computes), statistics.median(applies)
        finally:
            subprocess.run(["ip", "netns", "del", ns], check=False)
        rows.append({"scheduler": scheduler, "services": services, "backends": backends,
                     "slots": len(rules[0].slots), "script_lines": first.script.count("\n"),
                     "update_lines": update_lines, "vmap_entries": listing.count("goto b"),
                     "plan_s": round(plan_s, 3), "render_s": round(render_s, 3), "nft_full_s": round(full_s, 3),
                     "first_total_s": round(plan_s + render_s + full_s, 3),
                     "nft_full_cpu_s": round(full_cpu, 3), "nft_update_cpu_s": round(statistics.median(cpu), 4),
                     "update_compute_s": round(update_compute_s, 4), "nft_update_s": round(update_s, 4),
                     "update_total_s": round(update_compute_s + update_s, 4)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--part", choices=("all", "traffic", "rules"), default="all")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--backends", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    tr: list[dict] = []
    rb: list[dict] = []
    if args.part in ("all", "traffic"):
        tr = traffic(args.seconds)
        print(f"{'method':28} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
        for r in tr:
            if r["rps"] is None:
                print(f"{r['method']:28} {'-':>8} {'-':>8} {'-':>8} {'-':>6}  {r['note']}")
            else:
                print(f"{r['method']:28} {r['rps']:>8} {r['p50_ms']:>8} {r['p99_ms']:>8} {r['errors']:>6}")
        print()
    if args.part in ("all", "rules"):
        rb = rules_bench(args.services, args.backends)
        print(f"{'scheduler':11} {'services':>8} {'backends':>8} {'slots':>5} {'lines':>7} {'vmap/map':>8} "
              f"{'plan s':>7} {'render s':>8} {'nft full s':>10} {'first s':>7}  {'update: compute + nft = s':<26} "
              f"{'nft CPU s: full, update':>23}")
        for r in rb:
            print(f"{r['scheduler']:11} {r['services']:>8} {r['backends']:>8} {r['slots']:>5} {r['script_lines']:>7} "
                  f"{r['vmap_entries']:>8} {r['plan_s']:>7} {r['render_s']:>8} {r['nft_full_s']:>10} "
                  f"{r['first_total_s']:>7}  {r['update_compute_s']:>8} + {r['nft_update_s']:<7} = "
                  f"{r['update_total_s']:<7} {r['nft_full_cpu_s']:>6} {r['nft_update_cpu_s']:>6}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"traffic": tr, "rules": rb}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
