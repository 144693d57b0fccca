"""``nocloudlb status`` for people: tables, watching, the cluster's view.

Pure rendering over the speaker's status document (the control socket's
``status`` answer) plus, for ``--cluster``, what every member's metrics endpoint
says it announces. The CLI (cli.py) fetches; this module formats.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any, TextIO

# reason (as the speaker reports it per VIP) -> (this node's role, what it means)
REASONS: dict[str, tuple[str, str]] = {
    "": ("owner", "this node is elected and answers ARP/NDP for the VIP"),
    "notOwner": ("backup", "another node is elected; this one takes over if it goes"),
    "drained": ("drained", "this node carries the drain label and never announces"),
    "noHealthyBackend": ("ineligible", "Local policy: this node's health check for the service fails"),
    "noMatchingAdvertisement": ("ineligible", "no L2Advertisement selects this node (nodeSelectors) for the pool"),
    "noCandidates": ("nobody", "no live node is eligible: the VIP is not announced anywhere"),
    "notInAnyPool": ("nobody", "the service's address is in no IPAddressPool"),
    "notReady": ("waiting", "the speaker has not joined the cluster yet and takes no address"),
    "settling": ("waiting", "no join seed answered at start: waiting a few seconds for peers starting now"),
    "joinRefused": ("refused", "peers refuse this node's gossip (wrong key?): it announces nothing"),
    "conflictCheck": ("checking", "elected; probing that no other MAC answers before announcing (RFC 5227)"),
    "ipConflict": ("conflict", "elected, but another MAC answers for the VIP: reported, never fought"),
    "l2Pending": ("checking", "elected; the layer-2 announcer has not taken the VIP yet"),
    "suspectedByPeer": ("yielded", "the next node stopped hearing this one: it holds the VIP until it hears it again"),
    "noQuorum": ("waiting", "not connected to a majority of the cluster: keeps what it holds, takes nothing new"),
    "quorumSettling": ("waiting", "quorum just came back: a VIP from a member not seen alive waits a moment"),
    "yieldedOnWire": ("yielded", "another member announced the VIP while this node had no quorum: it gave way"),
    "stepFailed": ("nobody", "this VIP's part of the decision keeps failing (vipStepFailed in the log)"),
    "noUsableInterface": ("nobody", "elected, but every interface it may be announced on here is missing, down or "
                          "enslaved: nothing is announced (see the interface lines)"),
}
# BGP rows (protocol "bgp"): every eligible node announces, there is no single owner. The reason is
# nocloudlb.core.bgp's (why this node does not announce the VIP), or one of the two below.
BGP_REASONS: dict[str, tuple[str, str]] = {
    "noMatchingAdvertisement": ("ineligible", "BGP: no BGPAdvertisement selects this node for the pool"),
    "noPeer": ("ineligible", "BGP: no BGPPeer (of the advertisement) selects this node"),
    "drained": ("drained", "BGP: this node carries the drain label and never announces"),
    "noHealthyBackend": ("ineligible", "BGP, Local policy: this node's health check for the service fails"),
    "notLive": ("waiting", "BGP: this node is not a live member in the view it published"),
    "notInAnyPool": ("nobody", "the service's address is in no IPAddressPool"),
    "withdrawn": ("withdrawn", "BGP: the speaker withdrew every route (fail closed)"),
    "noSessionUp": ("announcing", "BGP: announced, but no session to a peer is established: no router has it"),
}
BGP_OWNER = "bgp"  # the OWNER of a BGP row in tables and in the summary's owners: every eligible node

# Status at size (issue 10): past this many VIP rows, a plain ``status`` request answers with the summary
# only (10,000 rows are 2.6 MB of JSON); ``"vips": "all"`` or a filter gives rows.
STATUS_ROWS = 1000
VIP_FILTERS = ("ips", "service", "announcing", "reason", "leader")


def vip_summary(vips: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over every VIP row: total, announced here, by this node's role, by reason, by owner."""
    by_reason: dict[str, int] = {}
    by_role: dict[str, int] = {}
    leaders: dict[str, int] = {}
    announcing = 0
    for v in vips:
        reason = v.get("reason") or "owner"
        by_reason[reason] = by_reason.get(reason, 0) + 1
        role = role_of(v)
        by_role[role] = by_role.get(role, 0) + 1
        owner = BGP_OWNER if v.get("protocol") == "bgp" else str(v.get("leader") or "none")
        leaders[owner] = leaders.get(owner, 0) + 1
        announcing += bool(v.get("announcing"))
    return {"total": len(vips), "announcing": announcing, "byRole": dict(sorted(by_role.items())),
            "byReason": dict(sorted(by_reason.items())), "leaders": dict(sorted(leaders.items()))}


