#!/usr/bin/env python
"""ARP/NDP answers: the speaker's responder process against the kernel, side by side, one run each size.

For each size (VIPs in all, default 1, 1,000 and 10,000: half IPv4 up to the 512 documentation
addresses the segment leaves free, the rest IPv6; size 1 is one of each) a throw-away segment of
network namespaces (tests/netns/netns.py, prefix ``ansb``): node n1 runs the layer-2 announcer
(``python -m nocloudlb.l2 serve``, which starts the responder process) for those VIPs, and
n1's kernel answers for n1's own addresses on eth0. Then, from a client on the segment:

1. latency: requests for a random VIP and for the kernel's address, interleaved (same client,
   same wire, same host answering), from just before the send to the kernel's receive timestamp
   of the answer (SIOCGSTAMPNS): p50/p99/max, ARP and NDP;
2. rate: requests blasted at rising rates for ``--rate-seconds`` each; answers counted by
   nftables in the client: the highest rate answered without loss, speaker vs kernel (the
   responder is pinned to one CPU);
3. filter: frames that reached n1's eth0 against frames the responder read (the BPF filter's worth);
4. busy (largest size): the latency again while the announcer is kept busy by a reconcile storm
   (set_announced of the whole set again and again, ``--churn`` VIPs toggling) -- once with the
   responder process, once with the old path (the announcer's own thread answering, as when no
   responder child runs), to show what the process buys.

    sudo .venv/bin/python benchmarks/arp_latency.py [-n 500] [--sizes 1,1000,10000]
        [--json docs/images/arp_latency.json] [--png docs/images/arp_latency.png]

Root only; nothing leaves the namespaces; everything is removed at exit.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "netns"))

from netns import L2Agent, make_segment  # noqa: E402

BASE4, BASE6 = ipaddress.IPv4Address("203.0.113.0"), ipaddress.IPv6Address("2001:db8:5::")

MEASURE = r"""
import json, random, sys, time
from nocloudlb.l2.probe import Prober
targets = json.loads(sys.argv[1]); n = int(sys.argv[2]); gap = float(sys.argv[3]) / 1000.0
rnd = random.Random(7)
out = {name: {"lat": [], "lost": 0, "macs": set()} for name in targets}
with Prober("eth0") as p:
    for i in range(n):
        for name, ips in targets.items():  # interleaved: all see the same conditions
            packed, sent = p.request(rnd.choice(ips))
            ans = p.answers(packed, sent, 0.5, first_only=True)
            if ans:
                out[name]["lat"].append(ans[0]["latency_ms"])
                out[name]["macs"].add(ans[0]["mac"])
            else:
                out[name]["lost"] += 1
            time.sleep(gap)
print(json.dumps({k: {**v, "macs": sorted(v["macs"])} for k, v in out.items()}))
"""

# Blast requests for one address at each rate; nftables counts the answers (no Python per answer).
RATE = r"""
import ipaddress, json, socket, subprocess, sys, time
from nocloudlb.l2 import arp, ndp
from nocloudlb.l2.interfaces import interfaces
targets = json.loads(sys.argv[1]); rates = json.loads(sys.argv[2]); secs = float(sys.argv[3])
info = interfaces()["eth0"]; mac = arp.mac_bytes(info.mac)
src4 = ipaddress.IPv4Address(info.ipv4[0]).packed; src6 = ipaddress.IPv6Address(info.ipv6[0]).packed
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0); s.bind(("eth0", 0))
def count(name):
    out = subprocess.run(["nft", "-j", "list", "counter", "netdev", "bench", name], capture_output=True, text=True,
                         check=True).stdout
    return [o["counter"]["packets"] for o in json.loads(out)["nftables"] if "counter" in o][0]
res = {}
for name, ip in targets.items():
    a = ipaddress.ip_address(ip)
    frame = arp.probe(mac, a.packed, src4) if a.version == 4 else ndp.solicitation(mac, a.packed, src6)
    rows = []
    for rate in rates:
        before = count(name)
        total = int(rate * secs); sent = 0; t0 = time.perf_counter()
        while sent < total:
            due = min(total, int((time.perf_counter() - t0) * rate) + 1)
            while sent < due:
                try:
                    s.send(frame); sent += 1
                except BlockingIOError:
                    break
        took = time.perf_counter() - t0
        time.sleep(0.4)
        got = count(name) - before
        rows.append({"rate": rate, "sent": sent, "achieved": round(sent / took), "answered": got})
        if got < sent * 0.5:
            break  # far past the limit: stop
    res[name] = rows
