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
import signal
import statistics
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "netns"))

from netns import make_segment  # noqa: E402
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
                    SpeakerCluster.wait(lambda: poller.served_by(owner, time.time() - 1.0, streak=3), 60,
                                        f"{name}: {owner} serving {vip} before {fault}")
                    time.sleep(SETTLE_BEFORE + rng.uniform(0, system.period))  # random phase of the timers
                    t = system.fault(fault, owner)
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
                          f"first ok {row['first_ok_s'] * 1000:6.0f} ms, lost {lost:3d}, answering {row['macs']} "
                          f"({time.time() - t_trial:.1f} s)",
                          flush=True)
                    system.undo(fault, owner)
                    # the owner takes its VIP back (both preempt); a keepalived killed -9 left its
                    # address behind, removed by undo
                    t_undo = time.time()
                    SpeakerCluster.wait(lambda t_undo=t_undo: poller.served_by(owner, t_undo, streak=3), 60,
                                        f"{name}: {owner} back after {fault}")
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

    for key in sorted({(r["system"], r["fault"]) for r in rows}, key=order):
        rs = [r for r in rows if (r["system"], r["fault"]) == key]
        g = [r["garp_s"] * 1000 for r in rs]
        f = [r["first_ok_s"] * 1000 for r in rs]
        out.append({"system": key[0], "fault": key[1], "trials": len(rs),
                    "garp_p50_ms": statistics.median(g), "garp_p95_ms": pct(g, 0.95),
                    "ok_p50_ms": statistics.median(f), "ok_p95_ms": pct(f, 0.95),
                    "lost_mean": statistics.mean(r["lost"] for r in rs), "lost_max": max(r["lost"] for r in rs),
                    "two_macs": sum(r["two_macs"] for r in rs)})
    return out


def table(summary: list[dict]) -> str:
    lines = ["| system | fault | trials | fault -> GARP p50 / p95 ms | fault -> first OK p50 / p95 ms | "
             "requests lost mean / max | two MACs afterwards |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in summary:
        lines.append(f"| {s['system']} | {s['fault']} | {s['trials']} "
                     f"| {s['garp_p50_ms']:.0f} / {s['garp_p95_ms']:.0f} "
                     f"| {s['ok_p50_ms']:.0f} / {s['ok_p95_ms']:.0f} | {s['lost_mean']:.1f} / {s['lost_max']} "
                     f"| {s['two_macs']} of {s['trials']} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- a PNG without plotting libraries

COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]


def png(summary: list[dict], path: Path, width: int = 900, height: int = 420) -> None:
    """Grouped bars: fault -> first successful request (p50, ms, log scale), one group per fault,
    one colour per system (legend order as SYSTEMS: blue, orange, green, red)."""
    px = [[(255, 255, 255)] * width for _row in range(height)]

    def rect(x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(height, y1)):
            row = px[y]
            for x in range(max(0, x0), min(width, x1)):
                row[x] = c

    import math
    top = max((s["ok_p50_ms"] for s in summary), default=1.0)
    scale = (height - 60) / math.log10(max(top, 10) * 1.2)
    faults = [f for f in FAULTS if any(s["fault"] == f for s in summary)]
    systems = [n for n in SYSTEMS if any(s["system"] == n for s in summary)]
    gw = (width - 40) // max(1, len(faults))
    bw = max(4, (gw - 20) // max(1, len(systems)))
    rect(20, height - 30, width - 20, height - 29, (0, 0, 0))
    for decade in range(0, 6):
        y = height - 30 - int(decade * scale)
        if y > 10:
            rect(20, y, width - 20, y + 1, (220, 220, 220))
    for fi, f in enumerate(faults):
        for si, n in enumerate(systems):
            s = next((x for x in summary if x["fault"] == f and x["system"] == n), None)
            if not s:
                continue
            h = int(math.log10(max(1.0, s["ok_p50_ms"])) * scale)
            x0 = 30 + fi * gw + si * bw
            rect(x0, height - 30 - h, x0 + bw - 2, height - 30, COLORS[si % len(COLORS)])
    for si, _n in enumerate(systems):
        rect(30 + si * 30, 10, 50 + si * 30, 22, COLORS[si % len(COLORS)])
    raw = b"".join(b"\x00" + bytes(c for p in row for c in p) for row in px)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated names from: " + ", ".join(SYSTEMS))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root (network namespaces)", file=sys.stderr)
        return 2
    faults = [f for f in a.faults.split(",") if f]
    bad = [f for f in faults if f not in FAULTS]
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad += [s for s in systems if s not in SYSTEMS]
    if bad:
        print(f"unknown fault or system: {', '.join(bad)}", file=sys.stderr)
        return 2
    rng = random.Random(a.seed)
    rows: list[dict] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="nssb-") as tmp:
        for name in systems:
            rows += run_system(name, faults, a.trials, Path(tmp), rng)
    summary = summarize(rows)
    print(f"\n{a.trials} trials per fault and system, random phase; {time.time() - t0:.0f} s in all\n")
    print(table(summary))
    if a.json:
        a.json.write_text(json.dumps({"trials": a.trials, "summary": summary, "rows": rows}, indent=1))
    if a.png:
        png(summary, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