def select_vips(vips: list[dict[str, Any]], req: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The VIP rows a ``status`` request asks for, and what was left out.

    ``vips``: "auto" (default: every row up to STATUS_ROWS, none past it unless filtered), "all", "none";
    filters (all must match): ``ips`` (list), ``service`` ("ns/name", glob allowed), ``announcing`` (bool),
    ``reason`` (as in the rows; "" = owner), ``leader`` (node name); ``limit``: at most that many rows.
    Raises ValueError naming a bad field.
    """
    mode = req.get("vips", "auto")
    if mode not in ("auto", "all", "none"):
        raise ValueError(f"status: 'vips' is one of auto, all, none, got {mode!r}")
    ips = req.get("ips")
    if ips is not None and (not isinstance(ips, list) or not all(isinstance(i, str) for i in ips)):
        raise ValueError("status: 'ips' is a list of addresses")
    for key in ("service", "reason", "leader"):
        if req.get(key) is not None and not isinstance(req[key], str):
            raise ValueError(f"status: {key!r} is a string")
    if req.get("announcing") is not None and not isinstance(req["announcing"], bool):
        raise ValueError("status: 'announcing' is true or false")
    limit = req.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError("status: 'limit' is a whole number >= 0")
    filtered = any(req.get(k) is not None for k in VIP_FILTERS)
    rows = vips
    if ips is not None:
        wanted = set(ips)
        rows = [v for v in rows if v.get("ip") in wanted]
    if req.get("service") is not None:
        pat = req["service"]
        rows = [v for v in rows if v.get("service") == pat or fnmatch.fnmatchcase(str(v.get("service")), pat)]
    if req.get("announcing") is not None:
        rows = [v for v in rows if bool(v.get("announcing")) == req["announcing"]]
    if req.get("reason") is not None:
        rows = [v for v in rows if (v.get("reason") or "") == req["reason"]]
    if req.get("leader") is not None:
        rows = [v for v in rows if v.get("leader") == req["leader"]]
    matched = len(rows)
    if mode == "none" or (mode == "auto" and not filtered and len(rows) > STATUS_ROWS):
        rows = []
    if limit is not None:
        rows = rows[:limit]
    return rows, {"total": len(vips), "matched": matched, "shown": len(rows), "omitted": matched - len(rows)}


ROLE_COLOR = {"owner": "32", "announcing": "32", "withdrawn": "31", "backup": "2", "drained": "33", "ineligible": "33",
              "checking": "33",
              "waiting": "33", "nobody": "31", "refused": "31", "conflict": "31"}


class Paint:
    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, text: str, code: str | None) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.on and code else text


def role_of(v: dict[str, Any]) -> str:
    if v.get("protocol") == "bgp":
        return "announcing" if v.get("announcing") else BGP_REASONS.get(v.get("reason") or "", ("?", ""))[0]
    if v.get("announcing"):
        return "owner"
    return REASONS.get(v.get("reason") or "", ("?", ""))[0]


def merge_bgp(rows: list[dict[str, Any]], bgp: dict[str, Any] | None, pool_of: Callable[[str], str] | None = None,
              announcers: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """The VIP rows with the BGP mode's part: every row gets ``protocol``.

    A VIP that no L2Advertisement serves (no layer-2 leader, reason noMatchingAdvertisement) and the BGP
    mode decides on becomes a BGP row: ``protocol`` "bgp", no leader, ``announcing`` and ``reason`` this
    node's BGP answer (``withdrawn`` while the mode withdrew everything, ``noSessionUp`` when announced
    with no session established). A VIP served by both keeps its layer-2 row. Either carries ``bgp``:
    announcing, reason, this node's sessions up and configured and, with ``announcers`` (ip -> the nodes
    that should announce it, from the published view), those nodes. ``bgp`` is the BGP mode's status."""
    vips = (bgp or {}).get("bgpVips") or {}
    if not vips:
        return [dict(r, protocol=r.get("protocol") or "layer2") for r in rows]
    peers = (bgp or {}).get("peers") or []
    up = sum(p.get("state") == "Established" for p in peers)
    withdrawn = bool((bgp or {}).get("withdrawn"))

    def part(ip: str) -> dict[str, Any]:
        info = vips[ip]
        on = bool(info.get("announcing")) and not withdrawn
        reason = "" if on else ("withdrawn" if withdrawn and info.get("announcing") else info.get("reason") or "")
        if on and peers and not up:
            reason = "noSessionUp"
        b: dict[str, Any] = {"announcing": on, "reason": reason, "sessionsUp": up, "sessions": len(peers)}
        if announcers is not None:
            b["announcers"] = sorted(announcers.get(ip, []))
        return b

    out = []
    seen = set()
    for r in rows:
        ip = str(r["ip"])
        if ip not in vips:
            out.append(dict(r, protocol=r.get("protocol") or "layer2"))
            continue
        seen.add((ip, r.get("service")))
        b = part(ip)
        if r.get("leader") is None and r.get("reason") == "noMatchingAdvertisement":
            out.append(dict(r, protocol="bgp", leader=None, announcing=b["announcing"], reason=b["reason"], bgp=b))
        else:
            out.append(dict(r, protocol="layer2", bgp=b))
    for ip in vips:  # VIPs the layer-2 mode has no row for
        for svc in vips[ip].get("services") or []:
            if (ip, svc) not in seen:
                b = part(ip)
                out.append({"ip": ip, "service": svc, "pool": pool_of(ip) if pool_of else "", "leader": None,
                            "announcing": b["announcing"], "reason": b["reason"], "protocol": "bgp", "bgp": b})
    return out


