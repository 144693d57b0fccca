"""``nocloudlb``: the speaker daemon and its operator commands.

    nocloudlb speaker [-c CONFIG]
    nocloudlb status [--socket S] [--json]
    nocloudlb label set k=v [k=v ...] | nocloudlb label unset k [k ...]
    nocloudlb reload | nocloudlb keys
    nocloudlb validate CONFIG
    nocloudlb probe IP [-i IFACE] [--timeout S] [--json]
    nocloudlb keygen
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .config import DEFAULT_PATH, DEFAULT_SOCKET


def _request(sock: str, req: dict[str, Any]) -> dict[str, Any]:
    from .core.control_client import request

    try:
        return request(sock, req)
    except (OSError, ConnectionError) as exc:
        print(f"nocloudlb: cannot reach the speaker at {sock}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _print_status(st: dict[str, Any]) -> None:
    cfg = st.get("config", {})
    ml = st.get("memberlist", {})
    print(f"node {st.get('node')}  ready={st.get('ready')}  profile={st.get('profile')}  "
          f"memberlist={ml.get('state')}{'  ' + ml['error'] if ml.get('error') else ''}")
    print(f"config {cfg.get('state')}  loadedAt={cfg.get('loadedAt')}  lastGoodAt={cfg.get('lastGoodAt')}")
    for err in cfg.get("errors", []):
        print(f"  error: {err}")
    labels = st.get("labels", {})
    print("labels " + (", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"))
    print("\nMEMBER                ADDRESS                 STATE    LABELS")
    for m in st.get("members", []):
        lab = ",".join(f"{k}={v}" for k, v in sorted(m.get("labels", {}).items()))
        print(f"{m['name']:<21} {m['addr']:<23} {m['state']:<8} {lab}")
    print("\nVIP                      SERVICE                  POOL         LEADER       HERE")
    for v in st.get("vips", []):
        here = "announcing" if v["announcing"] else (v.get("reason") or "-")
        conflict = v.get("conflict") or {}
        if not v["announcing"] and conflict.get("mac"):
            here += f" (answered by {conflict['mac']} on {conflict.get('iface')})"
        print(f"{v['ip']:<24} {v['service']:<24} {v['pool']:<12} {str(v['leader']):<12} {here}")
    for c in st.get("conflicts", []):
        print(f"CONFLICT {c.get('ip')} answered by {c.get('mac')} on {c.get('iface')} at {c.get('at')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nocloudlb", description="nocloud.loadbalancer speaker and tools")
    sub = p.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("speaker", help="run the speaker daemon")
    sp.add_argument("-c", "--config", default=DEFAULT_PATH)
    for name, hlp in (("status", "show the speaker's view"), ("reload", "reload the config file"),
                      ("keys", "ids of the gossip keys in use")):
        x = sub.add_parser(name, help=hlp)
        x.add_argument("--socket", default=DEFAULT_SOCKET)
        x.add_argument("--json", action="store_true")
    lp = sub.add_parser("label", help="set or unset runtime labels (persisted)")
    lp.add_argument("--socket", default=DEFAULT_SOCKET)
    lp.add_argument("action", choices=["set", "unset"])
    lp.add_argument("items", nargs="+", help="k=v for set, k for unset")
    vp = sub.add_parser("validate", help="check a config file; exit 1 with every problem")
    vp.add_argument("config")
    pp = sub.add_parser("probe", help="every MAC that answers ARP/NDP for IP, like arping")
    pp.add_argument("ip")
    pp.add_argument("-i", "--iface", default=None)
    pp.add_argument("--timeout", type=float, default=1.0)
    pp.add_argument("--json", action="store_true")
    sub.add_parser("keygen", help="print a new gossip key (base64, 32 bytes)")
    a = p.parse_args(argv)

    if a.command == "speaker":
        from .daemon import Speaker

        return Speaker(a.config).run()
    if a.command == "status":
        st = _request(a.socket, {"cmd": "status"})
        if a.json:
            print(json.dumps(st, indent=2, sort_keys=True))
        else:
            _print_status(st)
        return 0
    if a.command in ("reload", "keys"):
        resp = _request(a.socket, {"cmd": a.command})
        print(json.dumps(resp, indent=2, sort_keys=True))
        return 0 if resp.get("ok") else 1
    if a.command == "label":
        if a.action == "set":
            pairs = {}
            for item in a.items:
                k, eq, v = item.partition("=")
                if not eq or not k:
                    print(f"nocloudlb label set: {item!r} is not key=value", file=sys.stderr)
                    return 2
                pairs[k] = v
            req: dict[str, Any] = {"cmd": "label", "set": pairs}
        else:
            req = {"cmd": "label", "unset": a.items}
        resp = _request(a.socket, req)
        print(json.dumps(resp, indent=2, sort_keys=True))
        return 0 if resp.get("ok") else 1
    if a.command == "validate":
        from .daemon import validate

        ok, errors = validate(a.config)
        for err in errors:
            print(err, file=sys.stderr)
        if ok:
            print(f"{a.config}: ok")
        return 0 if ok else 1
    if a.command == "probe":
        from .l2 import probe as _probe

        fn = getattr(_probe, "probe", _probe)
        answers = fn(a.ip, a.iface, a.timeout)
        if a.json:
            print(json.dumps(answers, indent=2))
        else:
            for ans in answers:
                print(f"{a.ip} is at {ans.get('mac')} on {ans.get('iface')} ({ans.get('latency_ms', 0):.3f} ms)")
            if not answers:
                print(f"{a.ip}: no answer within {a.timeout}s")
        return 0 if answers else 1
    if a.command == "keygen":
        from .membership import generate_key

        print(generate_key())
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
