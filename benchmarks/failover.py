#!/usr/bin/env python
"""Failover benchmark (a script, not a test): fault -> first gratuitous ARP from the new owner.

Three ``nocloudlb speaker`` processes in network namespaces on one bridge and a client
capturing with tcpdump. For each profile, ``--kills`` times: kill -9 the speaker leading a
VIP, time until the client sees the next node's gratuitous ARP, restart the killed speaker,
wait until it has taken its VIP back. With ``--keepalived``, the same fault for keepalived
(VRRP, default advert_int 1 s) in the same namespaces: kill -9 of the MASTER's keepalived,
time until the BACKUP's gratuitous ARP. Prints p50/p95/max side by side.

Run as root: ``.venv/bin/python benchmarks/failover.py [--kills 20] [--keepalived]``.
"""

from __future__ import annotations

import argparse
import os
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


def run_profile(profile: str, kills: int, workdir: Path) -> list[float]:
    vips = spread_vips(NODES)
    docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
    seg = make_segment("nspb", hosts=3)
    try:
        c = SpeakerCluster(seg, workdir / profile, profile=profile, resources=docs)
        c.start_all(timeout=30)
        cap = Capture(seg, workdir / f"{profile}.cap", expr="arp")
        out: list[float] = []
        for i in range(kills):
            ip = list(vips)[i % len(vips)]
            first, second = election_order(NODES, ip)[:2]
            c.wait(lambda ip=ip, first=first: c.announcing(first, ip)
                   and all(c.members_alive(n) == set(NODES) for n in NODES), 30, "stable cluster")
            time.sleep(0.5)
            t = c.stop(first, signal.SIGKILL)
            g = c.wait(lambda ip=ip, second=second, t=t: cap.gratuitous(ip, c.mac(second), t), 15,
                       f"gratuitous ARP from {second}")
            out.append(g[0]["ts"] - t)
            print(f"  {profile} kill {i + 1:2d}/{kills}: {first} -> {second} {out[-1] * 1000:6.0f} ms", flush=True)
            c.start(first)
        return out
    finally:
        seg.close()


KEEPALIVED_CONF = """global_defs {{
  router_id {name}
  enable_script_security
}}
vrrp_instance VI_1 {{
  state BACKUP
  interface eth0
  virtual_router_id 51
  priority {prio}
  advert_int 1
  virtual_ipaddress {{
    {vip}/24
  }}
}}
"""


def run_keepalived(kills: int, workdir: Path) -> list[float]:
    vip = "198.51.100.250"
    seg = make_segment("nspk", hosts=3)
    procs: dict[int, object] = {}
    try:
        def start(i: int) -> None:
            h = seg.hosts[i]
            conf = workdir / f"ka{i}.conf"
            conf.write_text(KEEPALIVED_CONF.format(name=f"n{i + 1}", prio=150 - i * 10, vip=vip))
            pid = workdir / f"ka{i}.pid"
            procs[i] = seg.popen(h.ns, ["keepalived", "-n", "-l", "-D", "-f", str(conf), "-p", str(pid),
                                        "-r", str(workdir / f"ka{i}.vrrp.pid")],
                                 stdout=open(workdir / f"ka{i}.log", "a"), stderr=open(workdir / f"ka{i}.log", "a"))

        def holder() -> int | None:
            for i, h in enumerate(seg.hosts):
                if f" {vip}/" in seg.run(h.ns, "ip -o addr show dev eth0").stdout:
                    return i
            return None

        for i in range(3):
            start(i)
        cap = Capture(seg, workdir / "ka.cap", expr="arp")
        out: list[float] = []
        for k in range(kills):
            SpeakerCluster.wait(lambda: holder() == 0, 30, "keepalived n1 MASTER")
            time.sleep(1.0)
            t = time.time()
            # kill -9 the whole keepalived of the master (parent and its VRRP child): a crash
            os.killpg(procs[0].pid, signal.SIGKILL)
            procs[0].wait(timeout=10)
            mac = seg.hosts[1].mac
            g = SpeakerCluster.wait(lambda t=t, mac=mac: cap.gratuitous(vip, mac, t), 15, "backup GARP")
            out.append(g[0]["ts"] - t)
            print(f"  keepalived kill {k + 1:2d}/{kills}: {out[-1] * 1000:6.0f} ms", flush=True)
            # a crashed keepalived leaves the VIP on the dead master's eth0; clean it like a reboot would
            seg.run(seg.hosts[0].ns, f"ip addr del {vip}/24 dev eth0", check=False)
            start(0)
        return out
    finally:
        seg.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--profiles", default="lan,fast")
    ap.add_argument("--keepalived", action="store_true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root (network namespaces)", file=sys.stderr)
        return 2
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="nspbench-") as tmp:
        for profile in a.profiles.split(","):
            results[f"nocloudlb {profile}"] = run_profile(profile, a.kills, Path(tmp))
        if a.keepalived:
            results["keepalived 2.2 (advert_int 1)"] = run_keepalived(a.kills, Path(tmp))
    print(f"\nfault (kill -9) -> first gratuitous ARP from the new owner, {a.kills} kills each\n")
    print(f"{'':32} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'min ms':>8}")
    for name, vals in results.items():
        ms = [v * 1000 for v in vals]
        print(f"{name:32} {statistics.median(ms):8.0f} {pct(ms, 0.95):8.0f} {max(ms):8.0f} {min(ms):8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