def owner_text(v: dict[str, Any]) -> str:
    """Who announces a VIP: its layer-2 leader, or for a BGP row "bgp" with the nodes that should announce it
    (when the status carries them)."""
    if v.get("protocol") == "bgp":
        ann = (v.get("bgp") or {}).get("announcers")
        return f"{BGP_OWNER}: {','.join(ann) or 'nobody'}" if ann is not None else f"{BGP_OWNER} (every eligible node)"
    return str(v.get("leader") or "none")


def owners(vips: list[dict[str, Any]]) -> dict[str, str]:
    """VIP -> owner_text of its first row (the site playbook's summary, speaker_info's ``owners``)."""
    out: dict[str, str] = {}
    for v in vips:
        out.setdefault(v["ip"], owner_text(v))
    return out


def table(rows: list[list[str]], paint: Paint | None = None, colors: list[list[str | None]] | None = None) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        cells = []
        for i, (c, w) in enumerate(zip(r, widths, strict=False)):
            cell = c.ljust(w) if i < len(r) - 1 else c
            code = "1" if n == 0 else (colors[n - 1][i] if colors else None)
            cells.append(paint(cell, code) if paint else cell)
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def conflict_text(v: dict[str, Any]) -> str:
    c = v.get("conflict") or {}
    return f"{c['mac']} on {c.get('iface', '?')}" if c.get("mac") else "-"


