"""Run the layer-2 responder alone, driven by JSON lines on stdin (for tests and debugging).

    python -m nocloudlb.l2 serve [--node N] [--options JSON] [--member-mac MAC ...]
        stdin:  {"cmd": "set", "vips": {"198.51.100.200": []}, "skip_check": [],
                 "hand_off": {ip: [MAC, ...]}, "hand_off_seconds": S, "take": [ip, ...]}
                                                      (hand_off, its bound and take optional)
                {"cmd": "end_handoffs"}
                {"cmd": "stats"} | {"cmd": "conflicts"} | {"cmd": "quit"}
                {"cmd": "lease", "seconds": S}: renew the answering lease for S seconds (0: let it run out now)
                {"cmd": "busy", "seconds": S, "toggle": [ip, ...]}: for S seconds, keep the announcer
                    working as a busy daemon does (benchmarks): set_announced() of the whole set again
                    and again with the ``toggle`` addresses withdrawn and given back in turn, on another thread
        stdout: one JSON object per command; logs go to stderr as JSON lines
    python -m nocloudlb.l2 probe IP [-i IFACE] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from typing import Any

from . import L2Announcer, probe

_STD_ATTRS = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"level": record.levelname.lower(), "msg": record.getMessage()}
        doc.update({k: v for k, v in record.__dict__.items() if k not in _STD_ATTRS})
        return json.dumps(doc, default=str)


def _busy(ann: Any, seconds: float, toggle: list[str]) -> None:
    """A reconcile storm: the whole set handed over again and again, ``toggle`` withdrawn every other time."""
    wanted = list(ann.stats()["vips"])
    gone = set(toggle)
    fewer = [ip for ip in wanted if ip not in gone]
    end, turn = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        turn += 1
        vips = wanted if turn % 2 == 0 else fewer
        ann.set_announced({ip: [] for ip in vips}, skip_check=vips)
    ann.set_announced({ip: [] for ip in wanted}, skip_check=wanted)


def _serve(args: argparse.Namespace) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter())
    log = logging.getLogger("nocloudlb.l2")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    members = {bytes.fromhex(m.replace(":", "")) for m in args.member_mac}
    ann = L2Announcer(args.node, log, is_peer_mac=(members.__contains__ if members else None),
                      **json.loads(args.options))
    ann.start()
    print(json.dumps({"ok": True, "ready": True}), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                out: dict[str, Any]
                req = json.loads(line)
                cmd = req.get("cmd")
                if cmd == "set":
                    hand = {ip: [bytes.fromhex(m.replace(":", "")) for m in macs]
                            for ip, macs in req.get("hand_off", {}).items()}
                    ann.set_announced(req["vips"], req.get("skip_check", ()), hand_off=hand,
                                      hand_off_seconds=float(req.get("hand_off_seconds", 2.5)),
                                      take=req.get("take", ()))
                    out = {"ok": True}
                elif cmd == "end_handoffs":
                    ann.end_handoffs()
                    out = {"ok": True}
                elif cmd == "stats":
                    out = {"ok": True, "stats": ann.stats()}
                elif cmd == "busy":
                    threading.Thread(target=_busy, args=(ann, float(req["seconds"]), list(req.get("toggle", []))),
                                     daemon=True).start()
                    out = {"ok": True}
                elif cmd == "lease":
                    out = {"ok": True, "held": ann.renew_lease(float(req["seconds"]))}
                elif cmd == "conflicts":
                    out = {"ok": True, "conflicts": ann.conflicts()}
                elif cmd == "quit":
                    print(json.dumps({"ok": True}), flush=True)
                    break
                else:
                    out = {"ok": False, "error": f"unknown cmd {cmd!r}"}
            except Exception as exc:  # noqa: BLE001 - report any error to the driver
                out = {"ok": False, "error": str(exc)}
            print(json.dumps(out), flush=True)
    finally:
        ann.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nocloudlb.l2")
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--node", default="n1")
    s.add_argument("--options", default="{}", help="L2Announcer keyword arguments as JSON")
    s.add_argument("--member-mac", action="append", default=[], metavar="MAC",
                   help="a cluster member's MAC: its answers during a check are a handover (repeatable)")
    p = sub.add_parser("probe")
    p.add_argument("ip")
    p.add_argument("-i", "--iface")
    p.add_argument("--timeout", type=float, default=1.0)
    args = ap.parse_args(argv)
    if args.what == "serve":
        return _serve(args)
    answers = probe(args.ip, args.iface, args.timeout)
    print(json.dumps(answers))
    return 0 if answers else 1


if __name__ == "__main__":
    sys.exit(main())
