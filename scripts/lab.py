"""``make lab``: build the lab, deploy, verify, and end with a summary a person reads.

    python scripts/lab.py [--scenario default] [--log FILE]
    python scripts/lab.py --summary-only SUMMARY.json [--lab NAME]   # render a saved summary

Runs ``molecule converge`` and ``molecule verify`` of the scenario with their whole
output in a log file (its path is printed), shows one line per play while they
run, and ends with tables: the lab's hosts; every VIP with its service, the MAC and
node that answered ARP/NDP from the client, and the HTTP check; the measured
failover, drain and rolling-restart figures. The verify playbook writes what it saw
to the file named by NOCLOUDLB_LAB_SUMMARY; the lab's hosts come from the lab's own
inventory (/var/lib/nocloudlb-lab/<lab>/inventory.yml).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
LAB_ROOT = Path("/var/lib/nocloudlb-lab")


class Style:
    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.on else text


def table(rows: list[list[str]], style: Style | None = None, color_col: int | None = None) -> str:
    """Left-aligned columns; ``color_col`` is coloured green when it starts with ok, red otherwise."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)]
        if n == 0 and style:
            cells = [style(c, "1") for c in cells]
        elif style and color_col is not None:
            good = r[color_col].startswith(("ok", "0 of", "yes"))
            cells[color_col] = style(cells[color_col], "32" if good else "31")
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def hosts_table(lab: str) -> tuple[str, dict[str, str]]:
    inv_file = LAB_ROOT / lab / "inventory.yml"
    try:
        inv = json.loads(inv_file.read_text())
    except (OSError, ValueError) as exc:
        return f"(no lab inventory at {inv_file}: {exc})", {}
    rows = [["HOST", "GROUPS", "IPv4", "IPv6", "MAC (eth0)"]]
    macs: dict[str, str] = {}
    for name, h in sorted(inv["all"]["hosts"].items()):
        ifs = h.get("lab_interfaces") or [{}]
        mac = ifs[0].get("mac", "")
        macs[mac] = name
        rows.append([name, ",".join(h.get("lab_groups", [])), h.get("lab_ipv4") or "-", h.get("lab_ipv6") or "-", mac])
    return table(rows), macs


def render(summary: dict, style: Style) -> str:
    out: list[str] = []
    hosts, _macs = hosts_table(summary["lab"])
    out += [style(f"HOSTS of lab {summary['lab']}", "1"), hosts, ""]

    probes = {p["address"]: p for p in summary.get("probes", [])}
    http = {svc: (status, body) for svc, status, body in summary.get("http", [])}
    rows = [["VIP", "SERVICE", "PORT", "ELECTED", "ANSWERS ARP/NDP (MAC)", "HTTP"]]
    for v in summary.get("vips", []):
        p = probes.get(v["ip"], {})
        answers = p.get("answers", [])
        who = ", ".join(f"{a.get('node') or '?'} ({a['mac']})" for a in answers) or "nobody"
        status, body = http.get(v["service"], (None, ""))
        check = "ok" if status == 200 and body == v["expected"] and len(answers) == 1 else "NO"
        rows.append([v["ip"], v["service"], str(v["port"]), v["expected"], who,
                     f"{check}: {status} from {body or '-'}"])
    out += [style(f"VIPS probed from {summary.get('client', 'the client')}", "1"), table(rows, style, 5), ""]

    rows = [["MOVE", "VIP", "FROM -> TO", "FIRST ARP FROM NEW OWNER", "HTTP BACK", "REQUESTS FAILED", "AFTER UNDO"]]
    for f in summary.get("faults", []):
        undo = (f"owner back in {secs(f.get('restored_s'))}" if f.get("restored_s") is not None
                else "owner back only after ARP flush")
        rows.append([f["fault"], f["vip"], f"{f['host']} -> {f.get('expected_owner_after')}",
                     secs(f.get("first_announce_s")), secs(f.get("http_back_s")),
                     f"{f.get('http_failed')} of {f.get('http_requests')}", undo])
    d = summary.get("drain")
    if d:
        rows.append(["drain (drain.yml)", d["vip"], f"{d['host']} -> {d.get('expected_owner_after')}",
                     secs(d.get("first_announce_s")), secs(d.get("http_back_s")),
                     f"{d.get('http_failed')} of {d.get('http_requests')}",
                     f"undrain: owner back in {secs(d.get('restored_s'))}"])
    r = summary.get("rolling")
    if r:
        rows.append(["rolling restart", r["vip"], "every speaker", "-", "-",
                     f"{r.get('http_failed')} of {r.get('http_requests')}", "-"])
    out += [style("FAILOVER, measured from the client (HTTP every 50 ms)", "1"), table(rows, style), ""]
    out.append("A crash (kill -9, freeze, link down) may cost requests in flight; a drain and a rolling restart "
               "must cost none.")
    if summary.get("refused") is not None:
        said = "refused, and the speakers kept serving" if summary["refused"] else "NOT refused"
        out.append(f"An overlapping pool was {said}.")
    return "\n".join(out)


