"""Established connections across a director failure, per method, without and with conntrackd sync.

Network namespaces (tests/netns/conn_survival.py): directors n1, n2 running DataplaneMode with the
same rules, real servers n3, n4, a client holding ``--conns`` TCP connections through the VIP (a
line every 100 ms each, the server's answer read back) and opening 20 new ones a second. After
``--move-after`` s the director n1 fails (kill -9 of its data-plane process and its conntrackd, its
forwarding off) and n2 takes over: with sync it first commits the state conntrackd (FTFW, over a
dedicated veth pair) received from n1, then the floating gateway / SNAT address moves and the
client's neighbour entry for the VIP is re-pointed to n2.

Printed per case: held connections broken (reset, closed) or stalled past 5 s, out of ``--conns``;
the median and longest wait for an answer; new connections failed; and with sync the bytes per
second on the sync link (both directions) and the CPU seconds both conntrackd used in the run.

    sudo .venv/bin/python benchmarks/conn_survival.py [--conns 50] [--seconds 8] [--json out.json]

Measured on the 2-core machine shared with other runs (held connections broken or stalled of 50,
without -> with sync): NAT maglev 0 -> 0; NAT rr 26 -> 0; full-NAT maglev with a moving snatAddress
0 -> 0; full-NAT rr with a moving snatAddress 24 -> 0; full-NAT rr with the director's own address
50 reset -> 50 stalled (the synced entries still send the replies to the dead director's address);
DR maglev 0 -> 0 (DR flows never enter conntrack). No new connection failed in any case. Sync link:
7.7-8.7 kB/s both directions for 50 held plus 20 new connections a second, 0.3 kB/s idle (DR);
both conntrackd together 0.08-0.10 CPU s per 9 s run; the commit before the takeover 5-8 ms for
about 110 entries. Maglev keeps NAT and full-NAT flows even without sync: the new director picks the
mid-stream flow up (nf_conntrack_tcp_loose) and hashes it to the same server; round robin does not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "netns"))

from conn_survival import run_case  # noqa: E402
from netns import make_segment  # noqa: E402

# (label, method, scheduler, full-NAT source: "float" = a moving snatAddress, None = masquerade)
CASES = [
    ("nat maglev", "nat", "maglev", None),
    ("nat rr", "nat", "rr", None),
    ("fullnat maglev, moving snat", "fullnat", "maglev", "float"),
    ("fullnat rr, moving snat", "fullnat", "rr", "float"),
    ("fullnat rr, director's own address", "fullnat", "rr", None),
    ("dr maglev", "dr", "maglev", None),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=8.0, help="load duration after the connections are up")
    ap.add_argument("--move-after", type=float, default=3.0)
    ap.add_argument("--only", default="", help="run only the cases whose label holds this text")
    ap.add_argument("--json", help="write every result here")
    args = ap.parse_args()
    rows = []
    for label, method, scheduler, snat in CASES:
        if args.only and args.only not in label:
            continue
        for sync in (False, True):
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="nlb-connsync-") as root, make_segment("ncb", hosts=4) as seg:
                r = run_case(seg, root, method, scheduler, sync, snat=snat, conns=args.conns,
                             seconds=args.seconds, move_after=args.move_after)
            r["label"] = label
            r["wall"] = round(time.monotonic() - t0, 1)
            rows.append(r)
            print(f"# {label}, sync={sync}: {r.get('broken')} broken, {r.get('stalled')} stalled "
                  f"({r['wall']} s)", file=sys.stderr, flush=True)
    print(f"{'case':38} {'sync':5} {'broken+stalled':>14} {'stall p50/max ms':>17} {'new failed':>11} "
          f"{'sync B/s':>9} {'ctd CPU s':>9}")
    for r in rows:
        lost = (r.get("broken") or 0) + (r.get("stalled") or 0)
        p50 = f"{1000 * r['stallP50']:.0f}" if r.get("stallP50") is not None else "-"
        mx = f"{1000 * r['stallMax']:.0f}" if r.get("stallMax") is not None else "-"
        new = r.get("new", {})
        lost_of = f"{lost} of {r.get('held')}"
        print(f"{r['label']:38} {'yes' if r['sync'] else 'no':5} {lost_of:>14} "
              f"{p50 + '/' + mx:>17} {new.get('failed', '-'):>4} of {new.get('ok', 0) + new.get('failed', 0):<4} "
              f"{r.get('syncBytesPerSecond', '-'):>9} {r.get('conntrackdCpuSeconds', '-'):>9}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
