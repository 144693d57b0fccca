"""A planned take, request by request: answering first and announcing a moment later (0.2.0) next to
announcing first and answering only then (this code's take, l2/responder.py ``T``), in one run.

Two real announcers (``python -m nocloudlb.l2 serve``, each with its responder child) and a client on a
bridge in network namespaces. The VIP moves back and forth ``--moves`` times per side, as the daemon moves it
in a planned move (the giver hands it off, the taker gains it), while the client sends an ARP request every
``--interval`` s, each from its own sender address (tests/netns/take_race.py). Printed per side: requests
sent during the moves, answered by two MACs, answered by none.

    sudo .venv/bin/python benchmarks/take_race.py --moves 200
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "netns"))

from netns import make_segment  # noqa: E402
from take_race import race  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", type=int, default=200, help="moves per side (default 200)")
    ap.add_argument("--interval", type=float, default=0.0002, help="seconds between ARP requests (default 0.0002)")
    args = ap.parse_args()
    with make_segment("ntr", hosts=2) as seg:
        results = [race(seg, args.moves, take=False, interval=args.interval),
                   race(seg, args.moves, take=True, interval=args.interval)]
    print(f"{'side':<32} {'moves':>6} {'requests':>9} {'two':>6} {'none':>5}")
    for r in results:
        side = "take: announce, then answer" if r.take else "answer first, announce after"
        print(f"{side:<32} {r.moves:>6} {r.requests:>9} {r.two:>6} {r.none:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
