#!/usr/bin/env python
"""Ansible at size (issue 10, section 7): ``playbooks/site.yml`` on the lab's three nodes with N services.

For each N in ``--sizes``, on a fresh lab (``--lab``, default ``sz``: three systemd hosts in
namespaces, roles/lab/files/labctl.py, the same shape as molecule/default's lab):

1. first run of site.yml with N layer-2 services (one IPv6 pool on the nodes' segment, so
   thousands of addresses fit; the lan profile; gossip encrypted), on nodes that have nothing;
2. second run, unchanged inventory: must report changed=0 on every host (the tasks that
   changed are listed when not);
3. third run with one service added (N+1).

Each run uses the ``ansible.posix.json`` stdout callback, so every task's wall time and
per-host ``changed`` come from Ansible itself. Prints the runs' wall times, then the tasks
whose time grows with N (time at the largest size against the smallest, and the exponent of
the growth between the two largest sizes: 1 is linear, 2 quadratic), and writes JSON and a
PNG of time against N.

Run as root:
    .venv/bin/python benchmarks/ansible_scale.py --sizes 10,100                 # quick (make bench)
    .venv/bin/python benchmarks/ansible_scale.py --sizes 10,100,300,1000 \\
        --json docs/images/ansible_scale.json --png docs/images/ansible_scale.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "roles" / "lab" / "files"))

import labctl  # noqa: E402

POOL = "2001:db8:1::1000-2001:db8:1::2fff"  # 8,192 addresses on the lab segment's /64


def topology(name: str) -> dict[str, Any]:
    hosts = {}
    for i in (1, 2, 3):
        hosts[f"n{i}"] = {"groups": ["nodes", "speakers"],
                          "interfaces": [{"segment": "lan",
                                          "addresses": [f"198.51.100.{10 + i}/24", f"2001:db8:1::{10 + i}/64"]}]}
    return {"name": name, "segments": {"lan": {}}, "hosts": hosts}


def services(n: int) -> list[dict[str, Any]]:
    return [{"name": f"svc{i:05d}", "namespace": "bench", "ports": [8080 + i % 10], "pool": "bench",
             "ip_families": ["IPv6"]} for i in range(n)]


def extra_vars(n: int) -> dict[str, Any]:
    return {
        "ansible_become": False,  # lab hosts are entered as root (nsenter), without sudo
        "nocloudlb_hosts": "nodes",
        "nocloudlb_memberlist_address": "{{ lab_ipv4 }}",
        "nocloudlb_memberlist_profile": "lan",
        "nocloudlb_pools": [{"name": "bench", "addresses": [POOL]}],
        "nocloudlb_l2_advertisements": [{"name": "lan", "interfaces": ["eth0"]}],
        "nocloudlb_services": services(n),
        "nocloudlb_wait_ready_timeout": 300,
    }


def run_site(inventory: Path, work: Path, n: int, label: str, collections: Path) -> dict[str, Any]:
    varfile = work / f"vars-{label}.json"
    varfile.write_text(json.dumps(extra_vars(n)))
    env = dict(os.environ)
    env.update({
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_JSON_INDENT": "0",
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    })
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "-e", f"@{varfile}",
            str(REPO / "playbooks" / "site.yml")]
    t0 = time.monotonic()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(REPO), check=False)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.monotonic() - t0
    # CPU of ansible-playbook and everything it ran (its forks, and the module processes they start
    # in the nodes through nsenter): the work done, less sensitive than wall time to a loaded machine
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    (work / f"run-{label}.json").write_text(proc.stdout)
    (work / f"run-{label}.err").write_text(proc.stderr)
    try:
        doc = json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        raise RuntimeError(f"site.yml ({label}) printed no JSON (rc={proc.returncode}); "
                           f"stderr: {proc.stderr[-2000:]}") from None
    tasks = []
    for play in doc.get("plays", []):
        for t in play.get("tasks", []):
            task = t["task"]
            dur = task.get("duration", {})
            secs = _secs(dur.get("end")) - _secs(dur.get("start")) if dur.get("end") else 0.0
            hosts = t.get("hosts", {})
            changed = sorted(h for h, r in hosts.items() if r.get("changed"))
            failed = sorted(h for h, r in hosts.items() if r.get("failed") and not r.get("ignore_errors"))
            tasks.append({"play": play["play"]["name"], "name": task["name"], "seconds": secs,
                          "changed": changed, "failed": failed})
    stats = doc.get("stats", {})
    out = {"label": label, "services": n, "rc": proc.returncode, "wall": wall, "cpu": cpu, "tasks": tasks,
           "stats": stats, "changed": sum(s.get("changed", 0) for s in stats.values()),
           "failed": sum(s.get("failures", 0) + s.get("unreachable", 0) for s in stats.values())}
    if proc.returncode != 0:
        bad = [t for t in tasks if t["failed"]]
        out["error"] = (f"rc={proc.returncode}; failed tasks: {[t['name'] for t in bad]}; "
                        f"stderr tail: {proc.stderr[-800:]}")
    return out


def _secs(iso: str | None) -> float:
    import datetime as dt

    if not iso:
        return 0.0
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def task_key(t: dict) -> str:
    return f"{t['play'][:28]} | {t['name']}"


def task_times(run: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in run["tasks"]:
        k = task_key(t)
        out[k] = out.get(k, 0.0) + t["seconds"]
    return out


def growth(results: list[dict], label: str, top: int = 12) -> list[dict]:
    """Tasks whose time grows with N in the runs labelled ``label``: time per size, and the exponent
    between the two largest sizes (log(t2/t1) / log(n2/n1)); tasks under 0.5 s at the largest size
    are left out."""
    runs = sorted((r["runs"][label] for r in results if label in r.get("runs", {})), key=lambda r: r["services"])
    if len(runs) < 2:
        return []
    per = [task_times(r) for r in runs]
    ns = [r["services"] for r in runs]
    rows = []
    for k in per[-1]:
        ts = [p.get(k, 0.0) for p in per]
        if ts[-1] < 0.5:
            continue
        t1, t2 = ts[-2], ts[-1]
        exp = math.log(t2 / t1) / math.log(ns[-1] / ns[-2]) if t1 > 0.05 and t2 > 0 else float("nan")
        rows.append({"task": k, "times": dict(zip(ns, ts, strict=True)), "exponent": exp,
                     "growth": t2 - ts[0]})
    rows.sort(key=lambda r: -r["growth"])
    return rows[:top]


def table(results: list[dict]) -> str:
    hdr = (f"{'services':>8} {'first s':>8} {'cpu s':>6} {'second s':>9} {'cpu s':>6} {'2nd changed':>11} "
           f"{'+1 svc s':>9} {'cpu s':>6} {'+1 changed':>10}  notes")
    lines = [hdr, "-" * len(hdr)]
    for r in results:
        runs = r.get("runs", {})
        f, s, a = runs.get("first"), runs.get("second"), runs.get("add")

        def w(x: dict | None) -> str:
            return "-" if x is None else f"{x['wall']:.1f}"

        def u(x: dict | None) -> str:
            return "-" if x is None or "cpu" not in x else f"{x['cpu']:.1f}"

        def c(x: dict | None) -> str:
            return "-" if x is None else str(x["changed"])

        notes = r.get("error", "") or ("; second run changed: " + ", ".join(r["second_changed"])
                                       if r.get("second_changed") else "ok")
        lines.append(f"{r['services']:8d} {w(f):>8} {u(f):>6} {w(s):>9} {u(s):>6} {c(s):>11} {w(a):>9} {u(a):>6} "
                     f"{c(a):>10}  {notes}")
    return "\n".join(lines)


def growth_table(rows: list[dict], label: str) -> str:
    if not rows:
        return ""
    ns = list(rows[0]["times"])
    hdr = f"{'task (' + label + ' run)':70} " + " ".join(f"{'N=' + str(n):>8}" for n in ns) + f" {'exp':>5}"
    lines = [hdr, "-" * len(hdr)]
    for r in rows:
        exp = "-" if math.isnan(r["exponent"]) else f"{r['exponent']:.2f}"
        lines.append(f"{r['task'][:70]:70} " + " ".join(f"{r['times'][n]:8.2f}" for n in ns) + f" {exp:>5}")
    return "\n".join(lines)


def plot(results: list[dict], growth_rows: list[dict], path: Path, command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    ok = [r for r in results if r.get("runs")]
    for label, style in (("first", "o-"), ("second", "s-"), ("add", "^-")):
        pts = [(r["services"], r["runs"][label]["wall"]) for r in ok if label in r["runs"]]
        if pts:
            name = {"first": "first run (empty nodes)", "second": "second run (changed=0)",
                    "add": "one service added"}[label]
            axes[0].plot(*zip(*pts, strict=True), style, label=f"{name}, wall")
            cpts = [(r["services"], r["runs"][label]["cpu"]) for r in ok
                    if label in r["runs"] and "cpu" in r["runs"][label]]
            if cpts:
                axes[0].plot(*zip(*cpts, strict=True), style[0] + ":", alpha=0.5, label=f"{name}, CPU")
    axes[0].set(xlabel="services", ylabel="site.yml wall time / CPU time (s)", title="site.yml on three lab nodes")
    for r in growth_rows[:6]:
        xs = list(r["times"])
        axes[1].plot(xs, [r["times"][x] for x in xs], "o-", label=r["task"].split(" | ", 1)[1][:60])
    axes[1].set(xlabel="services", ylabel="task wall time, second run (s)", title="Tasks that grow with N")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"nocloud.loadbalancer site.yml at size, lab on one 2-core machine shared with other jobs\n"
                 f"{command}", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def one_size(n: int, a: argparse.Namespace, work: Path, collections: Path) -> dict[str, Any]:
    lab = labctl.Lab(a.lab)
    res: dict[str, Any] = {"services": n, "runs": {}}
    lab.down()  # a fresh lab: the first run starts from nodes that have nothing
    try:
        up = lab.up(topology(a.lab))
        res["lab_up_s"] = up.get("seconds")
        inv = Path(up["inventory"]) if up.get("inventory") else lab.dir / "inventory.yml"
        for label, count in (("first", n), ("second", n), ("add", n + 1)):
            r = run_site(inv, work, count, f"{n}-{label}", collections)
            res["runs"][label] = r
            print(f"    N={n} {label}: {r['wall']:.1f} s ({r['cpu']:.1f} s CPU), changed={r['changed']}, "
                  f"failed={r['failed']}", flush=True)
            if r.get("error"):
                res["error"] = f"{label} run: {r['error']}"
                break
        second = res["runs"].get("second")
        if second:
            res["second_changed"] = sorted({f"{t['name']} ({','.join(t['changed'])})"
                                            for t in second["tasks"] if t["changed"]})
    finally:
        if not a.keep:
            lab.down()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100", help="service counts, comma separated")
    ap.add_argument("--lab", default="sz", help="lab name (its own; not a molecule scenario's)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="leave the last lab up")
    ap.add_argument("--replot", type=Path, nargs="+", default=None,
                    help="merge the results of JSON files written before (one size each or more), print the "
                         "tables and (with --json/--png) write them again; runs nothing")
    a = ap.parse_args()
    if a.replot:
        docs = [json.loads(p.read_text()) for p in a.replot]
        merged: dict[int, dict] = {}
        for d in docs:
            for r in d["results"]:
                if r.get("runs") or r["services"] not in merged:
                    merged[r["services"]] = r
        results = [merged[n] for n in sorted(merged)]
        command = " + ".join(d["command"] for d in docs)
        report(results, command, a.json, a.png, docs[0]["started"])
        return 0
    if os.geteuid() != 0:
        print("run as root (the lab)", file=sys.stderr)
        return 2
    sizes = [int(x) for x in a.sizes.split(",")]
    command = "benchmarks/ansible_scale.py " + " ".join(sys.argv[1:])
    results: list[dict] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="szansible-") as tmp:
        work = Path(tmp)
        collections = work / "collections"
        (collections / "ansible_collections" / "nocloud").mkdir(parents=True)
        (collections / "ansible_collections" / "nocloud" / "loadbalancer").symlink_to(REPO)
        for n in sizes:
            print(f"  site.yml with {n} services ...", flush=True)
            try:
                results.append(one_size(n, a, work, collections))
            except (labctl.LabError, RuntimeError, subprocess.SubprocessError) as exc:
                results.append({"services": n, "runs": {}, "error": str(exc)})
                print(f"    N={n}: {exc}", flush=True)
            if a.json:
                write_json(a.json, command, started, results)
    report(results, command, a.json, a.png, started)
    return 0 if all(not r.get("error") for r in results) else 1


def report(results: list[dict], command: str, json_path: Path | None, png: Path | None, started: float) -> None:
    print(f"\nsite.yml on three lab nodes: wall time per run ({command})\n")
    print(table(results))
    rows = {label: growth(results, label) for label in ("first", "second", "add")}
    for label in ("second", "first", "add"):
        print()
        print(growth_table(rows[label], label))
    if json_path:
        write_json(json_path, command, started, results, rows)
        print(f"\nwrote {json_path}")
    if png:
        plot(results, rows["second"], png, command)
        print(f"wrote {png}")


def write_json(path: Path, command: str, started: float, results: list[dict],
               rows: dict[str, list[dict]] | None = None) -> None:
    slim = []
    for r in results:
        s = dict(r)
        s["runs"] = {k: {kk: vv for kk, vv in v.items() if kk != "stats"} for k, v in r.get("runs", {}).items()}
        slim.append(s)
    doc = {"command": command, "started": started, "seconds": time.time() - started, "results": slim,
           "growth": rows or {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
