#!/usr/bin/env python
"""Membership at size (issue 10, section 6): gossip from 3 speakers up to what this machine holds.

Real ``nocloudlb speaker`` processes, each in its own network namespace on one bridge
(tests/netns/netns.py's segment, at most 80 hosts), every one with the same pool and no
services, so what runs is the daemon as deployed with its membership (kinship, SWIM +
Lifeguard) under the profile's real settings (speaker/nocloudlb/membership.py PROFILES).
For each profile and size:

- steady state, ``--window`` seconds with every member alive: gossip bytes/s and packets/s
  each node sends (nftables counters on UDP+TCP port 7946 in the node's namespace), CPU (%
  of one core, utime+stime from /proc) and RSS per speaker, the machine's CPU use, and the
  suspicions raised about members that were never harmed (false suspicions, from the
  speakers' ``nodeSuspect`` / ``nodeFailed`` / ``memberlistRefuted`` events);
- ``--trials`` times: kill -9 of a random member at a random phase, then the time until the
  first survivor logs it ``nodeFailed`` (what a failover waits for), until every survivor
  does, and until the first ``nodeSuspect``; the killed speaker is restarted and the next
  trial waits for every node to see every member alive again.

A size "breaks" when the cluster does not form (every node seeing every member alive)
within its timeout, when a detection is not seen within ``--detect-timeout``, or when
false suspicions appear; the table says which. Bigger sizes of that profile are skipped
after a size that did not form.

Run as root:
    .venv/bin/python benchmarks/membership_scale.py --sizes 3,5 --trials 3        # quick (make bench)
    .venv/bin/python benchmarks/membership_scale.py --sizes 3,5,10,20,40,60 --trials 8 \\
        --window 30 --json docs/images/membership_scale.json --png docs/images/membership_scale.png
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "netns"))

from netns import Segment, make_segment  # noqa: E402
from nocloudlb.membership import PROFILES  # noqa: E402
from speaker_harness import SpeakerCluster, pool_docs  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

NFT_RULES = """table inet szbench {
  chain out {
    type filter hook output priority 0; policy accept;
    udp sport 7946 counter name gossip_udp
    udp dport 7946 counter name gossip_udp
    tcp sport 7946 counter name gossip_tcp
    tcp dport 7946 counter name gossip_tcp
  }
  counter gossip_udp {}
  counter gossip_tcp {}
}
"""


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ts_of(rec: dict) -> float:
    return dt.datetime.fromisoformat(rec["ts"]).timestamp()


class Logs:
    """Tail every speaker's JSON log: new membership events since the last read."""

    EVENTS = {"nodeSuspect", "nodeFailed", "memberlistRefuted", "nodeRecovered", "nodeJoined", "speakerResumed"}

    def __init__(self, c: SpeakerCluster) -> None:
        self.c = c
        self.offsets: dict[str, int] = {}
        self.events: list[dict] = []  # {observer, event, node, t}

    def poll(self) -> None:
        for name in self.c.names:
            path = self.c.logs.get(name)
            if path is None or not path.exists():
                continue
            with open(path, "rb") as fh:
                fh.seek(self.offsets.get(name, 0))
                data = fh.read()
            end = data.rfind(b"\n") + 1
            self.offsets[name] = self.offsets.get(name, 0) + end
            for line in data[:end].splitlines():
                if b'"event"' not in line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") in self.EVENTS:
                    self.events.append({"observer": name, "event": rec["event"], "node": rec.get("node"),
                                        "t": ts_of(rec)})

    def since(self, t: float, event: str | None = None, node: str | None = None) -> list[dict]:
        return [e for e in self.events if e["t"] >= t and (event is None or e["event"] == event)
                and (node is None or e["node"] == node)]