def header(st: dict[str, Any], paint: Paint) -> str:
    cfg = st.get("config", {})
    ml = st.get("memberlist", {})
    members = st.get("members", [])
    alive = sum(m.get("state") == "alive" for m in members)
    cfg_state = cfg.get("state", "?")
    parts = [
        f"node {paint(str(st.get('node')), '1')}",
        f"ready {paint('yes', '32') if st.get('ready') else paint('no', '31')}",
        f"config {paint(cfg_state, '32' if cfg_state == 'ok' else '31')}",
        f"members {alive}/{len(members)} alive",
        f"gossip {ml.get('state', '?')}{' (encrypted)' if ml.get('encrypted') else ''}",
        f"profile {st.get('profile') or '-'}",
        f"version {member_version(st)}",
    ]
    lines = ["  ".join(parts)]
    if ml.get("error"):
        lines.append(paint(f"gossip error: {ml['error']}", "31"))
    for err in cfg.get("errors", []):
        lines.append(paint(f"config refused, running the last good one: {err}", "31"))
    bgp = (st.get("modes") or {}).get("bgp")
    if isinstance(bgp, dict) and bgp.get("peers"):
        peers = bgp["peers"]
        up = sum(p.get("state") == "Established" for p in peers)
        sessions = ", ".join(f"{p.get('name')} {p.get('state', '?')}" for p in peers)
        lines.append(paint(f"bgp sessions {up}/{len(peers)} established: {sessions}", "32" if up else "31"))
    sync = st.get("connectionSync") or {}
    if sync.get("enabled"):
        lines.append(paint(connsync_text(sync), "32" if sync.get("peer") == "up" and sync.get("daemon") == "up"
                           and (sync.get("lastCommit") or {}).get("result") in (None, "ok") else "31"))
    tools = dict(st.get("modes") or {}, health=st.get("health") or {})
    lines += [paint(line, "31") for line in backoff_lines(tools)]
    lines += [paint(line, "31") for line in interface_lines(st.get("modes") or {})]
    fail = st.get("failClosed") or {}
    if fail.get("reason"):
        lines.append(paint(f"fail closed since {fail.get('since') or '?'}: this node publishes itself drained: "
                           f"{fail['reason']}", "31"))
    for f in st.get("stateFiles") or []:
        drained = "; the node started drained: undrain with `nocloudlb label unset " \
                  "node.kubernetes.io/exclude-from-external-load-balancers`" if f.get("drained") else ""
        lines.append(paint(f"state file {f.get('path')} was corrupt at start ({f.get('reason')}): set aside as "
                           f"{f.get('setAside') or '(could not be renamed)'}{drained}", "31"))
    return "\n".join(lines)


def connsync_text(sync: dict[str, Any]) -> str:
    """One line: conntrackd and its sync peer, and the last commit before a takeover."""
    line = f"connection sync: conntrackd {sync.get('daemon', '?')}, peer {sync.get('peer', '?')}"
    if sync.get("daemonError"):
        line += f" ({sync['daemonError']})"
    last = sync.get("lastCommit") or {}
    if last:
        when = datetime.datetime.fromtimestamp(last.get("at", 0), datetime.UTC).isoformat(timespec="seconds")
        line += f"; last commit {last.get('result')} in {last.get('seconds', 0):g} s at {when}"
        if last.get("detail"):
            line += f": {last['detail']}"
    else:
        line += "; no commit yet"
    return line


def _backoffs(value: Any, path: str = "") -> Iterable[tuple[str, dict[str, Any]]]:
    """Every back-off state (``{"state": "backoff", ...}``) in a mode's status, with where it is."""
    if isinstance(value, dict):
        if value.get("state") == "backoff" and "failures" in value:
            yield path, value
            return
        for key, sub in value.items():
            yield from _backoffs(sub, f"{path}.{key}" if path else str(key))


def backoff_lines(modes: dict[str, Any]) -> list[str]:
    """One line per external tool a mode backs off from, and bgpd not answering."""
    lines = []
    for name, st in sorted(modes.items()):
        if not isinstance(st, dict):
            continue
        if (st.get("frr") or {}).get("healthy") is False:
            lines.append(f"{name}: bgpd does not answer ({st['frr'].get('error') or '?'}): this node's BFD is blocked")
        for where, b in _backoffs(st):
            lines.append(f"{name}: {where} failing ({b.get('failures')} in a row), next try in "
                         f"{b.get('nextTrySeconds', 0):g} s: {b.get('error') or '?'}")
    return lines


def interface_lines(modes: dict[str, Any]) -> list[str]:
    """One line per interface a layer-2 mode cannot announce on (missing, down, enslaved, ...: issue 20 part 6)."""
    lines = []
    for name, st in sorted(modes.items()):
        report = st.get("interfaces") if isinstance(st, dict) else None
        if not isinstance(report, dict):
            continue
        for u in report.get("unusable") or []:
            what = "no interface" if u.get("iface") == "*" else f"interface {u.get('iface')}"
            tail = "" if u.get("reason") == "noCarrier" else ": nothing is announced on it"
            lines.append(f"{name}: {what} {u.get('reason')} since {u.get('since') or '?'}: {u.get('detail')}{tail}")
    return lines


