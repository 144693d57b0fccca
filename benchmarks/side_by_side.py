#!/usr/bin/env python
"""Side-by-side failover benchmark (a script, not a test): the nocloudlb speaker against keepalived.

Three nodes and a client in network namespaces on one bridge (the netns harness of
tests/netns, as benchmarks/failover.py). For each system the same VIP, led by the same
node (our election order; keepalived's config is rendered by the collection's core, so its
priorities follow that order), and the same faults on its owner, each at a random phase of
the timers (a uniform random wait of up to one advert/probe interval before the fault):

  kill      SIGKILL of the daemon (keepalived: its whole process group)
  freeze    SIGSTOP of the daemon; the host's kernel keeps running (a hung daemon)
  linkdown  the owner's eth0 goes down
  stop      SIGTERM (graceful stop)
  drain     the drain label (speaker: control socket; keepalived: its track file)

Systems: speaker ``lan`` and ``fast`` profiles; keepalived 2.2 VRRPv2 ``advert_int 1`` and
VRRPv3 ``advert_int 0.1``. Per trial, from the client's capture and an HTTP poller (a GET every
50 ms): fault -> first gratuitous ARP from the new owner, fault -> first successful request,
requests lost, and whether two MACs answer ARP for the VIP 3 s afterwards (the owner's
leftover plus the new one). Prints a table, writes JSON (--json) and a PNG bar chart (--png).

Run as root: ``.venv/bin/python benchmarks/side_by_side.py [--trials 20] [--faults kill,...]``
(``make bench-side-by-side``). About 20 trials x 5 faults x 4 systems x ~8 s: 1 h or more.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "netns"))

from netns import Segment, make_segment  # noqa: E402
from nocloudlb.core import keepalived as kad  # noqa: E402
from nocloudlb.core.control_client import request  # noqa: E402
from nocloudlb.core.election import DRAIN_LABEL, election_order  # noqa: E402
from speaker_harness import (  # noqa: E402
    Capture,
    HttpPoller,
    SpeakerCluster,
    pool_docs,
    service_doc,
    spread_vips,
    start_slow_http,
)

NODES = ["n1", "n2", "n3"]
FAULTS = ["kill", "freeze", "linkdown", "stop", "drain"]
SYSTEMS = {
    "speaker lan": ("speaker", {"profile": "lan"}),
    "speaker fast": ("speaker", {"profile": "fast"}),
    "keepalived v2 advert 1": ("keepalived", {"version": 2, "advert_int": 1}),
    "keepalived v3 advert 0.1": ("keepalived", {"version": 3, "advert_int": 0.1}),
}
PORT = 8090
NS_PREFIX = "kab"  # namespaces kab<N>-n1.. (netns harness adds a unique suffix)
# settle waits (s): before a fault, after the owner serves again; after the new owner serves,
# before asking who answers ARP. Both are past every timer that matters (keepalived's leftover
# address and a frozen daemon's stay for good; a stopped or drained owner has let go by then).
SETTLE_BEFORE = 0.5
SETTLE_AFTER = 1.0


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Speakers:
    """The speaker cluster on the segment."""

    def __init__(self, seg, workdir: Path, vip: str, profile: str) -> None:
        docs = pool_docs() + [service_doc("bench", [vip])]
        docs[-1]["spec"]["ports"] = [{"port": PORT, "protocol": "TCP"}]
        self.c = SpeakerCluster(seg, workdir, profile=profile, resources=docs)
        self.c.start_all(timeout=60)
        self.period = 1.0 if profile == "lan" else 0.2

    def fault(self, kind: str, node: str) -> float:
        c = self.c
        if kind == "kill":
            return c.stop(node, signal.SIGKILL)
        if kind == "stop":
            return c.stop(node, signal.SIGTERM)
        if kind == "freeze":
            return c.send_signal(node, signal.SIGSTOP)
        if kind == "linkdown":
            t = time.time()
            c.seg.run(c.host(node).ns, "ip link set eth0 down")
            return t
        t = time.time()
        request(c.sock(node), {"cmd": "label", "set": {DRAIN_LABEL: ""}})
        return t

    def undo(self, kind: str, node: str) -> None:
        c = self.c
        if kind in ("kill", "stop"):
            c.start(node)
        elif kind == "freeze":
            c.send_signal(node, signal.SIGCONT)
        elif kind == "linkdown":
            c.seg.run(c.host(node).ns, "ip link set eth0 up")
        else:
            request(c.sock(node), {"cmd": "label", "unset": [DRAIN_LABEL]})

    def log_path(self, node: str) -> Path:
        return self.c.logs[node]

    def pgid(self, node: str) -> int:
        return self.c.procs[node].pid

    def close(self) -> None:
        for node, proc in list(self.c.procs.items()):
            if proc.poll() is None:
                self.c.send_signal(node, signal.SIGCONT)
                self.c.stop(node, signal.SIGTERM)


class Keepalived:
    """keepalived on the segment, its config rendered by the collection's core."""

    def __init__(self, seg, workdir: Path, vip: str, options: dict) -> None:
        self.seg, self.dir, self.vip = seg, workdir, vip
        workdir.mkdir(parents=True, exist_ok=True)
        docs = pool_docs() + [service_doc("bench", [vip])]
        self.drain = {n: workdir / f"{n}.drain" for n in NODES}
        nodes = [{"name": n, "interfaces": ["eth0"]} for n in NODES]
        self.confs = {}
        for n in NODES:
            self.drain[n].write_text("0\n")
            plan = kad.plan(docs, nodes, dict(options, interface="eth0", drain_file=str(self.drain[n])))
            self.confs[n] = workdir / f"{n}.conf"
            self.confs[n].write_text(kad.render(plan, n))
        self.period = float(options["advert_int"])
        self.procs: dict[str, object] = {}
        for n in NODES:
            self.start(n)

    def host(self, n: str):
        return self.seg.hosts[NODES.index(n)]

    def start(self, n: str) -> None:
        log = open(self.dir / f"{n}.log", "a")  # noqa: SIM115 - handed to the child
        self.procs[n] = self.seg.popen(self.host(n).ns, [
            "keepalived", "-n", "-l", "-D", "-P", "-f", str(self.confs[n]), "-p", str(self.dir / f"{n}.pid"),
            "-r", str(self.dir / f"{n}.vrrp.pid")], stdout=log, stderr=log)
        log.close()

    def fault(self, kind: str, n: str) -> float:
        p = self.procs[n]
        t = time.time()
        if kind == "kill":
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
        elif kind == "stop":
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=10)
        elif kind == "freeze":
            os.killpg(p.pid, signal.SIGSTOP)
        elif kind == "linkdown":
            self.seg.run(self.host(n).ns, "ip link set eth0 down")
        else:
            self.drain[n].write_text("1\n")
        return t

    def undo(self, kind: str, n: str) -> None:
        if kind in ("kill", "stop"):
            # a crashed keepalived leaves the VIP on its eth0: clean it as a reboot would
            self.seg.run(self.host(n).ns, f"ip addr del {self.vip}/32 dev eth0", check=False)
            self.start(n)
        elif kind == "freeze":
            os.killpg(self.procs[n].pid, signal.SIGCONT)
        elif kind == "linkdown":
            self.seg.run(self.host(n).ns, "ip link set eth0 up")
        else:
            self.drain[n].write_text("0\n")

    def log_path(self, n: str) -> Path:
        return self.dir / f"{n}.log"

    def pgid(self, n: str) -> int:
        return self.procs[n].pid  # type: ignore[attr-defined]

    def close(self) -> None:
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def probe_macs(seg, vip: str) -> set[str]:
    code = (f"import json; from nocloudlb.l2 import probe; "
            f"print(json.dumps(probe({vip!r}, 'eth0', 0.5)))")
    return {a["mac"] for a in seg.python_json(seg.client.ns, code)}