def proc_cpu(pid: int) -> float:
    """utime + stime of ``pid`` (all threads), seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_runq_wait(pid: int) -> float:
    """Seconds the threads of ``pid`` spent runnable but waiting for a CPU (/proc/PID/task/*/schedstat):
    how starved the process is, whatever starves it."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                total += int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def cpu_pressure() -> float:
    """/proc/pressure/cpu ``some`` total (microseconds some runnable task waited for a CPU), or -1."""
    try:
        with open("/proc/pressure/cpu") as fh:
            return float(fh.readline().rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return -1.0


def proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * PAGE / 2**20


def machine_busy() -> tuple[float, float]:
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    idle = v[3] + v[4]
    return float(sum(v)), float(idle)


def nft_counters(seg: Segment, ns: str) -> dict[str, tuple[int, int]]:
    out = json.loads(seg.run(ns, ["nft", "-j", "list", "counters", "table", "inet", "szbench"]).stdout)
    res = {}
    for item in out.get("nftables", []):
        cnt = item.get("counter")
        if cnt:
            res[cnt["name"]] = (int(cnt["packets"]), int(cnt["bytes"]))
    return res


def all_alive(c: SpeakerCluster) -> bool:
    return all(c.members_alive(n) == set(c.names) for n in c.names)


def steady_window(c: SpeakerCluster, logs: Logs, window: float) -> dict[str, Any]:
    seg = c.seg
    hosts = {n: c.host(n).ns for n in c.names}
    pids = {n: c.procs[n].pid for n in c.names}
    n0 = {n: nft_counters(seg, ns) for n, ns in hosts.items()}
    c0 = {n: proc_cpu(p) for n, p in pids.items()}
    w0 = {n: proc_runq_wait(p) for n, p in pids.items()}
    m0 = machine_busy()
    p0 = cpu_pressure()
    t0 = time.time()
    time.sleep(window)
    t1 = time.time()
    p1 = cpu_pressure()
    m1 = machine_busy()
    c1 = {n: proc_cpu(p) for n, p in pids.items()}
    w1 = {n: proc_runq_wait(p) for n, p in pids.items()}
    n1 = {n: nft_counters(seg, ns) for n, ns in hosts.items()}
    rss = {n: proc_rss_mb(p) for n, p in pids.items()}
    dt_ = t1 - t0
    per = {}
    for n in c.names:
        b = sum(n1[n][k][1] - n0[n][k][1] for k in n1[n])
        p = sum(n1[n][k][0] - n0[n][k][0] for k in n1[n])
        tcp_b = n1[n]["gossip_tcp"][1] - n0[n]["gossip_tcp"][1]
        per[n] = {"bytes_s": b / dt_, "pkts_s": p / dt_, "tcp_bytes_s": tcp_b / dt_,
                  "cpu_pct": (c1[n] - c0[n]) / dt_ * 100, "rss_mb": rss[n],
                  "runq_wait_ms_s": (w1[n] - w0[n]) / dt_ * 1000}
    logs.poll()
    false = [e for e in logs.since(t0) if e["event"] in ("nodeSuspect", "nodeFailed", "memberlistRefuted")
             and e["t"] <= t1]
    counts: dict[str, int] = {}
    for e in logs.since(t0):
        if e["t"] <= t1:
            counts[e["event"]] = counts.get(e["event"], 0) + 1
    total, idle = m1[0] - m0[0], m1[1] - m0[1]

    def agg(key: str) -> dict[str, float]:
        vals = [v[key] for v in per.values()]
        return {"mean": statistics.mean(vals), "max": max(vals), "min": min(vals)}

    speakers_total = sum(v["cpu_pct"] for v in per.values())
    return {"seconds": dt_, "runq_wait_ms_s": agg("runq_wait_ms_s"),
            "cpu_pressure_pct": (p1 - p0) / 1e6 / dt_ * 100 if p0 >= 0 else None,
            "speakers_cpu_machine_pct": speakers_total / (os.cpu_count() or 1),
            "bytes_s": agg("bytes_s"), "pkts_s": agg("pkts_s"), "tcp_bytes_s": agg("tcp_bytes_s"),
            "cpu_pct": agg("cpu_pct"), "rss_mb": agg("rss_mb"),
            "machine_busy_pct": 100 * (1 - idle / total) if total else float("nan"),
            "loadavg": os.getloadavg()[0], "false_events": false, "event_counts": counts, "per_node": per}


def trial(c: SpeakerCluster, logs: Logs, rng: random.Random, profile: str, detect_timeout: float,
          form_timeout: float) -> dict[str, Any]:
    SpeakerCluster.wait(lambda: all_alive(c), form_timeout, "every node sees every member alive")
    time.sleep(1.0 + rng.uniform(0, 2 * float(PROFILES[profile]["probe_interval"])))  # random timer phase
    victim = rng.choice(c.names)
    logs.poll()
    t = c.stop(victim, signal.SIGKILL)
    survivors = [n for n in c.names if n != victim]
    end = time.monotonic() + detect_timeout
    seen: dict[str, float] = {}
    while time.monotonic() < end:
        logs.poll()
        for e in logs.since(t, "nodeFailed", victim):
            seen.setdefault(e["observer"], e["t"])
        if all(s in seen for s in survivors):
            break
        time.sleep(0.1)
    suspects = [e["t"] for e in logs.since(t, "nodeSuspect", victim)]
    others = [e for e in logs.since(t) if e["node"] not in (victim, None)
              and e["event"] in ("nodeSuspect", "nodeFailed")]
    out: dict[str, Any] = {"victim": victim, "kill": t, "observers": len(seen), "survivors": len(survivors),
                           "first": (min(seen.values()) - t) if seen else None,
                           "all": (max(seen.values()) - t) if len(seen) == len(survivors) else None,
                           "suspect": (min(suspects) - t) if suspects else None,
                           "false_events": others}
    c.start(victim)
    return out


def run_size(profile: str, n: int, a: argparse.Namespace, workdir: Path, rng: random.Random) -> dict[str, Any]:
    form_timeout = 60 + 4 * n
    res: dict[str, Any] = {"profile": profile, "members": n, "ok": False, "broke": ""}
    t_start = time.monotonic()
    seg = make_segment(a.prefix, hosts=n, client=False)
    try:
        for h in seg.hosts:
            seg.run(h.ns, ["nft", "-f", "-"], input=NFT_RULES)
        c = SpeakerCluster(seg, workdir / f"{profile}-{n}", profile=profile, resources=pool_docs())
        logs = Logs(c)
        for name in c.names:
            c.start(name)
        try:
            SpeakerCluster.wait(lambda: all_alive(c), form_timeout, "cluster formed")
        except AssertionError:
            alive = [len(c.members_alive(x)) for x in c.names]
            res["broke"] = f"did not form in {form_timeout}s (alive seen per node: min {min(alive)} of {n})"
            return res
        res["form_s"] = time.monotonic() - t_start
        time.sleep(a.settle)
        logs.poll()
        res["steady"] = steady_window(c, logs, a.window)
        trials = []
        for k in range(a.trials):
            try:
                tr = trial(c, logs, rng, profile, a.detect_timeout, form_timeout)
            except AssertionError as exc:
                res["broke"] = f"trial {k + 1}: {exc}"
                break
            trials.append(tr)
            print(f"    {profile} n={n} kill {k + 1}/{a.trials} {tr['victim']}: first dead "
                  f"{_ms(tr['first'])} ms, all {_ms(tr['all'])} ms, suspect {_ms(tr['suspect'])} ms, "
                  f"{tr['observers']}/{tr['survivors']} saw it, other suspicions {len(tr['false_events'])}",
                  flush=True)
        res["trials"] = trials
        firsts = [t["first"] for t in trials if t["first"] is not None]
        alls = [t["all"] for t in trials if t["all"] is not None]
        res["detect_first"] = {"p50": pct(firsts, 0.5), "max": max(firsts) if firsts else None, "n": len(firsts)}
        res["detect_all"] = {"p50": pct(alls, 0.5), "max": max(alls) if alls else None, "n": len(alls)}
        missed = [t for t in trials if t["all"] is None]
        false = len(res["steady"]["false_events"]) + sum(len(t["false_events"]) for t in trials)  # lists here
        res["false_suspicions"] = false
        reasons = []
        if missed:
            reasons.append(f"{len(missed)} kill(s) not seen dead by every survivor within {a.detect_timeout}s")
        if false:
            reasons.append(f"{false} suspicion(s) of unharmed members")
        if res["steady"]["speakers_cpu_machine_pct"] > 80:
            reasons.append(f"the speakers alone use {res['steady']['speakers_cpu_machine_pct']:.0f}% of the machine")
        if not res["broke"]:
            res["broke"] = "; ".join(reasons)
        res["ok"] = not res["broke"]
        return res
    finally:
        res["seconds"] = time.monotonic() - t_start
        seg.close()


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def table(results: list[dict]) -> str:
    hdr = (f"{'profile':7} {'members':>7} {'dead p50':>9} {'dead max':>9} {'all p50':>8} {'all max':>8} "
           f"{'B/s/node':>9} {'pkt/s':>6} {'CPU %':>6} {'CPUmax':>6} {'RSS MB':>6} {'sum':>5} {'machine':>7} "
           f"{'wait':>5} "
           f"{'false':>5}  notes")
    lines = [hdr, "-" * len(hdr)]
    for r in results:
        if "steady" not in r:
            lines.append(f"{r['profile']:7} {r['members']:7d}  {r['broke']}")
            continue
        s = r["steady"]
        df, da = r.get("detect_first", {}), r.get("detect_all", {})
        lines.append(
            f"{r['profile']:7} {r['members']:7d} {_ms(df.get('p50')):>9} {_ms(df.get('max')):>9} "
            f"{_ms(da.get('p50')):>8} {_ms(da.get('max')):>8} {s['bytes_s']['mean']:9.0f} {s['pkts_s']['mean']:6.1f} "
            f"{s['cpu_pct']['mean']:6.1f} {s['cpu_pct']['max']:6.1f} {s['rss_mb']['mean']:6.1f} "
            f"{s['speakers_cpu_machine_pct']:4.0f}% "
            f"{s['machine_busy_pct']:6.0f}% {s.get('runq_wait_ms_s', {}).get('mean', float('nan')):5.0f} "
            f"{r.get('false_suspicions', 0):5d}  {r['broke'] or 'ok'}")
    return "\n".join(lines)


def plot(results: list[dict], path: Path, command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 2, figsize=(13, 8.5))
    axes = list(grid.flat)
    colors = {"lan": "tab:blue", "fast": "tab:orange"}
    for profile in sorted({r["profile"] for r in results}):
        rs = [r for r in results if r["profile"] == profile and "steady" in r and r.get("detect_first")]
        if not rs:
            continue
        col = colors.get(profile)
        xs = [r["members"] for r in rs]
        axes[0].plot(xs, [r["detect_first"]["p50"] * 1000 for r in rs], "o-", color=col,
                     label=f"{profile}: first survivor, p50")
        axes[0].plot(xs, [(r["detect_all"]["max"] or float("nan")) * 1000 for r in rs], "s--", color=col,
                     alpha=0.6, label=f"{profile}: every survivor, max")
        for r in rs:
            ys = [t["first"] * 1000 for t in r["trials"] if t["first"] is not None]
            axes[0].scatter([r["members"]] * len(ys), ys, color=col, s=8, alpha=0.35)
        axes[1].plot(xs, [r["steady"]["bytes_s"]["mean"] / 1000 for r in rs], "o-", color=col,
                     label=f"{profile}: mean")
        axes[1].plot(xs, [r["steady"]["bytes_s"]["max"] / 1000 for r in rs], "s--", color=col, alpha=0.6,
                     label=f"{profile}: max node")
        axes[2].plot(xs, [r["steady"]["cpu_pct"]["mean"] for r in rs], "o-", color=col,
                     label=f"{profile}: speaker CPU, mean")
        axes[2].plot(xs, [r["steady"]["speakers_cpu_machine_pct"] for r in rs], "s--", color=col, alpha=0.6,
                     label=f"{profile}: all speakers, % of the machine")
        axes[2].plot(xs, [r["steady"]["machine_busy_pct"] for r in rs], ":", color=col, alpha=0.4,
                     label=f"{profile}: machine busy (other jobs too)")
        axes[3].plot(xs, [r.get("false_suspicions", 0) for r in rs], "o-", color=col,
                     label=f"{profile}: suspicions of unharmed members (whole run)")
    axes[0].set(xlabel="members", ylabel="kill -9 to declared dead (ms)", title="Failure detection")
    axes[3].set(xlabel="members", ylabel="events (count)", title="False suspicions (nodeSuspect/nodeFailed "
                "of members never harmed)")
    axes[1].set(xlabel="members", ylabel="gossip sent per node (kB/s)", title="Gossip traffic per node")
    axes[2].set(xlabel="members", ylabel="CPU (%)", title="CPU: per speaker (% of a core), all (% of 2 cores)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"nocloudlb speakers in namespaces on one 2-core machine (shared with other jobs)\n{command}",
                 fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def slim_events(events: list[dict], keep: int = 20) -> dict[str, Any]:
    """A list of false events as counts by event and by suspected node, with the first ``keep`` kept."""
    by_event: dict[str, int] = {}
    by_node: dict[str, int] = {}
    for e in events:
        by_event[e["event"]] = by_event.get(e["event"], 0) + 1
        by_node[str(e["node"])] = by_node.get(str(e["node"]), 0) + 1
    return {"count": len(events), "by_event": by_event, "by_node": by_node, "first": events[:keep]}


def slim(results: list[dict]) -> list[dict]:
    out = []
    for r in results:
        r = json.loads(json.dumps(r, default=str))
        if "steady" in r and isinstance(r["steady"].get("false_events"), list):
            r["steady"]["false_events"] = slim_events(r["steady"]["false_events"])
        for t in r.get("trials", []):
            if isinstance(t.get("false_events"), list):
                t["false_events"] = slim_events(t["false_events"], keep=5)
        out.append(r)
    return out


def write_json(path: Path, command: str, seed: int, started: float, a: argparse.Namespace,
               results: list[dict]) -> None:
    doc = {"command": command, "seed": seed, "started": started, "seconds": time.time() - started,
           "profiles": {p: PROFILES[p] for p in a.profiles.split(",")},
           "machine": {"cpus": os.cpu_count(), "uname": os.uname().release}, "results": slim(results)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="3,5", help="member counts, comma separated (at most 80)")
    ap.add_argument("--profiles", default="lan,fast")
    ap.add_argument("--trials", type=int, default=3, help="kill -9 trials per size")
    ap.add_argument("--window", type=float, default=10.0, help="steady-state measuring window, seconds")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after forming before measuring")
    ap.add_argument("--detect-timeout", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--prefix", default="sz", help="namespace name prefix")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--png", type=Path, default=None, help="write the plot here")
    ap.add_argument("--replot", type=Path, default=None,
                    help="print the table of a JSON written before and (with --png) plot it again; runs nothing")
    a = ap.parse_args()
    if a.replot:
        doc = json.loads(a.replot.read_text())
        print(table(doc["results"]))
        if a.png:
            plot(doc["results"], a.png, doc["command"])
            print(f"wrote {a.png}")
        return 0
    if os.geteuid() != 0:
        print("run as root (network namespaces)", file=sys.stderr)
        return 2
    sizes = [int(x) for x in a.sizes.split(",")]
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    command = "benchmarks/membership_scale.py " + " ".join(sys.argv[1:])
    results: list[dict] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="szbench-") as tmp:
        for profile in a.profiles.split(","):
            for n in sizes:
                print(f"  {profile}: {n} speakers ...", flush=True)
                r = run_size(profile, n, a, Path(tmp), rng)
                results.append(r)
                print(table([r]).splitlines()[-1], flush=True)
                if a.json:  # after every size, so a long run that is cut short keeps what it measured
                    write_json(a.json, command, seed, started, a, results)
                if "steady" not in r:
                    print(f"  {profile}: stopping at {n} members: {r['broke']}", flush=True)
                    break
    print(f"\nmembership at size: kill -9 -> nodeFailed (first survivor / every survivor), steady gossip "
          f"per node over {a.window:.0f} s, {a.trials} kills per size, seed {seed}\n")
    print(table(results))
    if a.json:
        write_json(a.json, command, seed, started, a, results)
        print(f"\nwrote {a.json}")
    if a.png:
        plot(results, a.png, command)
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except subprocess.TimeoutExpired as exc:
        print(f"timed out: {exc}", file=sys.stderr)
        sys.exit(1)