print(json.dumps(res))
"""


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100.0 * len(s) + 0.5) - 1))]


def summarize(name: str, d: dict) -> dict:
    lat = d["lat"]
    return {"responder": name, "answered": len(lat), "lost": d["lost"],
            "p50_ms": round(pct(lat, 50), 3), "p90_ms": round(pct(lat, 90), 3), "p99_ms": round(pct(lat, 99), 3),
            "max_ms": round(max(lat), 3) if lat else None, "mean_ms": round(statistics.fmean(lat), 3) if lat else None,
            "macs": d["macs"], "lat": lat}


def rx_packets(seg, ns: str) -> int:
    return int(seg.run(ns, "cat /sys/class/net/eth0/statistics/rx_packets").stdout)


def wait_quiet(agent: L2Agent, in_daemon: bool, timeout: float = 300.0) -> dict:
    """Until the responder is up (or, ``in_daemon``, the announcer answers) and nothing is queued."""
    deadline = time.monotonic() + timeout
    while True:
        st = agent.stats()
        if sum(st["queued"].values()) == 0 and st["responder"]["answeringInDaemon" if in_daemon else "up"]:
            return st
        if time.monotonic() > deadline:
            raise RuntimeError(f"announcer not quiet after {timeout}s: {st['queued']} {st['responder']}")
        time.sleep(0.2)


class Agent(L2Agent):
    """L2Agent with patience: on a machine shared with other work, Python's start-up alone can take 20 s."""

    def _read(self, timeout: float = 20) -> dict:
        return super()._read(timeout=max(timeout, 180))


def start_agent(seg, n1, v4: list[str], v6: list[str], in_daemon: bool) -> L2Agent:
    opts: dict = {"garp_rounds": 1, "rate": 50000, "burst": 1000, "check_probes": 0}
    if in_daemon:  # a responder that cannot start: the announcer's thread answers (the old path)
        opts["responder_argv"] = [sys.executable, "-c", "import time; time.sleep(3600)"]
    agent = Agent(seg, n1.ns, "n1", **opts)
    vips: dict[str, list[str]] = {ip: [] for ip in v4 + v6}
    agent.set(vips, skip_check=list(vips))
    wait_quiet(agent, in_daemon)
    return agent