def run_system(name: str, faults: list[str], trials: int, workdir: Path, rng: random.Random) -> list[dict]:
    kind, options = SYSTEMS[name]
    vip = next(ip for ip, leader in spread_vips(NODES).items() if leader == "n1")
    owner, successor = election_order(NODES, vip)[:2]
    seg = make_segment(NS_PREFIX, hosts=3)
    rows: list[dict] = []
    system = None
    try:
        macs = {n: seg.hosts[i].mac for i, n in enumerate(NODES)}
        system = (Speakers(seg, workdir / name.replace(" ", "_"), vip, options["profile"]) if kind == "speaker"
                  else Keepalived(seg, workdir / name.replace(" ", "_"), vip, options))
        fake = SpeakerCluster.__new__(SpeakerCluster)  # only for its start_slow_http helper's names/hosts
        fake.seg, fake.names = seg, NODES
        fake.host = lambda n: seg.hosts[NODES.index(n)]  # type: ignore[method-assign]
        start_slow_http(fake, PORT)
        url = f"http://{vip}:{PORT}/"
        poller = HttpPoller(seg, url, 24 * 3600)
        cap = Capture(seg, workdir / f"{name.replace(' ', '_')}.cap", expr="arp")
        try:
            for fault in faults:
                for trial in range(trials):
                    t_trial = time.time()
                    faulted = False
                    try:
                        SpeakerCluster.wait(lambda: poller.served_by(owner, time.time() - 1.0, streak=3), 60,
                                            f"{name}: {owner} serving {vip} before {fault}")
                        time.sleep(SETTLE_BEFORE + rng.uniform(0, system.period))  # random phase of the timers
                        t = system.fault(fault, owner)
                        faulted = True
                        SpeakerCluster.wait(lambda t=t: poller.served_by(successor, t, streak=3), 60,
                                            f"{name}: {successor} serving after {fault}")
                        garp = SpeakerCluster.wait(lambda t=t: cap.gratuitous(vip, macs[successor], t), 10,
                                                   f"{name}: gratuitous ARP from {successor}")
                        time.sleep(SETTLE_AFTER)
                        answering = probe_macs(seg, vip)
                        samples = [s for s in list(poller.samples) if s["t"] >= t]
                        first_ok = next(s["t"] for s in samples if s["ok"] and s["body"] == successor)
                        lost = sum(1 for s in samples if s["t"] < first_ok and not s["ok"])
                        row = {"system": name, "fault": fault, "trial": trial + 1,
                               "garp_s": round(garp[0]["ts"] - t, 4), "first_ok_s": round(first_ok - t, 4),
                               "lost": lost, "two_macs": len(answering) > 1,
                               "macs": sorted({next((n for n, m in macs.items() if m == a), a) for a in answering})}
                        rows.append(row)
                        print(f"  {name:26} {fault:8} {trial + 1:2d}/{trials}: garp {row['garp_s'] * 1000:6.0f} ms, "
                              f"first ok {row['first_ok_s'] * 1000:6.0f} ms, lost {lost:3d}, "
                              f"answering {row['macs']} ({time.time() - t_trial:.1f} s)", flush=True)
                    except (AssertionError, subprocess.SubprocessError, StopIteration, OSError, ValueError) as exc:
                        # a trial the harness could not measure (a probe that timed out on a loaded
                        # machine, ...): recorded as such, not counted, and the run goes on
                        why = f"{type(exc).__name__}: {exc}"[:300]
                        rows.append({"system": name, "fault": fault, "trial": trial + 1, "error": why})
                        print(f"  {name:26} {fault:8} {trial + 1:2d}/{trials}: not measured: {why}", flush=True)
                    if faulted:
                        system.undo(fault, owner)
                    # the owner takes its VIP back (both preempt); a keepalived killed -9 left its
                    # address behind, removed by undo
                    t_undo = time.time()
                    try:
                        SpeakerCluster.wait(lambda t_undo=t_undo: poller.served_by(owner, t_undo, streak=3), 60,
                                            f"{name}: {owner} back after {fault}")
                    except AssertionError as exc:
                        print(f"  {name:26} {fault:8} {trial + 1:2d}/{trials}: {exc}", flush=True)
        finally:
            poller.stop()
    finally:
        if system is not None:
            system.close()
        seg.close()
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []

    def order(k: tuple[str, str]) -> tuple[int, int]:
        return list(SYSTEMS).index(k[0]), FAULTS.index(k[1])

    for key in sorted({(r["system"], r["fault"]) for r in rows if "error" not in r}, key=order):
        rs = [r for r in rows if (r["system"], r["fault"]) == key and "error" not in r]
        errors = sum(1 for r in rows if (r["system"], r["fault"]) == key and "error" in r)
        g = [r["garp_s"] * 1000 for r in rs]
        f = [r["first_ok_s"] * 1000 for r in rs]
        out.append({"system": key[0], "fault": key[1], "trials": len(rs),
                    "garp_p50_ms": statistics.median(g), "garp_p95_ms": pct(g, 0.95),
                    "ok_p50_ms": statistics.median(f), "ok_p95_ms": pct(f, 0.95),
                    "lost_mean": statistics.mean(r["lost"] for r in rs), "lost_max": max(r["lost"] for r in rs),
                    "two_macs": sum(r["two_macs"] for r in rs), "not_measured": errors})
    return out


