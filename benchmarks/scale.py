#!/usr/bin/env python
"""The speaker at size (issue 10, sections 4 and 5): three speakers, profile `fast`, one pool, N services.

For each N (default 1,000 and 10,000), on a throw-away segment of network namespaces (prefix ``sc``,
tests/netns/netns.py; three real ``nocloudlb speaker`` processes as in tests/netns/speaker_harness.py)
and with a capture of every ARP/NA frame on the client's wire (tcpdump):

- start: from launching the three speakers to every VIP announced (the status summaries add up to N),
  with the start-up race seen on the wire: VIPs whose gratuitous frames came from two MACs, and the
  gratuitous frames sent in all;
- RSS per speaker after settling, and after two reloads of a changed file (flat across reloads?);
- idle CPU per speaker over ``--idle`` seconds (nothing changes);
- ARP reply latency, our responder for a VIP against the kernel for a node's own address, interleaved
  in one run (today's answering path: the responder inside the speaker);
- SIGHUP with an unchanged file: time to ``configUnchanged``, gratuitous frames sent meanwhile, ARP p99
  while it runs;
- kill -9 of the node leading the most VIPs: detection (``nodeFailed`` in a survivor's log), the
  survivors' reconcile time (``lastApplyMs``, and every one after the kill), the first gratuitous
  frame of the last moved VIP, the VIPs re-announced within 2 s of detection, and frames per second
  over time.

Prints a table (today's figures from the issue beside ours), writes JSON and, with --plots, PNGs under
docs/images/ (cost against VIPs; the takeover's frames per second).

    sudo .venv/bin/python benchmarks/scale.py                      # 1,000 and 10,000 services (long)
    sudo .venv/bin/python benchmarks/scale.py --vips 200 --idle 5  # quick (make bench)

Root only; nothing leaves the namespaces; everything is removed at exit.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "netns"))

import yaml  # noqa: E402
from netns import make_segment  # noqa: E402
from nocloudlb.core.control_client import request  # noqa: E402
from speaker_harness import SpeakerCluster  # noqa: E402

V4_COUNT = 250  # IPv4 VIPs from 203.0.113.0/24 (ARP is measured on them); the rest are IPv6
TODAY = {  # the table (issue 10, section 4), measured before this work
    1000: {"start_s": 2.5, "rss_mb": 61, "idle_cpu_pct": 2.7, "arp_p50_ms": 0.36, "arp_p99_ms": 5.7,
           "sighup_s": 0.8, "kill_last_garp_s": 1.13},
    10000: {"start_s": "27-36", "rss_mb": "281 (338 after a reload)", "idle_cpu_pct": 23, "arp_p50_ms": 0.38,
            "arp_p99_ms": 70, "sighup_s": "14-19 (33,070 frames)", "kill_last_garp_s": "2.85 (10 with a backlog)"},
}

MEASURE_ARP = r"""
import json, sys, time
from nocloudlb.l2.probe import Prober
targets = json.loads(sys.argv[1]); n = int(sys.argv[2]); gap = float(sys.argv[3]) / 1000.0
out = {name: {"lat": [], "lost": 0} for name in targets}
with Prober("eth0") as p:
    for i in range(n):
        for name, ip in targets.items():
            packed, sent = p.request(ip)
            ans = p.answers(packed, sent, 0.5, first_only=True)
            if ans:
                out[name]["lat"].append(ans[0]["latency_ms"])
            else:
                out[name]["lost"] += 1
            time.sleep(gap)
