"""``nocloudlb``: the speaker daemon and its operator commands.

    nocloudlb speaker [-c CONFIG]
    nocloudlb status [--socket S] [-o table|json|yaml] [--watch [--interval S]] [--cluster]
    nocloudlb label set k=v [k=v ...] | nocloudlb label unset k [k ...]
    nocloudlb reload | nocloudlb keys
    nocloudlb validate CONFIG
    nocloudlb probe IP [-i IFACE] [--timeout S] [--json]
    nocloudlb keygen
    nocloudlb support-bundle [-o FILE] [--socket S] [-c CONFIG] [--since 2h]
    nocloudlb --version
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .config import DEFAULT_PATH, DEFAULT_SOCKET

# Written by the speaker role into the virtual environment it installs (sys.prefix): the
# version of the nocloud.loadbalancer collection that installed this daemon.
COLLECTION_VERSION_FILE = "nocloudlb-collection-version"


def version_text(prefix: str | None = None) -> str:
    """The daemon's version and the collection's ("collection: unknown" without the role's file)."""
    from pathlib import Path

    from . import __version__

    try:
        collection = Path(prefix if prefix is not None else sys.prefix, COLLECTION_VERSION_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        collection = ""
    if not collection or collection == "unknown":
        return f"nocloudlb {__version__}\ncollection: unknown"
    return f"nocloudlb {__version__}\ncollection: nocloud.loadbalancer {collection}"


class _VersionAction(argparse.Action):
    """--version, printed as two lines (argparse's own version action reflows them into one)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()


def _request(sock: str, req: dict[str, Any]) -> dict[str, Any]:
    from .core.control_client import request

    try:
        return request(sock, req)
    except (OSError, ConnectionError) as exc:
        print(f"nocloudlb: cannot reach the speaker at {sock}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _status_request(a: argparse.Namespace) -> dict:
    """The status request with the VIP selection of the command line (all rows up to 1,000 VIPs by default,
    a summary past that; --all, or the filters, give rows). --cluster needs every row."""
    req: dict = {"cmd": "status"}
    if a.all or a.cluster:
        req["vips"] = "all"
    if a.cluster:
        req["announcers"] = True  # BGP VIPs: the nodes that should announce each
    if a.ip:
        req["ips"] = list(a.ip)
    for key in ("service", "reason", "leader"):
        if getattr(a, key) is not None:
            req[key] = getattr(a, key)
    if a.announcing:
        req["announcing"] = True
    if a.limit is not None:
        req["limit"] = a.limit
    return req


def _status(a: argparse.Namespace) -> int:
    import os

    from . import statusview as sv

    fmt = "json" if a.json else a.output
    on_tty = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    paint = sv.Paint(a.color == "always" or (a.color == "auto" and on_tty))
    if a.watch:
        if fmt != "table":
            print("nocloudlb status: --watch draws tables only", file=sys.stderr)
            return 2
        from .core.control_client import request

        return sv.watch(lambda: request(a.socket, _status_request(a)), sys.stdout, paint, a.interval, a.count,
                        redraw=sys.stdout.isatty())
    st = _request(a.socket, _status_request(a))
    if a.cluster:
        port = a.metrics_port or int(str(st.get("metricsBind") or ":7472").rpartition(":")[2] or 7472)
        view = sv.cluster_view(st, port)
        print(sv.dump(view, fmt) if fmt != "table" else sv.render_cluster(view, paint))
        return 1 if list(sv.problems(view)) else 0
    print(sv.dump(st, fmt) if fmt != "table" else sv.render(st, paint))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nocloudlb", description="nocloud.loadbalancer speaker and tools")
    p.add_argument("--version", action=_VersionAction, help="the speaker's version and the collection's, then exit")
    sub = p.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("speaker", help="run the speaker daemon")
    sp.add_argument("-c", "--config", default=DEFAULT_PATH)
    stp = sub.add_parser("status", help="the speaker's view: VIPs, owners, this node's role and why",
                         description="A table of every VIP (service, pool, owner, this node's role and the reason, "
                                     "conflicts) and the members; --watch redraws it and marks each change of owner "
                                     "with its time; --cluster asks every member what it announces.")
    stp.add_argument("--socket", default=DEFAULT_SOCKET)
    stp.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    stp.add_argument("--json", action="store_true", help="same as -o json")
    stp.add_argument("-w", "--watch", action="store_true", help="refresh until Ctrl-C; mark owner changes")
    stp.add_argument("--interval", type=float, default=0.5, help="seconds between refreshes (--watch)")
    stp.add_argument("--count", type=int, default=0, help="stop after N refreshes (--watch; 0 = never)")
    stp.add_argument("--cluster", action="store_true",
                     help="every member's view: this node's election against what each member announces "
                          "(asked on its metrics port); exit 1 on a VIP with two owners or none, or a BGP VIP "
                          "that a node which should announce it does not")
    stp.add_argument("--metrics-port", type=int, default=0, help="members' metrics port (default: this node's)")
    stp.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    stp.add_argument("--all", action="store_true",
                     help="every VIP row (by default, past 1,000 VIPs only a summary is shown)")
    stp.add_argument("--ip", action="append", help="only this VIP (repeatable)")
    stp.add_argument("--service", help="only this service (namespace/name; a glob such as 'prod/*' works)")
    stp.add_argument("--announcing", action="store_true", help="only the VIPs this node announces")
    stp.add_argument("--reason", help="only VIPs with this reason (notOwner, drained, ...)")
    stp.add_argument("--leader", help="only VIPs this node elects to NODE")
    stp.add_argument("--limit", type=int, help="at most N rows")
    for name, hlp in (("reload", "reload the config file"), ("keys", "ids of the gossip keys in use")):
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
    sbp = sub.add_parser("support-bundle", help="status, config (secrets redacted), logs, neighbours: one archive")
    sbp.add_argument("-o", "--output", default=None, help="archive path (default ./nocloudlb-support-HOST-TIME.tar.gz)")
    sbp.add_argument("--socket", default=DEFAULT_SOCKET)
    sbp.add_argument("-c", "--config", default=DEFAULT_PATH)
    sbp.add_argument("--since", default="2h", help="journal since this long ago (journalctl syntax, e.g. 30min)")
    shp = sub.add_parser("stop-handoff", help="before a stop of the speaker (the unit's ExecStop): drain this "
                         "node and wait until its layer-2 VIPs are taken, so the stop moves nothing unplanned")
    shp.add_argument("--socket", default=DEFAULT_SOCKET)
    shp.add_argument("--state-dir", default="/var/lib/nocloudlb", help="the speaker's stateDir (for the marker)")
    shp.add_argument("--timeout", type=float, default=8.0, help="seconds to wait for the takers (then stop anyway)")
    sub.add_parser("bgp-guard", help="after a stop of the speaker (the unit's ExecStopPost): withdraw bgpd's "
                   "networks unless the stop was clean and systemd restarts the speaker")
    a = p.parse_args(argv)

    if a.command == "speaker":
        from .daemon import Speaker

        return Speaker(a.config).run()
    if a.command == "status":
        return _status(a)
    if a.command == "bgp-guard":
        from . import logs
        from .bgp.hold import guard

        logs.setup("info", background=False)
        return guard()
    if a.command == "stop-handoff":
        from .stophandoff import handoff

        print(f"nocloudlb stop-handoff: {handoff(a.socket, a.state_dir, a.timeout)}", flush=True)
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
    if a.command == "support-bundle":
        from . import support

        return support.main(a.output, a.socket, a.config, a.since)
    if a.command == "keygen":
        from .membership import generate_key

        print(generate_key())
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