def table(summary: list[dict]) -> str:
    lines = ["| system | fault | trials | fault -> GARP p50 / p95 ms | fault -> first OK p50 / p95 ms | "
             "requests lost mean / max | two MACs afterwards |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in summary:
        lines.append(f"| {s['system']} | {s['fault']} | {s['trials']}"
                     + (f" (+{s['not_measured']} not measured)" if s.get("not_measured") else "") + " "
                     f"| {s['garp_p50_ms']:.0f} / {s['garp_p95_ms']:.0f} "
                     f"| {s['ok_p50_ms']:.0f} / {s['ok_p95_ms']:.0f} | {s['lost_mean']:.1f} / {s['lost_max']} "
                     f"| {s['two_macs']} of {s['trials']} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- false failovers

LOSS_RULES = """
table inet kabloss {{
  chain in {{ type filter hook input priority -300; policy accept; iifname "eth0" numgen random mod 100 < {p} drop; }}
  chain out {{ type filter hook output priority -300; policy accept; oifname "eth0" numgen random mod 100 < {p} drop; }}
}}
table arp kabloss {{
  chain in {{ type filter hook input priority 0; policy accept; numgen random mod 100 < {p} drop; }}
  chain out {{ type filter hook output priority 0; policy accept; numgen random mod 100 < {p} drop; }}
}}
"""
HOG = "while :; do :; done"
MASTER_CPU, OTHER_CPU = 1, 0


def group_pids(pgid: int) -> list[int]:
    """Every process of process group ``pgid`` (a group we started)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                out.append(int(d))
    return out


def pin(pgid: int, cpu: int) -> None:
    for pid in group_pids(pgid):
        subprocess.run(["taskset", "-a", "-c", "-p", str(cpu), str(pid)], check=False, capture_output=True)


def cpu_wait(pgid: int) -> float:
    """Seconds the threads of process group ``pgid`` have waited on a run queue (schedstat)."""
    total = 0
    for pid in group_pids(pgid):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return total / 1e9


def takeovers(system, master: str, offsets: dict[str, int]) -> tuple[int, int]:
    """From the daemons' own logs after ``offsets``: (times a non-master took the VIP, times the
    master let it go)."""
    took = dropped = 0
    for n in NODES:
        path = system.log_path(n)
        with open(path, "rb") as fh:
            fh.seek(offsets[n])
            text = fh.read().decode(errors="replace")
        if isinstance(system, Speakers):
            ups = sum(1 for line in text.splitlines() if '"event":"serviceAnnounced"' in line)
            downs = sum(1 for line in text.splitlines() if '"event":"serviceWithdrawn"' in line)
        else:
            ups = text.count("Entering MASTER STATE")
            downs = text.count("Entering BACKUP STATE") + text.count("Entering FAULT STATE")
        if n == master:
            dropped += downs
        else:
            took += ups
    return took, dropped


def false_failovers(systems: list[str], minutes: float, conditions: list[str], workdir: Path, hog: str,
                    loss: int) -> list[dict]:
    """Every system under every condition at once, each pair on its own segment, in one window of
    ``minutes``. ``loss``: ``loss`` % of packets dropped each way on every node (nftables, inet and
    arp families). ``cpu``: the master's daemon pinned on CPU 1 beside a busy loop at nice -20 (or
    SCHED_FIFO) pinned there too, the other nodes' daemons on CPU 0."""
    vip = next(ip for ip, leader in spread_vips(NODES).items() if leader == "n1")
    master = election_order(NODES, vip)[0]
    runs: list[dict] = []
    hogs: list[subprocess.Popen] = []
    try:
        for cond in conditions:
            for name in systems:
                kind, options = SYSTEMS[name]
                seg = make_segment(NS_PREFIX, hosts=3)
                key = f"ff_{cond}_{name.replace(' ', '_')}"
                run = {"name": name, "cond": cond, "key": key, "seg": seg, "system": None}
                runs.append(run)
                run["system"] = (Speakers(seg, workdir / key, vip, options["profile"]) if kind == "speaker"
                                 else Keepalived(seg, workdir / key, vip, options))
                run["macs"] = {n: seg.hosts[i].mac for i, n in enumerate(NODES)}
                run["cap"] = Capture(seg, workdir / f"{key}.cap", expr="arp")

        def only_master(run: dict) -> bool:
            try:
                return probe_macs(run["seg"], vip) == {run["macs"][master]}
            except subprocess.SubprocessError:  # a probe that timed out on a loaded machine: ask again
                return False

        for run in runs:
            SpeakerCluster.wait(lambda run=run: only_master(run), 300, f"{run['name']}: only {master} answers {vip}")
        time.sleep(3.0)
        for run in runs:
            if run["cond"] == "loss":
                for h in run["seg"].hosts:
                    run["seg"].run(h.ns, "nft -f -", input=LOSS_RULES.format(p=loss))
            else:
                for n in NODES:
                    pin(run["system"].pgid(n), MASTER_CPU if n == master else OTHER_CPU)
        if "cpu" in conditions:
            prefix = ["chrt", "-f", "50"] if hog == "fifo" else ["nice", "-n", "-20"]
            hogs.append(subprocess.Popen([*prefix, "taskset", "-c", str(MASTER_CPU), "sh", "-c", HOG],
                                         start_new_session=True))
        t0 = time.time()
        print(f"  window starts {time.strftime('%H:%M:%S', time.gmtime(t0))} UTC: {', '.join(conditions)}",
              flush=True)
        waits = {run["key"]: cpu_wait(run["system"].pgid(master)) for run in runs}
        offsets = {run["key"]: {n: run["system"].log_path(n).stat().st_size for n in NODES} for run in runs}
        end = t0 + minutes * 60
        while time.time() < end:
            time.sleep(min(60.0, max(0.0, end - time.time())))
            print(f"  {(time.time() - t0) / 60:4.1f} of {minutes} min", flush=True)
        t1 = time.time()
        waits = {run["key"]: cpu_wait(run["system"].pgid(master)) - waits[run["key"]] for run in runs}
        for p in hogs:
            Segment.kill(p, signal.SIGKILL, wait=5)
        hogs.clear()
        print(f"  window ends {time.strftime('%H:%M:%S', time.gmtime(t1))} UTC", flush=True)
        for run in runs:
            if run["cond"] == "loss":
                for h in run["seg"].hosts:
                    run["seg"].run(h.ns, "nft delete table inet kabloss; nft delete table arp kabloss", check=False)
        time.sleep(2.0)
        out = []
        for run in runs:
            macs, cond = run["macs"], run["cond"]
            garps = [g for g in run["cap"].gratuitous(vip, None, t0) if g["ts"] <= t1]
            foreign = [g for g in garps if g["src"] != macs[master]]
            changes = sum(1 for a, b in zip(garps, garps[1:], strict=False) if a["src"] != b["src"])
            took, dropped = takeovers(run["system"], master, offsets[run["key"]])
            try:
                answering = probe_macs(run["seg"], vip)
            except subprocess.SubprocessError:
                answering = {"(probe timed out)"}
            out.append({"system": run["name"], "condition": cond, "minutes": round((t1 - t0) / 60, 2),
                        "loss_pct": loss if cond == "loss" else 0, "hog": hog if cond == "cpu" else "",
                        "takeovers": took, "master_let_go": dropped, "garp_from_non_masters": len(foreign),
                        "garp_source_changes": changes, "master_cpu_wait_s": round(waits[run["key"]], 2),
                        "answering_after": sorted(next((n for n, m in macs.items() if m == a), a)
                                                  for a in answering)})
            print(f"  {run['name']:26} {cond:4}: takeovers {took}, master let go {dropped}, "
                  f"GARP from non-masters {len(foreign)}, GARP source changes {changes}, "
                  f"master waited for CPU {waits[run['key']]:.1f} s, "
                  f"answering after {out[-1]['answering_after']}", flush=True)
        return out
    finally:
        for p in hogs:
            Segment.kill(p, signal.SIGKILL, wait=5)
        for run in runs:
            if run["system"] is not None:
                run["system"].close()
            run["seg"].close()