print(json.dumps(out))
"""


def vips(n: int) -> list[str]:
    out = [f"203.0.113.{i}" for i in range(1, min(n, V4_COUNT) + 1)]
    first = ipaddress.ip_address("2001:db8:100::1")
    out += [str(first + i) for i in range(n - len(out))]
    return out


def resources(n: int) -> list[dict]:
    docs = [{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "default"},
             "spec": {"addresses": ["203.0.113.0/24", "2001:db8:100::/112"]}},
            {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "default"},
             "spec": {"ipAddressPools": ["default"]}}]
    for i, ip in enumerate(vips(n)):
        docs.append({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": f"svc{i}", "namespace": "bench", "annotations": {}},
                     "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Cluster",
                              "ports": [{"port": 80, "protocol": "TCP"}]},
                     "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}})
    return docs


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(q / 100.0 * len(s) + 0.5) - 1))], 3)


# -- the wire -----------------------------------------------------------------------------------
class Capture:
    """tcpdump of ARP and NA on the client's eth0 into a pcap; ``frames()`` parses it: (time, src MAC,
    VIP) of every gratuitous ARP (sender = target) and unsolicited NA (to all-nodes)."""

    def __init__(self, seg, path: Path) -> None:
        self.path = path
        self.proc = seg.popen(seg.client.ns, ["tcpdump", "-i", "eth0", "-n", "-s", "96", "-B", "32768", "-U",
                                              "-w", str(path), "arp or icmp6"])
        time.sleep(1.0)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        err = self.proc.stderr.read() if self.proc.stderr else ""
        return next((ln for ln in err.splitlines() if "dropped by kernel" in ln), "")

    def frames(self) -> list[tuple[float, str, str]]:
        data = self.path.read_bytes() if self.path.exists() else b""
        out: list[tuple[float, str, str]] = []
        off = 24
        while off + 16 <= len(data):
            sec, usec, incl, _orig = struct.unpack_from("<IIII", data, off)
            pkt = data[off + 16: off + 16 + incl]
            off += 16 + incl
            t = sec + usec / 1e6
            src = pkt[6:12].hex(":")
            if pkt[12:14] == b"\x08\x06" and len(pkt) >= 42 and pkt[28:32] == pkt[38:42]:
                out.append((t, src, str(ipaddress.ip_address(pkt[28:32]))))
            elif (pkt[12:14] == b"\x86\xdd" and len(pkt) >= 78 and pkt[20] == 58 and pkt[54] == 136
                  and pkt[0:6] == b"\x33\x33\x00\x00\x00\x01"):
                out.append((t, src, str(ipaddress.ip_address(pkt[62:78]))))
        return out


def arp_latency(seg, targets: dict[str, str], n: int, gap_ms: float = 2.0) -> dict:
    res = seg.run(seg.client.ns, [sys.executable, "-c", MEASURE_ARP, json.dumps(targets), str(n), str(gap_ms)],
                  timeout=900)
    data = json.loads(res.stdout.strip().splitlines()[-1])
    return {name: {"p50_ms": pct(d["lat"], 50), "p99_ms": pct(d["lat"], 99),
                   "max_ms": round(max(d["lat"]), 3) if d["lat"] else None, "answered": len(d["lat"]),
                   "lost": d["lost"]} for name, d in data.items()}


# -- the speakers -------------------------------------------------------------------------------
def speaker_pid(c: SpeakerCluster, name: str) -> int:
    return c.procs[name].pid  # ip netns exec execs the speaker: the same PID


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(c: SpeakerCluster, name: str, timeout: float = 30.0) -> dict | None:
    try:
        return request(c.sock(name), {"cmd": "status", "vips": "none"}, timeout)
    except (OSError, ValueError):
        return None


def wait_events(c: SpeakerCluster, name: str, event: str, since_count: int, timeout: float) -> dict | None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        evs = c.events(name, event)
        if len(evs) > since_count:
            return evs[since_count]
        time.sleep(0.05)
    return None


def ts_of(rec: dict) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rec["ts"]).timestamp()


def run_size(n: int, args: argparse.Namespace, work: Path) -> dict:
    out: dict = {"vips": n}
    with make_segment(args.prefix, hosts=3) as seg:
        for h in seg.hosts:
            seg.run(h.ns, "sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2")
        c = SpeakerCluster(seg, work / f"n{n}", profile="fast")  # small files first: PyYAML's dump is slow
        c.resources = resources(n)
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        for name in c.names:
            c.write_config(name, text=yaml.dump(c.config(name), Dumper=dumper))
        cap = Capture(seg, work / f"n{n}.pcap")
        macs = {c.mac(name): name for name in c.names}

        # 1. start to every VIP announced; one owner per VIP on the wire
        t0 = time.time()
        for name in c.names:
            c.start(name)
        done = None
        end = time.monotonic() + args.start_timeout
        while time.monotonic() < end:
            sts = [summary(c, name, 5.0) for name in c.names]
            if all(sts) and sum(st["vipSummary"]["announcing"] for st in sts) == n \
                    and all(st.get("ready") for st in sts):
                done = time.time()
                break
            time.sleep(0.2)
        out["start_s"] = round(done - t0, 2) if done else None
        time.sleep(args.settle)
        frames = cap.frames()
        senders: dict[str, set[str]] = {}
        for _t, src, ip in frames:
            senders.setdefault(ip, set()).add(src)
        out["start_two_macs"] = sum(1 for s in senders.values() if len(s) > 1)
        out["start_gratuitous_frames"] = len(frames)
        out["start_vips_seen_on_wire"] = len(senders)
        pids = {name: speaker_pid(c, name) for name in c.names}
        out["rss_mb"] = {name: rss_mb(pid) for name, pid in pids.items()}

        # 2. idle CPU
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        time.sleep(args.idle)
        out["idle_cpu_pct"] = {name: round(100 * (cpu_seconds(pid) - before[name]) / args.idle, 2)
                               for name, pid in pids.items()}

        # 3. ARP reply latency: a VIP against the kernel (node's own address), interleaved
        sts = {name: request(c.sock(name), {"cmd": "status", "ips": ["203.0.113.1"]}, 30) for name in c.names}
        owner = next(v["leader"] for st in sts.values() for v in st["vips"])
        targets = {"speaker-arp": "203.0.113.1", "kernel-arp": c.host(owner).ipv4}
        out["arp"] = arp_latency(seg, targets, args.arp)

        # 4. SIGHUP, file unchanged: time, frames, ARP meanwhile
        victim = c.names[0]
        seen = len(c.events(victim, "configUnchanged"))
        n_frames = len(cap.frames())
        holder: dict = {}
        th = threading.Thread(target=lambda: holder.update(arp_latency(seg, targets, max(50, args.arp // 3))))
        th.start()
        time.sleep(0.3)
        t_hup = time.time()
        os.kill(pids[victim], signal.SIGHUP)
        rec = wait_events(c, victim, "configUnchanged", seen, 120)
        th.join()
        time.sleep(2.0)
        hup_frames = [f for f in cap.frames()[n_frames:] if macs.get(f[1]) == victim]
        out["sighup"] = {"s": round(ts_of(rec) - t_hup, 3) if rec else None, "frames": len(hup_frames),
                         "resumed": len(c.events(victim, "speakerResumed")), "arp_meanwhile": holder}

        # 5. reloads of a changed file: RSS flat?
        rss_reloads = []
        for i in range(2):
            path = c.config_path(victim)
            path.write_text(path.read_text() + f"# reload {i}\n")
            seen = len(c.events(victim, "configLoaded"))
            t_r = time.time()
            os.kill(pids[victim], signal.SIGHUP)
            rec = wait_events(c, victim, "configLoaded", seen, 300)
            time.sleep(2.0)
            rss_reloads.append({"s": round(ts_of(rec) - t_r, 2) if rec else None, "rss_mb": rss_mb(pids[victim])})
        out["reloads"] = rss_reloads

        # 6. kill -9 of the node leading the most VIPs
        sts = {name: summary(c, name) for name in c.names}
        leads = {name: st["vipSummary"]["announcing"] for name, st in sts.items() if st}
        dead = max(leads, key=leads.get)
        survivors = [x for x in c.names if x != dead]
        moved_rows = request(c.sock(survivors[0]), {"cmd": "status", "leader": dead, "vips": "all"}, 60)["vips"]
        moved = {v["ip"] for v in moved_rows}
        failed_seen = {s: len(c.events(s, "nodeFailed")) for s in survivors}
        n_frames = len(cap.frames())
        t_kill = c.stop(dead, signal.SIGKILL)
        time.sleep(args.after_kill)
        det = [wait_events(c, s, "nodeFailed", failed_seen[s], 30) for s in survivors]
        t_det = min(ts_of(r) for r in det if r) if any(det) else None
        after = [f for f in cap.frames()[n_frames:] if f[0] >= t_kill]
        first: dict[str, float] = {}
        for t, src, ip in after:
            if ip in moved and macs.get(src) in survivors and ip not in first:
                first[ip] = t
        bins: dict[int, int] = {}
        for t, src, _ip in after:
            if macs.get(src) in survivors:
                k = int((t - t_kill) * 10)
                bins[k] = bins.get(k, 0) + 1
        l2s = {s: (summary(c, s) or {}).get("modes", {}).get("l2", {}) for s in survivors}
        applies = {s: l2.get("lastApplyMs") for s, l2 in l2s.items()}
        # every full reconcile after the kill (the takeover's, gossip's nodeFailed, the retries until announced)
        after_kill = {s: [a[1:] for a in l2.get("recentApplies", []) if a[0] >= t_kill] for s, l2 in l2s.items()}
        out["kill"] = {
            "node": dead, "vips_led": leads[dead], "moved": len(moved), "moved_announced": len(first),
            "detection_s": round(t_det - t_kill, 3) if t_det else None,
            "last_first_garp_s": round(max(first.values()) - t_kill, 3) if first else None,
            "within_2s_of_detection": sum(1 for t in first.values() if t_det and t - t_det <= 2.0),
            "reconcile_ms": applies,
            "reconciles_after_kill_ms": after_kill,
            "frames_per_100ms": [bins.get(k, 0) for k in range(0, max(bins) + 1)] if bins else [],
        }
        out["capture_drops"] = cap.stop()
    return out


def plots(results: list[dict], outdir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    ns = [r["vips"] for r in results]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    series = [
        ("start to every VIP announced (s)", [r.get("start_s") for r in results]),
        ("RSS per speaker (MB, max of 3)", [max(r["rss_mb"].values()) for r in results]),
        ("idle CPU per speaker (%, max of 3)", [max(r["idle_cpu_pct"].values()) for r in results]),
        ("reconcile after a kill (ms, max of survivors)",
         [max((v or 0) for v in r["kill"]["reconcile_ms"].values()) for r in results]),
    ]
    for ax, (title, ys) in zip(axes.flat, series, strict=True):
        ax.plot(ns, ys, marker="o")
        ax.set_xscale("log")
        ax.set_xlabel("VIPs (services)")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
    fig.suptitle("nocloudlb speaker: cost against VIPs (3 speakers, fast profile)")
    fig.tight_layout()
    path = outdir / "scale_cost.png"
    fig.savefig(path, dpi=90)
    made.append(str(path))
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        fps = r["kill"]["frames_per_100ms"]
        ax.plot([i / 10 for i in range(len(fps))], [f * 10 for f in fps], label=f"{r['vips']} VIPs")
    ax.set_xlabel("seconds after kill -9 of the node leading the most VIPs")
    ax.set_ylabel("gratuitous frames per second (survivors)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = outdir / "scale_takeover_fps.png"
    fig.savefig(path, dpi=90)
    made.append(str(path))
    return made


def table(results: list[dict]) -> str:
    lines = ["| measure | VIPs | today | now |", "| --- | ---: | --- | --- |"]
    for r in results:
        n = r["vips"]
        t = TODAY.get(n, {})
        k = r["kill"]
        a = r["arp"]
        rows = [
            ("start to every VIP announced (s)", t.get("start_s", "-"), r.get("start_s")),
            ("start-up: VIPs announced by two MACs / gratuitous frames", "-",
             f"{r['start_two_macs']} / {r['start_gratuitous_frames']}"),
            ("RSS per speaker (MB)", t.get("rss_mb", "-"), ", ".join(f"{v:g}" for v in r["rss_mb"].values())),
            ("RSS after two reloads (MB)", "-", ", ".join(f"{x['rss_mb']:g}" for x in r["reloads"])),
            ("idle CPU per speaker (%)", t.get("idle_cpu_pct", "-"),
             ", ".join(f"{v:g}" for v in r["idle_cpu_pct"].values())),
            ("ARP p50 / p99 ms (speaker; kernel)", f"{t.get('arp_p50_ms', '-')} / {t.get('arp_p99_ms', '-')}",
             f"{a['speaker-arp']['p50_ms']} / {a['speaker-arp']['p99_ms']}; "
             f"{a['kernel-arp']['p50_ms']} / {a['kernel-arp']['p99_ms']}"),
            ("SIGHUP, unchanged file: s / frames / ARP p99 ms meanwhile", t.get("sighup_s", "-"),
             f"{r['sighup']['s']} / {r['sighup']['frames']} / "
             f"{(r['sighup']['arp_meanwhile'].get('speaker-arp') or {}).get('p99_ms')}"),
            ("reload of a changed file (s)", "-", ", ".join(str(x["s"]) for x in r["reloads"])),
            ("kill -9: detection s / last moved VIP's first GARP s", f"- / {t.get('kill_last_garp_s', '-')}",
             f"{k['detection_s']} / {k['last_first_garp_s']} ({k['moved_announced']} of {k['moved']} moved)"),
            ("kill -9: moved VIPs announced within 2 s of detection", "-", k["within_2s_of_detection"]),
            ("reconcile after the membership change (ms, survivors)", "-",
             ", ".join(str(v) for v in k["reconcile_ms"].values())),
            ("every reconcile after the kill (ms elapsed / ms of the thread's CPU, per survivor)", "-",
             "; ".join(f"{s}: {', '.join(f'{v[0]}/{v[1]}' for v in vs)}"
                       for s, vs in k.get("reconciles_after_kill_ms", {}).items())),
        ]
        lines += [f"| {m} | {n} | {a_} | {b} |" for m, a_, b in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vips", default="1000,10000", help="comma-separated service counts")
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idle CPU measurement")
    ap.add_argument("--arp", type=int, default=300, help="ARP requests for each responder")
    ap.add_argument("--settle", type=float, default=8.0, help="seconds after start before measuring")
    ap.add_argument("--after-kill", type=float, default=8.0, help="seconds of capture after the kill")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plots", help="write PNGs into this directory (e.g. docs/images)")
    ap.add_argument("--prefix", default="sc", help="network namespace prefix (unique per concurrent run)")
    ap.add_argument("--keep", help="work in this directory and keep it (the speakers' logs) instead of a temporary one")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("scale: needs root (network namespaces)", file=sys.stderr)
        return 2
    results = []
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="scale-") as scratch:
        tmp = args.keep or scratch
        for n in [int(x) for x in args.vips.split(",") if x]:
            t = time.time()
            res = run_size(n, args, Path(tmp))
            res["seconds"] = round(time.time() - t, 1)
            results.append(res)
            print(f"# {n} VIPs done in {res['seconds']} s", file=sys.stderr, flush=True)
    meta = {"loadavg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(), "kernel": os.uname().release,
            "profile": "fast", "speakers": 3}
    print(f"At size: 3 speakers (fast), one pool; load {meta['loadavg_1m']} on {meta['cpus']} CPUs")
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    if args.plots:
        for p in plots(results, Path(args.plots)):
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        print(exc, exc.stderr, file=sys.stderr)
        sys.exit(1)