def run(cmd: list[str], log, env: dict[str, str], t0: float, style: Style) -> int:
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env=env, cwd=TOP, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        plain = ANSI.sub("", line).strip().lstrip("│ ").strip()
        m = re.match(r"PLAY \[(.*)\] \*+", plain)
        if m:
            print(f"  [{time.monotonic() - t0:5.0f} s] {m.group(1)}", flush=True)
        elif re.match(r"(fatal|failed): \[", plain) and "...ignoring" not in plain:
            print("  " + style(plain[:300], "31"), flush=True)
    return proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="default")
    ap.add_argument("--log", help="log file (default: .lab/logs/make-lab-<time>.log in the repository)")
    ap.add_argument("--summary-only", help="render this summary JSON and exit")
    a = ap.parse_args()
    style = Style(sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    if a.summary_only:
        print(render(json.loads(Path(a.summary_only).read_text()), style))
        return 0

    log_path = Path(a.log) if a.log else TOP / ".lab" / "logs" / time.strftime("make-lab-%Y%m%d-%H%M%S.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd, summary_path = tempfile.mkstemp(prefix="nocloudlb-lab-summary.", suffix=".json")
    os.close(fd)
    os.unlink(summary_path)
    env = dict(os.environ, NOCLOUDLB_LAB_SUMMARY=summary_path, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               NO_COLOR="1", PY_COLORS="0")
    t0 = time.monotonic()
    print(f"make lab: molecule converge and verify of scenario {a.scenario}; the whole log goes to\n  {log_path}",
          flush=True)
    rc = 0
    with open(log_path, "w") as log:
        for stage in ("converge", "verify"):
            print(f"  [{time.monotonic() - t0:5.0f} s] molecule {stage}", flush=True)
            rc = run(["molecule", stage, "-s", a.scenario], log, env, t0, style)
            if rc != 0:
                break
    took = time.monotonic() - t0
    print()
    summary = None
    if os.path.exists(summary_path):
        summary = json.loads(Path(summary_path).read_text())
        os.unlink(summary_path)
        kept = log_path.with_suffix(".summary.json")
        kept.write_text(json.dumps(summary, indent=2) + "\n")
        print(render(summary, style))
        print()
    if rc != 0:
        print(style(f"make lab FAILED (molecule exit {rc}) after {took:.0f} s.", "31"))
        print("The failing lines (the whole log is in the file below):")
        lines = ANSI.sub("", log_path.read_text(errors="replace")).splitlines()
        bad = re.compile(r"(fatal|failed): \[|\[ERROR\]|^ERROR ")
        hits = [i for i, line in enumerate(lines) if bad.search(line.lstrip("│ "))]
        for i in hits[-3:]:
            for line in lines[i:i + 8]:
                print("  " + line[:300])
    else:
        lab = summary["lab"] if summary else "?"
        print(style(f"make lab passed in {took:.0f} s.", "32") +
              f" The lab {lab} stays up: `.venv/bin/python roles/lab/files/labctl.py exec -n {lab} c1` gives a shell "
              "on the client, `... exec -n {lab} n1 -- /opt/nocloudlb/venv/bin/nocloudlb status` the speaker's view "
              "(docs/quickstart.md); `make lab-down` removes it.".replace("{lab}", lab))
    print(f"Full log: {log_path}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