def ff_table(rows: list[dict]) -> str:
    lines = ["| system | condition | minutes | non-master took the VIP | master let go | "
             "gratuitous ARP from non-masters | GARP source changes | master's daemon waited for CPU (s) | "
             "answering afterwards |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cond = f"{r['loss_pct']} % loss each way" if r["condition"] == "loss" else f"CPU hog ({r['hog']})"
        who = ', '.join(r['answering_after'])
        lines.append(f"| {r['system']} | {cond} | {r['minutes']:.1f} | {r['takeovers']} | {r['master_let_go']} "
                     f"| {r['garp_from_non_masters']} | {r['garp_source_changes']} "
                     f"| {r['master_cpu_wait_s']:.1f} | {who} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the plot

def png(summary: list[dict], path: Path, trials: int | None = None) -> None:
    """Two panels of grouped bars, one group per fault, one bar per system: fault -> first gratuitous
    ARP from the new owner and fault -> first successful request (median, whisker up to p95, ms on a
    log scale); the count of trials with two MACs answering afterwards is printed on the bar."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    faults = [f for f in FAULTS if any(s["fault"] == f for s in summary)]
    systems = [n for n in SYSTEMS if any(s["system"] == n for s in summary)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    width = 0.8 / max(1, len(systems))
    for ax, (key, label) in zip(axes, [("garp", "fault -> first gratuitous ARP from the new owner"),
                                       ("ok", "fault -> first successful client request")], strict=True):
        for si, name in enumerate(systems):
            xs, med, up = [], [], []
            for fi, f in enumerate(faults):
                s = next((x for x in summary if x["fault"] == f and x["system"] == name), None)
                if s is None:
                    continue
                xs.append(fi - 0.4 + width * (si + 0.5))
                med.append(max(1.0, s[f"{key}_p50_ms"]))
                up.append(max(0.0, s[f"{key}_p95_ms"] - s[f"{key}_p50_ms"]))
                if key == "ok" and s["two_macs"]:
                    ax.annotate(f"2 MACs\n{s['two_macs']}/{s['trials']}", (xs[-1], med[-1]),
                                textcoords="offset points", xytext=(0, 12), ha="center", fontsize=6, color="crimson")
            ax.bar(xs, med, width * 0.95, yerr=[[0] * len(up), up], capsize=2, label=name)
        ax.set_yscale("log")
        ax.set_xticks(range(len(faults)), faults)
        ax.set_xlabel("fault on the VIP's owner")
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0].set_ylabel("milliseconds (bar: median, whisker: p95; log scale)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(systems), fontsize=9)
    n = f"nominally {trials} trials per cell (counts in the table)" if trials else "trials per cell as in the table"
    fig.suptitle(f"Failover, nocloudlb speaker vs keepalived: {n}, random timer phase")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


LOG_ROW = re.compile(r"^  (?P<system>.+?) +(?P<fault>kill|freeze|linkdown|stop|drain) +(?P<trial>\d+)/(?P<trials>\d+): "
                     r"garp +(?P<garp>-?\d+) ms, first ok +(?P<ok>-?\d+) ms, lost +(?P<lost>\d+), "
                     r"answering \[(?P<macs>[^]]*)\]")


LOG_ERR = re.compile(r"^  (?P<system>.+?) +(?P<fault>kill|freeze|linkdown|stop|drain) +(?P<trial>\d+)/\d+: "
                     r"not measured: (?P<why>.*)$")


def rows_from_log(path: Path) -> dict:
    """Rows of a run from its printed log (a run that died, or was stopped, before writing its
    JSON): every trial printed, measured or not; the table counts each cell's trials."""
    rows: list[dict] = []
    for line in path.read_text().splitlines():
        m = LOG_ROW.match(line)
        if m:
            macs = [x.strip().strip("'") for x in m["macs"].split(",") if x.strip()]
            rows.append({"system": m["system"], "fault": m["fault"], "trial": int(m["trial"]),
                         "garp_s": int(m["garp"]) / 1000, "first_ok_s": int(m["ok"]) / 1000,
                         "lost": int(m["lost"]), "two_macs": len(macs) > 1, "macs": macs, "from_log": path.name})
            continue
        m = LOG_ERR.match(line)
        if m:
            rows.append({"system": m["system"], "fault": m["fault"], "trial": int(m["trial"]),
                         "error": m["why"][:300], "from_log": path.name})
    trials = max((int(x) for x in re.findall(r" \d+/(\d+): ", path.read_text())), default=0)
    return {"trials": trials, "rows": rows, "notes": {"from_log": path.name}}


def neighbour_headroom() -> str | None:
    """The kernel's ARP table is shared by every namespace: near gc_thresh3 (other labs with many
    VIPs) new entries fail and every segment goes deaf. A warning naming the fix, or None."""
    out = subprocess.run(["ip", "-s", "ntable", "show", "name", "arp_cache"], capture_output=True, text=True,
                         check=False).stdout
    words = out.split()
    try:
        entries = int(words[words.index("entries") + 1])
        thresh3 = int(words[words.index("thresh3") + 1])
    except (ValueError, IndexError):
        return None
    if entries < 0.8 * thresh3:
        return None
    return (f"the kernel's ARP table holds {entries} entries of gc_thresh3 {thresh3} (shared by every namespace): "
            "raise it, e.g. sysctl -w net.ipv4.neigh.default.gc_thresh3=16384 net.ipv4.neigh.default.gc_thresh2=8192")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated names from: " + ", ".join(SYSTEMS))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--replot", type=Path, nargs="+", default=None,
                    help="no run: the table, --json and --png from the JSON files runs wrote with --json "
                         "(one per system when the systems ran as separate processes)")
    ff = ap.add_argument_group("false failovers (instead of the fault trials)")
    ff.add_argument("--false-failover", action="store_true",
                    help="all systems at once, each on its own segment, for --minutes per condition")
    ff.add_argument("--minutes", type=float, default=10.0)
    ff.add_argument("--workdir", type=Path, default=None, help="keep logs and captures here (default: a temporary one)")
    ff.add_argument("--conditions", default="loss,cpu", help="loss, cpu or both (in the same window)")
    ff.add_argument("--loss", type=int, default=10, help="percent of packets dropped each way on every node")
    ff.add_argument("--hog", choices=["nice", "fifo"], default="nice",
                    help="the busy loop beside the master: nice -20, or SCHED_FIFO 50 (RT throttling leaves 5 %%)")
    a = ap.parse_args()
    if a.replot:
        parts = [json.loads(p.read_text()) if p.suffix == ".json" else rows_from_log(p) for p in a.replot]
        rows = [r for d in parts for r in d["rows"]]
        trials = max(d["trials"] for d in parts)  # the nominal count; the table gives each cell's
        summary = summarize(rows)
        print(table(summary))
        if a.json:
            a.json.write_text(json.dumps({"trials": trials, "summary": summary, "rows": rows,
                                          "notes": [d.get("notes") for d in parts]}, indent=1))
        if a.png:
            png(summary, a.png, trials)
        return 0
    if os.geteuid() != 0:
        print("run as root (network namespaces)", file=sys.stderr)
        return 2
    faults = [f for f in a.faults.split(",") if f]
    bad = [f for f in faults if f not in FAULTS]
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad += [s for s in systems if s not in SYSTEMS]
    conditions = [c for c in a.conditions.split(",") if c]
    bad += [c for c in conditions if c not in ("loss", "cpu")]
    if bad:
        print(f"unknown fault, system or condition: {', '.join(bad)}", file=sys.stderr)
        return 2
    warning = neighbour_headroom()
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    t0 = time.time()
    if a.false_failover:
        ffrows: list[dict] = []
        with tempfile.TemporaryDirectory(prefix="kab-") as tmp:
            work = a.workdir.resolve() if a.workdir else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            ffrows = false_failovers(systems, a.minutes, conditions, work, a.hog, a.loss)
        print(f"\nfalse failovers: every system under every condition at once for {a.minutes} min; "
              f"{time.time() - t0:.0f} s in all\n")
        print(ff_table(ffrows))
        if a.json:
            a.json.write_text(json.dumps({"false_failovers": ffrows}, indent=1))
        return 0
    rng = random.Random(a.seed)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kab-") as tmp:
        for name in systems:
            rows += run_system(name, faults, a.trials, Path(tmp), rng)
    summary = summarize(rows)
    print(f"\n{a.trials} trials per fault and system, random phase; {time.time() - t0:.0f} s in all\n")
    print(table(summary))
    if a.json:
        a.json.write_text(json.dumps({"trials": a.trials, "summary": summary, "rows": rows, "notes": {
            "seed": a.seed, "systems": systems, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
            "seconds": round(time.time() - t0), "loadavg_at_end": os.getloadavg()}}, indent=1))
    if a.png:
        png(summary, a.png, a.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
