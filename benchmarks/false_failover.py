#!/usr/bin/env python
"""False failovers (a script, not a test): ownership changes while nothing fails.

Three ``nocloudlb speaker`` processes in namespaces (``--profile``, ``fast`` by default) lead
their VIPs for ``--minutes`` under one stress, then the run counts, from the speakers' own logs:

- ``serviceWithdrawn`` events (a node stopped answering a VIP it led: every one is a false
  failover here, as no node fails), and the VIPs' owner changes seen by polling each node's status;
- ``nodeUnreachable`` (a heartbeat suspicion) and ``nodeSuspect`` / ``nodeFailed`` (gossip).

Stresses (``--stress``):

- ``loss``: nftables on every node drops ``--loss`` % of every packet in and out (``numgen random``;
  these machines have no netem), so each way loses that share;
- ``cpu``: on the leader of the first VIP, ``--busy`` busy loops at nice -10 (a higher priority
  than the speaker's 0), pinned to no CPU: they take every core the machine has. On a shared
  machine keep this short.

Run as root: ``.venv/bin/python benchmarks/false_failover.py --stress loss --minutes 10``.
Prints one table row and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "netns"))

from netns import make_segment  # noqa: E402
from nocloudlb.core.election import election_order  # noqa: E402
from speaker_harness import SpeakerCluster, pool_docs, service_doc, spread_vips  # noqa: E402

NODES = ["n1", "n2", "n3"]
BUSY = "import os; os.nice(-10)\nwhile True: pass\n"


def loss_rules(pct: int) -> str:
    rule = f"numgen random mod 100 < {pct} drop"
    return ("table inet ffloss {\n"
            f"  chain in {{\n    type filter hook input priority -300;\n    {rule}\n  }}\n"
            f"  chain out {{\n    type filter hook output priority -300;\n    {rule}\n  }}\n"
            "}\n")


def run(profile: str, stress: str, minutes: float, loss: int, busy: int, workdir: Path) -> dict:
    vips = spread_vips(NODES, per_node=2)
    docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
    seg = make_segment("nff", hosts=3)
    try:
        c = SpeakerCluster(seg, workdir, profile=profile, resources=docs)
        c.start_all(timeout=60)
        time.sleep(2.0)
        owners = {ip: election_order(NODES, ip)[0] for ip in vips}
        start = time.time()
        procs = []
        if stress == "loss":
            for n in NODES:
                seg.run(c.host(n).ns, ["nft", "-f", "-"], input=loss_rules(loss))
        else:
            leader = owners[sorted(vips)[0]]
            procs = [seg.popen(c.host(leader).ns, [sys.executable, "-c", BUSY]) for _i in range(busy)]
        changes = 0
        polls = 0
        seen = dict(owners)
        end = start + minutes * 60
        try:
            while time.time() < end:
                time.sleep(0.5)
                for n in NODES:
                    st = c.try_status(n)
                    if not st:
                        continue
                    for v in st["vips"]:
                        if v["announcing"] and seen.get(v["ip"]) != n:
                            changes += 1
                            seen[v["ip"]] = n
                polls += 1
        finally:
            for p in procs:
                seg.kill(p, sig=9)
            if stress == "loss":
                for n in NODES:
                    seg.run(c.host(n).ns, ["nft", "delete", "table", "inet", "ffloss"], check=False)
        count: dict[str, int] = {}
        for n in NODES:
            for e in c.events(n):
                ts = e.get("ts", "")
                if not ts:
                    continue
                if datetime.fromisoformat(ts).timestamp() < start:
                    continue
                ev = e.get("event")
                if ev == "serviceWithdrawn" and e.get("reason") != "shutdown":
                    count["serviceWithdrawn"] = count.get("serviceWithdrawn", 0) + 1
                elif ev in ("nodeUnreachable", "nodeSuspect", "nodeFailed", "heartbeatCutOff"):
                    count[ev] = count.get(ev, 0) + 1
        return {"profile": profile, "stress": stress, "minutes": minutes, "loss_pct": loss if stress == "loss" else 0,
                "busy_loops": busy if stress == "cpu" else 0, "vips": len(vips), "owner_changes_polled": changes,
                "polls": polls, **count}
    finally:
        seg.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="fast")
    ap.add_argument("--stress", choices=("loss", "cpu"), default="loss")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--loss", type=int, default=10, help="percent of packets dropped each way on every node")
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy loops on the leader (cpu)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root (network namespaces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="nff-") as tmp:
        row = run(a.profile, a.stress, a.minutes, a.loss, a.busy, Path(tmp))
    print(json.dumps(row))
    if a.json:
        Path(a.json).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
