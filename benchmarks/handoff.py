"""Planned moves, who answers ARP meanwhile: an earlier release next to this code (the giver hands the VIP
off until the taker announces, l2/handoff.py; the taker announces, then answers, l2/responder.py), in one run.

For each side: three speakers (``lan`` profile) and a client on a bridge in network namespaces, a VIP led
by each node, HTTP servers whose answers take 50 ms. Each node in turn is drained (its VIP moves to the
next node) and undrained (it takes the VIP back), ``--rounds`` times, while the client asks ARP for every
VIP every ``--interval`` s (arp_sampler.py: every MAC that answers one request) and GETs each VIP back to
back. Printed per side: moves, ARP samples, the client's stalled rounds (two or more VIPs unanswered in
one round: the client fell behind, left out of the rest), samples without an answer (in all, and of the
moving VIP while it moved: from the label change to the new node answering alone) and with two MACs, the
longest window of each, failed requests, and the time from the label change to the VIP answered by the new
node alone (a probe every ~0.2 s, so an upper bound). What the other side does is read from its tree.
0.1.0 is the last release without the hand-off: commit ``--before`` (default 8998b708); 0.2.0 (253d5de2) hands
off, but its taker answers before it announces. Each runs from its own tree (tests/netns/previous_release.py).

    sudo .venv/bin/python benchmarks/handoff.py --rounds 3
    sudo .venv/bin/python benchmarks/handoff.py --before 253d5de2 --rounds 5 --interval 0.005
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "netns"))

import arp_sampler  # noqa: E402
from netns import make_segment  # noqa: E402
from nocloudlb.core.election import DRAIN_LABEL, election_order  # noqa: E402
from previous_release import check_tree, materialise  # noqa: E402
from speaker_harness import SpeakerCluster, VipWatch, pool_docs, service_doc, spread_vips  # noqa: E402

NODES = ["n1", "n2", "n3"]
#: 0.1.0, the last release whose giver stops answering at its decision
BEFORE = "8998b708baab981bf550ecf4b314afe58d95046a"


def run(root: Path | None, rounds: int, interval: float) -> dict:
    """One side: ``root`` None runs this code, else the previous release's tree."""
    with tempfile.TemporaryDirectory(prefix="nlb-handoff-") as tmp, make_segment("nhf", hosts=3) as seg:
        vips = spread_vips(NODES)
        docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
        c = SpeakerCluster(seg, Path(tmp) / "cluster", profile="lan", resources=docs)
        if root is not None:
            for n in NODES:
                c.source[n] = root
        c.start_all(timeout=40)
        c.wait(lambda: all(c.members_alive(n) == set(NODES) for n in NODES), 40, "full membership")
        c.wait(c.settled, 30, "every VIP past its checks")
        for ip, leader in vips.items():
            c.wait(lambda ip=ip, leader=leader: c.answered_by(ip, leader), 20, f"{ip} answered by {leader}")
        watch = VipWatch(c, vips, Path(tmp) / "samples.jsonl", interval, interval * 0.75, rounds * 30 + 60)
        t0 = time.time()
        took: list[float] = []
        moved: list[tuple[str, float, float]] = []  # (VIP, label changed, answered by the new node alone)
        for _round in range(rounds):
            for ip, leader in vips.items():
                nxt = next(n for n in election_order(NODES, ip) if n != leader)
                for node, args, owner in ((leader, ("set", f"{DRAIN_LABEL}=true"), nxt),
                                          (leader, ("unset", DRAIN_LABEL), leader)):
                    t = time.time()
                    c.label(node, *args)
                    c.wait(lambda ip=ip, owner=owner: c.answered_by(ip, owner), 15, f"{ip} answered by {owner}")
                    took.append(time.time() - t)
                    moved.append((ip, t, time.time()))
                    time.sleep(0.5)
        time.sleep(0.3)
        t_end = time.time()
        per_vip, failed = watch.stop(t0, t_end)
        # one VIP moves at a time: a round in which two or more VIPs went unanswered together is the client
        # falling behind (its replies came after the round's window), not a move; counted apart, left out
        silent = Counter(t for v in per_vip.values() for t, m in v if not m)
        stalls = {t for t, n in silent.items() if n > 1}
        per_vip = {ip: [(t, m) for t, m in v if t not in stalls] for ip, v in per_vip.items()}
        smp = [s for v in per_vip.values() for s in v]
        # a sample of the moving VIP between its label change and the new node answering it alone
        at_move = [(ip, t, m) for ip, v in per_vip.items() for t, m in v
                   if any(ip == mip and a <= t <= b for mip, a, b in moved)]
        return {
            "moves": len(took), "samples": len(smp), "stalledRounds": len(stalls),
            "noAnswer": sum(1 for _t, m in smp if not m), "twoMacs": sum(1 for _t, m in smp if len(m) > 1),
            "noAnswerAtMove": sum(1 for _ip, _t, m in at_move if not m),
            "longestNoAnswerMs": round(1000 * max(arp_sampler.longest(v, (not m for _t, m in v), t_end)
                                                  for v in per_vip.values()), 1),
            "longestTwoMacsMs": round(1000 * max(arp_sampler.longest(v, (len(m) > 1 for _t, m in v), t_end)
                                                 for v in per_vip.values()), 1),
            "requests": sum(len(p.samples) for p in watch.polls.values()),
            "failed": sum(len(f) for f in failed.values()),
            "movedP50": round(sorted(took)[len(took) // 2], 2), "movedMax": round(max(took), 2),
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--rounds", type=int, default=3, help="drain and undrain of every node, this many times")
    ap.add_argument("--interval", type=float, default=0.02, help="seconds between two ARP samples")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--before", default=BEFORE, help="the commit to compare with (default: 0.1.0's)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="nlb-previous-") as prev:
        root = materialise(Path(prev), a.before)
        where = check_tree(root)
        hands_off = (root / "nocloudlb" / "l2" / "handoff.py").exists()
        takes = "\n    T name ip" in (root / "nocloudlb" / "l2" / "responder.py").read_text()
        what = ("hands off; the taker " + ("announces, then answers" if takes else "answers first")
                if hands_off else "stops at its decision")
        sides = {f"{where['version']} ({a.before[:8]}: {what})": run(root, a.rounds, a.interval),
                 "this code (hands off; the taker announces, then answers)": run(None, a.rounds, a.interval)}
    print(f"\nplanned moves (drain, undrain), ARP asked every {a.interval * 1000:.0f} ms, lan profile")
    keys = ["moves", "samples", "stalledRounds", "noAnswer", "noAnswerAtMove", "longestNoAnswerMs", "twoMacs",
            "longestTwoMacsMs", "requests", "failed", "movedP50", "movedMax"]
    print("| side | " + " | ".join(keys) + " |")
    print("| --- |" + " --- |" * len(keys))
    for name, r in sides.items():
        print(f"| {name} | " + " | ".join(str(r[k]) for k in keys) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps(sides, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