def vip_rows(st: dict[str, Any], marks: dict[tuple[str, str], str] | None = None
             ) -> tuple[list[list[str]], list[list[str | None]]]:
    rows = [["VIP", "SERVICE", "POOL", "OWNER", "THIS NODE", "REASON", "CONFLICT"]]
    colors: list[list[str | None]] = []
    for v in sorted(st.get("vips", []), key=lambda v: (v["ip"], v["service"])):
        role = role_of(v)
        owner = owner_text(v)
        nobody = owner in ("none", f"{BGP_OWNER}: nobody")
        mark = (marks or {}).get((v["ip"], v["service"]))
        if mark:
            owner += f"  * since {mark}"
        reason = v.get("reason") or "-"
        b = v.get("bgp") or {}
        if v.get("protocol") == "bgp" and b.get("sessions"):
            reason += f" (sessions {b.get('sessionsUp', 0)}/{b['sessions']} up)"
        elif b:
            reason += f" (bgp: {'announced' if b.get('announcing') else b.get('reason') or '-'})"
        rows.append([v["ip"], v["service"], v.get("pool") or "-", owner, role, reason, conflict_text(v)])
        colors.append([None, None, None, "1" if mark else ("31" if nobody else None),
                       ROLE_COLOR.get(role), "31" if v.get("reason") == "noSessionUp" else None,
                       "31" if v.get("conflict") else None])
    return rows, colors


def summary_text(st: dict[str, Any]) -> str:
    """One line of counts (``vipSummary``), and how many rows were left out and how to ask for them."""
    sm = st.get("vipSummary") or {}
    shown = st.get("vipsShown") or {}
    roles = ", ".join(f"{k} {v}" for k, v in (sm.get("byRole") or {}).items())
    owners = ", ".join(f"{k} {v}" for k, v in (sm.get("leaders") or {}).items())
    line = f"{sm.get('total', 0)} VIPs, {sm.get('announcing', 0)} announced here ({roles}); owners: {owners}"
    if shown.get("omitted"):
        line += (f"\n{shown['omitted']} rows not shown (more than {STATUS_ROWS}): add --all, or filter with "
                 "--ip/--service/--announcing/--reason/--leader")
    return line


def render(st: dict[str, Any], paint: Paint, marks: dict[tuple[str, str], str] | None = None) -> str:
    out = [header(st, paint), ""]
    rows, colors = vip_rows(st, marks)
    if st.get("vipSummary") and (len(rows) > 1 or (st.get("vipsShown") or {}).get("omitted")):
        out.append(summary_text(st))
    if len(rows) > 1:
        out.append(table(rows, paint, colors))
    elif not (st.get("vipsShown") or {}).get("omitted"):
        out.append("no VIPs: no service has an address" if not (st.get("vipSummary") or {}).get("total")
                   else "no VIP matches")
    for c in st.get("conflicts", []):
        out.append(paint(f"CONFLICT {c.get('ip')}: answered by {c.get('mac')} on {c.get('iface')} since {c.get('at')}",
                         "31"))
    members = st.get("members", [])
    if members:
        mrows = [["MEMBER", "ADDRESS", "STATE", "LABELS"]]
        mcolors: list[list[str | None]] = []
        for m in sorted(members, key=lambda m: m["name"]):
            labels = ",".join(f"{k}={v}" for k, v in sorted(m.get("labels", {}).items())) or "-"
            mrows.append([m["name"], m.get("addr", "-"), m.get("state", "?"), labels])
            mcolors.append([None, None, "32" if m.get("state") == "alive" else "31", None])
        out += ["", table(mrows, paint, mcolors)]
    return "\n".join(out)


def stamp(t: float | None = None) -> str:
    return datetime.datetime.fromtimestamp(t if t is not None else time.time()).strftime("%H:%M:%S.%f")[:-3]


class Watcher:
    """Remembers each VIP's owner between refreshes and records every change with its time."""

    def __init__(self) -> None:
        self.owners: dict[tuple[str, str], str | None] = {}
        self.marks: dict[tuple[str, str], str] = {}
        self.events: list[str] = []

    def update(self, st: dict[str, Any], now: float | None = None) -> list[str]:
        new: list[str] = []
        seen = set()
        for v in st.get("vips", []):
            key = (v["ip"], v["service"])
            seen.add(key)
            owner = v.get("leader")
            if key in self.owners and self.owners[key] != owner:
                when = stamp(now)
                self.marks[key] = when
                was = self.owners[key] or "none"
                new.append(f"{when}  {v['ip']} ({v['service']}): owner {was} -> {owner or 'none'}")
            self.owners[key] = owner
        for key in set(self.owners) - seen:
            new.append(f"{stamp(now)}  {key[0]} ({key[1]}): gone from the config")
            del self.owners[key]
        self.events += new
        return new