def measure(seg, targets: dict, n: int, gap: float) -> dict:
    res = seg.run(seg.client.ns, [sys.executable, "-c", MEASURE, json.dumps(targets), str(n), str(gap)], timeout=1800)
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_size(size: int, args) -> dict:
    # Only documentation addresses: IPv4 VIPs from 203.0.113.0/24 and 192.0.2.0/24 (512; the
    # segment itself uses 198.51.100.0/24), the rest of ``size`` in IPv6 (2001:db8:5::/64).
    n4 = 1 if size == 1 else min(size // 2, 512)
    n6 = 1 if size == 1 else size - n4
    v4 = [str(BASE4 + i) if i < 256 else str(ipaddress.IPv4Address("192.0.2.0") + i - 256) for i in range(n4)]
    v6 = [str(BASE6 + i) for i in range(n6)]
    out: dict = {"vips": size, "ipv4_vips": n4, "ipv6_vips": n6}
    with make_segment("ansb", hosts=1) as seg:
        n1 = seg.hosts[0]
        seg.run(n1.ns, "sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2")
        c = seg.client
        # nftables counters of answers in the client (netdev ingress: before anything else)
        nft = ["add table netdev bench",
               "add chain netdev bench in { type filter hook ingress device eth0 priority 0; }"]
        rate_targets = {"speaker-arp": v4[0], "kernel-arp": n1.ipv4, "speaker-ndp": v6[0], "kernel-ndp": n1.ipv6}
        for name, ip in rate_targets.items():
            nft.append(f"add counter netdev bench {name}")
            if ":" in ip:
                nft.append(f"add rule netdev bench in meta protocol ip6 icmpv6 type nd-neighbor-advert "
                           f"ip6 saddr {ip} counter name {name}")
            else:
                hexip = ipaddress.IPv4Address(ip).packed.hex()
                # ARP reply (op 2) whose sender protocol address is ip: raw payload match
                nft.append(f"add rule netdev bench in meta protocol arp @nh,48,16 2 @nh,112,32 0x{hexip} "
                           f"counter name {name}")
        seg.run(c.ns, ["nft", "-f", "-"], input="\n".join(nft) + "\n")
        t0 = time.monotonic()
        agent = start_agent(seg, n1, v4, v6, in_daemon=False)
        out["announce_seconds"] = round(time.monotonic() - t0, 1)
        st = agent.stats()
        child = st["responder"]["pid"]
        os.sched_setaffinity(child, {0})  # one core for the responder
        wire0, py0 = rx_packets(seg, n1.ns), st["responder"]["rx"]["eth0"]
        # asked for: the first half of each family; the storm (busy) toggles VIPs from the second half
        asked4, asked6 = v4[: max(1, n4 // 2)], v6[: max(1, n6 // 2)]
        toggle = v4[n4 // 2 :][: args.churn // 10] + v6[n6 // 2 :][: args.churn]
        targets = {"speaker-arp": asked4, "kernel-arp": [n1.ipv4], "speaker-ndp": asked6, "kernel-ndp": [n1.ipv6]}
        quiet = measure(seg, targets, args.requests, args.gap_ms)
        out["latency"] = [summarize(k, v) for k, v in quiet.items()]
        if not args.no_rate:
            res = seg.run(c.ns, [sys.executable, "-c", RATE, json.dumps(rate_targets), json.dumps(args.rates),
                                 str(args.rate_seconds)], timeout=1800)
            rates = json.loads(res.stdout.strip().splitlines()[-1])
            out["rate"] = {k: {"steps": v, "lossless_max": max([r["achieved"] for r in v if r["answered"] >= r["sent"]],
                                                               default=0)} for k, v in rates.items()}
            ours = sum(r["sent"] for k, v in rates.items() if k.startswith("speaker") for r in v)
        else:
            ours = 0
        ours += sum(len(d["lat"]) + d["lost"] for k, d in quiet.items() if k.startswith("speaker"))
        st = agent.stats()
        wire, to_py = rx_packets(seg, n1.ns) - wire0, st["responder"]["rx"]["eth0"] - py0
        out["filter"] = {"wire_frames": wire, "to_python": to_py, "requests_for_vips": ours,
                         "others_on_wire": wire - ours, "others_to_python": max(0, to_py - ours),
                         "exact": st["responder"]["exact"]["eth0"], "refilters": st["responder"]["refilters"]}
        out["responder_restarts"] = st["responder"]["restarts"]
        if size == max(args.sizes) and not args.no_busy:
            busy = {}
            agent.call(cmd="busy", seconds=args.busy_seconds, toggle=toggle)
            time.sleep(0.5)
            busy["responder-process"] = measure(seg, targets, args.busy_requests, args.gap_ms)
            agent.stop()
            agent = start_agent(seg, n1, v4, v6, in_daemon=True)
            busy["quiet-in-daemon"] = measure(seg, targets, args.busy_requests, args.gap_ms)
            agent.call(cmd="busy", seconds=args.busy_seconds, toggle=toggle)
            time.sleep(0.5)
            busy["busy-in-daemon"] = measure(seg, targets, args.busy_requests, args.gap_ms)
            out["busy"] = {phase: [summarize(k, v) for k, v in d.items()] for phase, d in busy.items()}
        agent.stop()
    return out


def _cdf(row: dict) -> tuple[list[float], list[float]]:
    """The latency CDF of a row: every sample, or (from a JSON file) its p50/p90/p99/max."""
    if row.get("lat"):
        s = sorted(row["lat"])
        return s, [(i + 1) / len(s) for i in range(len(s))]
    pts = [(row[k], q) for k, q in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99), ("max_ms", 1.0))
           if row.get(k) is not None]
    return [x for x, _q in pts], [q for _x, q in pts]


def png(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    for ax, fam in zip(axes, ("arp", "ndp"), strict=True):
        for r in results:
            for row in r["latency"]:
                if not row["responder"].endswith(fam) or not row["answered"]:
                    continue
                if row["responder"].startswith("kernel") and r is not results[-1]:
                    continue  # one kernel curve (the largest size's run) keeps the plot readable
                s, ys = _cdf(row)
                who = row["responder"].split("-")[0]
                ax.step(s, ys, where="post", label=f"{who}, {r['vips']:,} VIPs" if who == "speaker"
                        else f"kernel ({r['vips']:,}-VIP run)", ls="-" if who == "speaker" else "--")
            for phase, rows in r.get("busy", {}).items():
                for row in rows:
                    if row["responder"] == f"speaker-{fam}" and row["answered"]:
                        s, ys = _cdf(row)
                        ax.step(s, ys, where="post", ls=":",
                                label=f"speaker {phase}, {r['vips']:,} VIPs")
        ax.set_xscale("log")
        ax.set_xlabel("reply latency (ms, log scale)")
        ax.set_title("ARP (IPv4)" if fam == "arp" else "NDP (IPv6)")
        ax.axvline(0.5, color="grey", lw=0.6)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("fraction of requests answered within")
    fig.suptitle("ARP/NDP reply latency: responder process vs kernel, and the old in-daemon path under load")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: list[dict], meta: dict) -> None:
    print(f"ARP/NDP reply latency, {meta['requests_each']} requests each, interleaved with the kernel's, one run per "
          f"size (load {meta['loadavg_1m']} on {meta['cpus']} CPUs, kernel {meta['kernel']})")
    print(f"{'VIPs':>11} {'responder':<12} {'answered':>8} {'lost':>5} {'p50 ms':>7} {'p90 ms':>7} "
          f"{'p99 ms':>7} {'max ms':>7}")
    for r in results:
        for row in r["latency"]:
            print(f"{r['vips']:>11,} {row['responder']:<12} {row['answered']:>8} {row['lost']:>5} "
                  f"{row['p50_ms']:>7.3f} {row['p90_ms']:>7.3f} {row['p99_ms']:>7.3f} {row['max_ms'] or 0:>7.3f}")
    if any("rate" in r for r in results):
        print("\nhighest request rate answered without loss (requests/s; responder pinned to one CPU)")
        print(f"{'VIPs':>11} {'speaker-arp':>12} {'kernel-arp':>11} {'speaker-ndp':>12} {'kernel-ndp':>11}")
        for r in results:
            if "rate" in r:
                rr = r["rate"]
                print(f"{r['vips']:>11,} " + " ".join(
                    f"{rr[k]['lossless_max']:>{w},}" for k, w in
                    (("speaker-arp", 12), ("kernel-arp", 11), ("speaker-ndp", 12), ("kernel-ndp", 11))))
    print("\nframes on n1's wire vs frames read by the responder (BPF filter)")
    for r in results:
        f = r["filter"]
        print(f"{r['vips']:>11,} VIPs: {f['wire_frames']:,} frames on the wire, {f['to_python']:,} to Python; "
              f"of the {f['others_on_wire']:,} not asking for a VIP, {f['others_to_python']:,} reached Python "
              f"({100.0 * f['others_to_python'] / max(1, f['others_on_wire']):.1f} %)")
    for r in results:
        if "busy" in r:
            print(f"\nwhile the announcer is busy (reconcile storm), {r['vips']:,} VIPs")
            for phase, rows in r["busy"].items():
                for row in rows:
                    print(f"{phase:<18} {row['responder']:<12} {row['answered']:>6} {row['lost']:>4} "
                          f"p50 {row['p50_ms']:.3f}  p99 {row['p99_ms']:.3f}  max {row['max_ms'] or 0:.3f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--requests", type=int, default=500, help="requests per responder and family, per size")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 1000, 10000])
    ap.add_argument("--gap-ms", type=float, default=2.0, help="pause between requests")
    ap.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",")],
                    default=[2000, 5000, 10000, 20000, 40000, 80000])
    ap.add_argument("--rate-seconds", type=float, default=0.5)
    ap.add_argument("--no-rate", action="store_true")
    ap.add_argument("--no-busy", action="store_true")
    ap.add_argument("--busy-requests", type=int, default=200)
    ap.add_argument("--busy-seconds", type=float, default=60.0)
    ap.add_argument("--churn", type=int, default=1000,
                    help="IPv6 VIPs (and a tenth as many IPv4) withdrawn and given back by every other storm call")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--png", help="write the latency CDF plot here")
    ap.add_argument("--plot-from", metavar="JSON", help="only draw --png from a JSON file this script wrote")
    args = ap.parse_args()
    if args.plot_from:
        with open(args.plot_from) as fh:
            png(json.load(fh)["results"], args.png)
        return 0
    if os.geteuid() != 0:
        print("arp_latency: needs root (network namespaces)", file=sys.stderr)
        return 2
    results: list[dict] = []
    started = time.time()
    loads = []

    def save() -> dict:
        load = os.getloadavg()
        loads.append(load[0])
        meta = {"requests_each": args.requests, "gap_ms": args.gap_ms, "sizes": args.sizes,
                "seconds": round(time.time() - started, 1), "loadavg_1m": round(load[0], 2),
                "loadavg_1m_per_size": [round(x, 2) for x in loads], "cpus": os.cpu_count(),
                "kernel": os.uname().release}
        if args.json:  # after every size, so a long run that is cut short still leaves its figures
            slim = json.loads(json.dumps(results))
            for r in slim:
                for row in r["latency"] + [x for rows in r.get("busy", {}).values() for x in rows]:
                    row.pop("lat", None)
            with open(args.json, "w") as fh:
                json.dump({"meta": meta, "results": slim}, fh, indent=1)
        return meta

    for size in args.sizes:
        results.append(run_size(size, args))
        meta = save()
    table(results, meta)
    if args.png:
        png(results, args.png)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        print(exc, exc.stderr, file=sys.stderr)
        sys.exit(1)
