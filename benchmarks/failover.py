#!/usr/bin/env python
"""Failover benchmark (a script, not a test): fault -> first gratuitous ARP from the new owner.

Three ``nocloudlb speaker`` processes in network namespaces on one bridge and a client
capturing with tcpdump. For each profile and each fault, ``--trials`` times, at a random phase
(a random wait of 0-1 s after the cluster is stable, so every timer is at a random point):

- ``kill``: kill -9 of the speaker leading a VIP (restarted after);
- ``freeze``: SIGSTOP of that speaker (SIGCONT after: it takes the VIP back);
- ``unplug``: its host's eth0 link down (up after).

The time is from the fault to the first gratuitous ARP of the next node in the VIP's order, seen
by the client. With ``--keepalived``, the same three faults for keepalived in the same run
(VRRPv3, ``advert_int 0.1``, the reference to beat): kill -9 / SIGSTOP of the MASTER's
keepalived (all its processes), link down of the MASTER, to the BACKUP's gratuitous ARP.
Prints p50/p95/max per (system, fault), writes ``--json`` and a ``--png`` (distributions).

Run as root: ``.venv/bin/python benchmarks/failover.py [--trials 20] [--keepalived]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "netns"))

from netns import make_segment  # noqa: E402
from nocloudlb.core.election import election_order  # noqa: E402
from speaker_harness import Capture, SpeakerCluster, pool_docs, service_doc, spread_vips  # noqa: E402

NODES = ["n1", "n2", "n3"]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


FAULTS = ("kill", "freeze", "unplug")


def link(seg, ns: str, up: bool) -> None:
    seg.run(ns, f"ip link set eth0 {'up' if up else 'down'}")


def run_profile(profile: str, trials: int, workdir: Path, faults: tuple[str, ...] = FAULTS) -> dict[str, list[float]]:
    vips = spread_vips(NODES)
    docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
    seg = make_segment("nspb", hosts=3)
    out: dict[str, list[float]] = {f: [] for f in faults}
    try:
        c = SpeakerCluster(seg, workdir / profile, profile=profile, resources=docs)
        c.start_all(timeout=30)
        cap = Capture(seg, workdir / f"{profile}.cap", expr="arp")
        for i in range(trials):
            for fault in faults:
                ip = list(vips)[i % len(vips)]
                first, second = election_order(NODES, ip)[:2]
                c.wait(lambda ip=ip, first=first, second=second: c.announcing(first, ip)
                       and not c.announcing(second, ip)
                       and all(c.members_alive(n) == set(NODES) for n in NODES), 60, "stable cluster")
                time.sleep(0.3 + random.uniform(0.0, 1.0))  # a random phase of every timer
                ns = c.host(first).ns
                if fault == "kill":
                    t = c.stop(first, signal.SIGKILL)
                elif fault == "freeze":
                    t = c.send_signal(first, signal.SIGSTOP)
                else:
                    t = time.time()
                    link(seg, ns, False)
                try:
                    g = c.wait(lambda ip=ip, second=second, t=t: cap.gratuitous(ip, c.mac(second), t), 15,
                               f"gratuitous ARP from {second}")
                    out[fault].append(g[0]["ts"] - t)
                    print(f"  {profile} {fault:6} {i + 1:2d}/{trials}: {first} -> {second} "
                          f"{out[fault][-1] * 1000:6.0f} ms", flush=True)
                finally:
                    if fault == "kill":
                        c.start(first)
                    elif fault == "freeze":
                        c.send_signal(first, signal.SIGCONT)
                    else:
                        link(seg, ns, True)
        return out
    finally:
        seg.close()


KEEPALIVED_CONF = """global_defs {{
  router_id {name}
  enable_script_security
  vrrp_version 3
}}
vrrp_instance VI_1 {{
  state BACKUP
  interface eth0
  virtual_router_id 51
  priority {prio}
  advert_int 0.1
  virtual_ipaddress {{
    {vip}/24
  }}
}}
"""


def run_keepalived(trials: int, workdir: Path, faults: tuple[str, ...] = FAULTS) -> dict[str, list[float]]:
    vip = "198.51.100.250"
    seg = make_segment("nspk", hosts=3)
    procs: dict[int, object] = {}
    out: dict[str, list[float]] = {f: [] for f in faults}
    try:
        def start(i: int) -> None:
            h = seg.hosts[i]
            conf = workdir / f"ka{i}.conf"
            conf.write_text(KEEPALIVED_CONF.format(name=f"n{i + 1}", prio=150 - i * 10, vip=vip))
            pid = workdir / f"ka{i}.pid"
            for f in (pid, workdir / f"ka{i}.vrrp.pid"):  # stale after a kill -9 (as after a reboot: gone)
                f.unlink(missing_ok=True)
            procs[i] = seg.popen(h.ns, ["keepalived", "-n", "-l", "-D", "-f", str(conf), "-p", str(pid),
                                        "-r", str(workdir / f"ka{i}.vrrp.pid")],
                                 stdout=open(workdir / f"ka{i}.log", "a"), stderr=open(workdir / f"ka{i}.log", "a"))

        def holders() -> list[int]:
            return [i for i, h in enumerate(seg.hosts)
                    if f" {vip}/" in seg.run(h.ns, "ip -o addr show dev eth0").stdout]

        for i in range(3):
            start(i)
        cap = Capture(seg, workdir / "ka.cap", expr="arp")
        for k in range(trials):
            for fault in faults:
                SpeakerCluster.wait(lambda: holders() == [0], 30, "keepalived n1 the only MASTER")
                time.sleep(0.5 + random.uniform(0.0, 1.0))
                mac = seg.hosts[1].mac
                if fault == "kill":
                    t = time.time()
                    # kill -9 the whole keepalived of the master (parent and its VRRP child): a crash
                    os.killpg(procs[0].pid, signal.SIGKILL)
                elif fault == "freeze":
                    t = time.time()
                    os.killpg(procs[0].pid, signal.SIGSTOP)
                else:
                    t = time.time()
                    link(seg, seg.hosts[0].ns, False)
                try:
                    g = SpeakerCluster.wait(lambda t=t, mac=mac: cap.gratuitous(vip, mac, t), 15, "backup GARP")
                    out[fault].append(g[0]["ts"] - t)
                    print(f"  keepalived {fault:6} {k + 1:2d}/{trials}: {out[fault][-1] * 1000:6.0f} ms", flush=True)
                finally:
                    if fault == "kill":
                        procs[0].wait(timeout=10)
                        # a crashed keepalived leaves the VIP on the dead master's eth0; clean it like a reboot
                        seg.run(seg.hosts[0].ns, f"ip addr del {vip}/24 dev eth0", check=False)
                        start(0)
                    elif fault == "freeze":
                        os.killpg(procs[0].pid, signal.SIGCONT)
                    else:
                        link(seg, seg.hosts[0].ns, True)
        return out
    finally:
        seg.close()


def plot(results: dict[str, dict[str, list[float]]], path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    faults = sorted({f for r in results.values() for f in r}, key=FAULTS.index)
    fig, axes = plt.subplots(1, len(faults), figsize=(5 * len(faults), 4.5), sharey=True)
    for ax, fault in zip(axes if len(faults) > 1 else [axes], faults, strict=True):
        names = [n for n in results if results[n].get(fault)]
        data = [[v * 1000 for v in results[n][fault]] for n in names]
        ax.boxplot(data, showfliers=True)
        ax.set_xticks(range(1, len(names) + 1), [n.replace(" ", "\n", 1) for n in names], fontsize=8)
        for i, d in enumerate(data, 1):
            ax.scatter([i + random.uniform(-0.12, 0.12) for _v in d], d, s=8, alpha=0.5)
        ax.set_title(f"fault: {fault}")
        ax.set_xlabel("system / profile")
        ax.axhline(150, ls="--", lw=0.8, color="grey")
        ax.set_yscale("log")
    (axes[0] if len(faults) > 1 else axes).set_ylabel("fault -> new owner's first gratuitous ARP (ms, log)")
    fig.suptitle("layer-2 failover, 3 nodes in namespaces (dashed: 150 ms goal)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", "--kills", type=int, default=20, help="trials per fault and system")
    ap.add_argument("--profiles", default="fast,lan")
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--keepalived", action="store_true")
    ap.add_argument("--json", default=str(HERE.parent / "docs" / "images" / "failover.json"))
    ap.add_argument("--png", default=str(HERE.parent / "docs" / "images" / "failover.png"))
    ap.add_argument("--no-speaker", action="store_true", help="keepalived only (with --keepalived)")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="no run: merge the samples of several runs' JSON (e.g. one per profile, run side by side)")
    a = ap.parse_args()
    if a.merge:
        merged: dict[str, dict[str, list[float]]] = {}
        for path in a.merge:
            for name, per in json.loads(Path(path).read_text())["samples_s"].items():
                for fault, vals in per.items():
                    merged.setdefault(name, {}).setdefault(fault, []).extend(vals)
        report(merged, a.trials, a.json, a.png)
        return 0
    if os.geteuid() != 0:
        print("run as root (network namespaces)", file=sys.stderr)
        return 2
    faults = tuple(f for f in a.faults.split(",") if f)
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="nspbench-") as tmp:
        for profile in [] if a.no_speaker else a.profiles.split(","):
            results[f"nocloudlb {profile}"] = run_profile(profile, a.trials, Path(tmp), faults)
        if a.keepalived:
            results["keepalived VRRPv3 advert_int 0.1"] = run_keepalived(a.trials, Path(tmp), faults)
    report(results, a.trials, a.json, a.png)
    return 0


def report(results: dict[str, dict[str, list[float]]], trials: int, json_path: str, png_path: str) -> None:
    print(f"\nfault -> first gratuitous ARP from the new owner, {trials} trials per cell, random phase\n")
    print(f"{'':34} {'fault':7} {'n':>3} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'min ms':>8}")
    table = []
    for name, per in results.items():
        for fault, vals in per.items():
            if not vals:
                continue
            ms = [v * 1000 for v in vals]
            row = {"system": name, "fault": fault, "n": len(ms), "p50": statistics.median(ms),
                   "p95": pct(ms, 0.95), "max": max(ms), "min": min(ms)}
            table.append(row)
            print(f"{name:34} {fault:7} {len(ms):3d} {row['p50']:8.0f} {row['p95']:8.0f} {row['max']:8.0f} "
                  f"{row['min']:8.0f}")
    Path(json_path).write_text(json.dumps({"trials": trials, "table": table, "samples_s": results}, indent=1))
    plot(results, Path(png_path))
    print(f"\nwrote {json_path} and {png_path}")


if __name__ == "__main__":
    sys.exit(main())