def watch(fetch: Callable[[], dict[str, Any]], out: TextIO, paint: Paint, interval: float = 0.5,
          count: int = 0, redraw: bool = True) -> int:
    """Refresh every ``interval`` s (``count`` times; 0 = until interrupted). With ``redraw`` the
    screen is cleared and the table drawn again; without it (not a terminal) the first table is
    printed, then one line per change of owner or of reachability."""
    w = Watcher()
    n = 0
    last_error = ""
    try:
        while True:
            n += 1
            now = time.time()
            try:
                st = fetch()
                error = ""
            except (OSError, ValueError, SystemExit) as exc:
                st, error = None, f"{stamp(now)}  speaker unreachable: {exc}"
            if st is not None:
                new = []
                if last_error:
                    new.append(f"{stamp(now)}  speaker reachable again")
                    w.events.append(new[0])
                new += w.update(st, now)
            else:
                new = [error] if error != last_error else []
                if new:
                    w.events.append(error)
            last_error = error
            if redraw:
                out.write("\x1b[H\x1b[2J")
                out.write(f"nocloudlb status --watch  every {interval} s  {stamp(now)}  (Ctrl-C ends)\n\n")
                out.write((render(st, paint, w.marks) if st else paint(error, "31")) + "\n")
                if w.events:
                    out.write("\nCHANGES\n" + "\n".join(w.events[-12:]) + "\n")
            else:
                if n == 1 and st is not None:
                    out.write(render(st, paint) + "\n\nCHANGES\n")
                for line in new:
                    out.write(line + "\n")
            out.flush()
            if count and n >= count:
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


# -- the cluster's view -------------------------------------------------------------------
METRIC = re.compile(r'^nocloudlb_speaker_announced\{([^}]*)\}\s+([0-9.eE+-]+)')
SESSION = re.compile(r'^nocloudlb_bgp_session_up\{([^}]*)\}\s+([0-9.eE+-]+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_announced(text: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        m = METRIC.match(line)
        if m and float(m.group(2)) > 0:
            out.append(dict(LABEL.findall(m.group(1))))
    return out


def parse_sessions(text: str) -> tuple[int, int] | None:
    """(BGP sessions up, sessions) from a member's metrics, None when it exports none."""
    values = [float(m.group(2)) for m in map(SESSION.match, text.splitlines()) if m]
    return (sum(v > 0 for v in values), len(values)) if values else None


def scalar(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            try:
                return float(line.split()[1])
            except ValueError:
                return None
    return None


def fetch_metrics(host: str, port: int, timeout: float = 2.0) -> str:
    h = f"[{host}]" if ":" in host else host
    with urllib.request.urlopen(f"http://{h}:{port}/metrics", timeout=timeout) as resp:  # noqa: S310 (member addresses)
        return str(resp.read().decode("utf-8", "replace"))


def member_host(addr: str) -> str:
    host, _sep, _port = addr.rpartition(":")
    return host.strip("[]") or addr


def member_version(m: dict[str, Any]) -> str:
    """A member's speaker version and wire protocol as its gossip metadata says ("0.2.0 wire 1"); "-" for a
    member that publishes none (a speaker from before versions were published), or a status answer from
    such a speaker, which has no version fields at all."""
    version, wire = m.get("version") or "", m.get("wireVersion")
    if not version and wire is None:
        return "-"
    return f"{version or '?'} wire {wire if wire is not None else '?'}"


def versions_line(members: list[dict[str, Any]]) -> str:
    """"" when every member runs one version, else the versions side by side (a rolling upgrade)."""
    seen: dict[str, list[str]] = {}
    for m in members:
        seen.setdefault(member_version(m), []).append(m["name"])
    if len(seen) < 2:
        return ""
    parts = [f"{'unpublished (older)' if v == '-' else v}: {','.join(names)}" for v, names in sorted(seen.items())]
    return "mixed versions: " + "; ".join(parts)


def _bgp_announced(vips: list[dict[str, Any]]) -> list[str]:
    """The VIPs a status's rows say this node announces through BGP."""
    return sorted({v["ip"] for v in vips
                   if (v.get("protocol") == "bgp" and v.get("announcing")) or (v.get("bgp") or {}).get("announcing")})


def cluster_view(st: dict[str, Any], metrics_port: int,
                 get: Callable[[str, int], str] = fetch_metrics) -> dict[str, Any]:
    """Ask every member what it announces (its /metrics) beside what this node elected.

    The local speaker answers through its control socket (``st``); each member's gossip
    state, labels and config digest come from that same answer; what each member
    announces (layer 2 and BGP apart) and its BGP sessions come from its metrics endpoint
    at the member's gossip address.

    A layer-2 VIP is ok when exactly its elected node announces it. A BGP VIP (rows of
    protocol "bgp") is ok when the nodes that should announce it (``bgp.announcers`` of the
    row, from this node's published view) all do with a session up; a node among them that
    does not, or announces with no session established, is MISSING; nobody eligible is NO
    ANNOUNCER; a node announcing that should not is only "extra" (it still serves the VIP)."""
    members = []
    announced_by: dict[str, list[str]] = {}
    bgp_by: dict[str, list[str]] = {}
    my_digest = next((m.get("configDigest") for m in st.get("members", []) if m["name"] == st.get("node")), "")
    for m in sorted(st.get("members", []), key=lambda m: m["name"]):
        entry: dict[str, Any] = {"name": m["name"], "addr": m.get("addr"), "state": m.get("state"),
                                 "labels": m.get("labels", {}), "version": m.get("version") or "",
                                 "wireVersion": m.get("wireVersion"),
                                 "sameConfig": m.get("configDigest") == my_digest, "reachable": False,
                                 "configLoaded": None, "conflicts": None, "announces": [], "bgpAnnounces": [],
                                 "bgpSessions": None, "error": ""}
        if m["name"] == st.get("node"):
            peers = ((st.get("modes") or {}).get("bgp") or {}).get("peers") or []
            entry.update(reachable=True, configLoaded=st.get("config", {}).get("state") == "ok",
                         conflicts=len(st.get("conflicts", [])),
                         announces=sorted({v["ip"] for v in st.get("vips", [])
                                           if v.get("announcing") and v.get("protocol") != "bgp"}),
                         bgpAnnounces=_bgp_announced(st.get("vips", [])),
                         bgpSessions=[sum(p.get("state") == "Established" for p in peers), len(peers)]
                         if peers else None)
        elif m.get("state") in ("alive", "suspect"):
            try:
                text = get(member_host(m.get("addr", "")), metrics_port)
                rows = [r for r in parse_announced(text) if "ip" in r]
                sessions = parse_sessions(text)
                entry.update(reachable=True, configLoaded=scalar(text, "nocloudlb_config_loaded_bool") == 1,
                             conflicts=int(scalar(text, "nocloudlb_layer2_conflicts_current") or 0),
                             announces=sorted({r["ip"] for r in rows if r.get("protocol", "layer2") != "bgp"}),
                             bgpAnnounces=sorted({r["ip"] for r in rows if r.get("protocol") == "bgp"}),
                             bgpSessions=list(sessions) if sessions else None)
            except (OSError, ValueError) as exc:
                entry["error"] = str(getattr(exc, "reason", exc))
        for ip in entry["announces"]:
            announced_by.setdefault(ip, []).append(m["name"])
        for ip in entry["bgpAnnounces"]:
            bgp_by.setdefault(ip, []).append(m["name"])
        members.append(entry)
    no_session = {m["name"] for m in members if m["bgpSessions"] is not None and m["bgpSessions"][0] == 0}
    unknown = [m["name"] for m in members if not m["reachable"] and m["state"] in ("alive", "suspect")]
    vips = []
    for ip in sorted({v["ip"] for v in st.get("vips", [])}):
        rows = [v for v in st.get("vips", []) if v["ip"] == ip]
        entry = {"ip": ip, "services": sorted({v["service"] for v in rows}), "pool": rows[0].get("pool")}
        if rows[0].get("protocol") == "bgp":
            vips.append(entry | _bgp_verdict(rows[0], sorted(bgp_by.get(ip, [])), no_session, unknown))
            continue
        elected = rows[0].get("leader")
        by = sorted(announced_by.get(ip, []))
        if len(by) > 1:
            verdict = "TWO OWNERS"
        elif not by:
            verdict = "NO OWNER" if not unknown else "unknown"
        elif elected and by == [elected]:
            verdict = "ok"
        else:
            verdict = "moving"
        vips.append(entry | {"protocol": "layer2", "elected": elected, "announcedBy": by, "verdict": verdict})
    return {"node": st.get("node"), "time": st.get("time"), "members": members, "vips": vips}


def _bgp_verdict(row: dict[str, Any], by: list[str], no_session: set[str], unknown: list[str]) -> dict[str, Any]:
    """A BGP VIP's verdict (see cluster_view): ``by`` the members whose metrics say they announce it."""
    expected = (row.get("bgp") or {}).get("announcers")
    working = [n for n in by if n not in no_session]
    out: dict[str, Any] = {"protocol": "bgp", "elected": None if expected is None else list(expected),
                           "announcedBy": by}
    if expected is None:  # a speaker that does not say who should announce: any announcer will do
        verdict = "ok" if working else ("unknown" if unknown else "NO ANNOUNCER")
    elif not expected:
        verdict = "NO ANNOUNCER"
    else:
        missing = [n for n in expected if n not in working]
        extra = [n for n in by if n not in expected]
        if missing and all(n in unknown for n in missing):
            verdict = "unknown"
        elif missing:
            verdict = "MISSING " + ",".join(missing)
        elif extra:
            verdict = "extra " + ",".join(extra)
        else:
            verdict = "ok"
    return out | {"verdict": verdict}


def render_cluster(view: dict[str, Any], paint: Paint) -> str:
    rows = [["VIP", "SERVICES", "POOL", "ELECTED", "ANNOUNCED BY", "VERDICT"]]
    colors: list[list[str | None]] = []
    for v in view["vips"]:
        if v.get("protocol") == "bgp":
            elected = "bgp: " + (",".join(v["elected"]) or "nobody") if v["elected"] is not None else "bgp"
        else:
            elected = v["elected"] or "none"
        rows.append([v["ip"], ",".join(v["services"]), v["pool"] or "-", elected,
                     ",".join(v["announcedBy"]) or "nobody", v["verdict"]])
        colors.append([None, None, None, None, None, "32" if v["verdict"] == "ok" else "31"])
    bgp = any(m.get("bgpSessions") is not None for m in view["members"])
    mrows = [["MEMBER", "ADDRESS", "STATE", "VERSION", "ASKED", "CONFIG", "SAME CONFIG", "CONFLICTS", "ANNOUNCES",
              "LABELS"]]
    if bgp:
        mrows[0][9:9] = ["BGP SESSIONS UP"]
    mcolors: list[list[str | None]] = []
    for m in view["members"]:
        asked = "yes" if m["reachable"] else ("no: " + m["error"] if m["error"] else "no")
        cfg = "-" if m["configLoaded"] is None else ("ok" if m["configLoaded"] else "refused")
        mrows.append([m["name"], m["addr"] or "-", m["state"] or "?", member_version(m), asked, cfg,
                      "yes" if m["sameConfig"] else "NO",
                      "-" if m["conflicts"] is None else str(m["conflicts"]),
                      str(len(set(m["announces"]) | set(m.get("bgpAnnounces") or []))),
                      ",".join(f"{k}={v}" for k, v in sorted(m["labels"].items())) or "-"])
        mcolors.append([None, None, "32" if m["state"] == "alive" else "31", None, None if m["reachable"] else "31",
                        "31" if cfg == "refused" else None, None if m["sameConfig"] else "31",
                        "31" if m["conflicts"] else None, None, None])
        if bgp:
            sessions = m.get("bgpSessions")
            mrows[-1][9:9] = [f"{sessions[0]}/{sessions[1]}" if sessions else "-"]
            mcolors[-1][9:9] = ["31" if sessions and not sessions[0] else None]
    head = f"cluster as seen from {view['node']} at {view['time']} (elected: this node's election; " \
           "announced by: each member's own metrics)"
    mixed = versions_line(view["members"])
    return "\n".join([head, *([paint(mixed, "33")] if mixed else []), "", table(rows, paint, colors), "",
                      table(mrows, paint, mcolors)])


def dump(data: Any, fmt: str) -> str:
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=True, default_flow_style=False))
    return json.dumps(data, indent=2, sort_keys=True)


def problems(view: dict[str, Any]) -> Iterable[str]:
    for v in view["vips"]:
        if v["verdict"] in ("TWO OWNERS", "NO OWNER", "NO ANNOUNCER") or v["verdict"].startswith("MISSING"):
            yield f"{v['ip']}: {v['verdict']}"
