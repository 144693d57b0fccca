"""Run make targets one after another and end with a table of what ran.

    python scripts/run-steps.py [--title T] [--keep-going] [--json FILE] STEP [STEP ...]

Each STEP runs as ``make --no-print-directory STEP``; its output streams through
as it comes. What a step says about itself (pytest's "N passed", molecule's
scenario recap, the install test's last line) is picked from its output for the
table. Without --keep-going the first failing step stops the run and the rest are
listed as not run. A failed step's own words about why are repeated at the end, just above the
table, because a CI report may show only the last lines of a long log: the first
excerpt that names a failure (ansible's ``fatal:``/``[ERROR]: Task failed``,
pytest's ``E`` and ``FAILED`` lines, tracebacks) and the last one; a tool's own
closing ``ERROR`` lines (molecule, ansible-test) only when nothing named a failure.
Exit status: 0 when every step passed, else 1.

A STEP written ``a+b+c`` is a group: its steps run side by side, at most ``--jobs``
(default 2) at a time, in the order given (a CPU-bound step beside a chain of short
ones uses both cores of a small machine). Each one's output is printed whole when it
ends, and each keeps its own row and time in the table; the group's wall-clock time
is printed after it. A failing step in a group stops the run after the group.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# (pattern, how to render the match) for the "what it said" column
NOTES = [
    (re.compile(r"^=+ (.*\b(?:passed|failed|errors?|skipped)\b.*) in [0-9.]+s"), lambda m: m.group(1)),
    (re.compile(r"^(\S+)\s*: actions=(\d+)\s+successful=(\d+).*failed=(\d+)"),
     lambda m: f"molecule {m.group(1)}: {m.group(3)}/{m.group(2)} actions ok"),
    (re.compile(r"^Running sanity test '([^']+)'"), lambda m: "sanity"),
    (re.compile(r"=== \[ *\d+s\] done: (.*)"), lambda m: m.group(1)),
    (re.compile(r"Profile '(\w+)' was required, and it passed"), lambda m: f"ansible-lint {m.group(1)} passed"),
    (re.compile(r"^(docs/\w+/: .*)"), lambda m: m.group(1)),
    (re.compile(r"^Success: (no issues found in \d+ source files)"), lambda m: f"mypy {m.group(1)}"),
    (re.compile(r"^All checks passed!"), lambda m: "ruff clean"),
]
# lines that name a failure; each starts an excerpt of itself and the lines after it
WHY = re.compile(r"^(fatal: |failed: |FAILED |E   |Traceback |AssertionError|assert |\[ERROR\]: )|FAILED! =>")
# a tool's closing words ("ERROR    Ansible return code was 2"): used only when no line named a failure
WHY_WEAK = re.compile(r"^ERROR[: ]")
WHY_FIRST = 26     # lines kept of the first excerpt (the first failure is most often the cause)
WHY_LAST = 12      # lines kept of the last one
WHY_WIDTH = 400    # characters kept of one line


def fmt_time(s: float) -> str:
    return f"{int(s // 60)} m {int(s % 60):02d} s" if s >= 60 else f"{s:.0f} s"


def run_step(step: str, out=None) -> tuple[int, float, list[str], list[str]]:
    """Run ``make STEP``; its lines go to stdout as they come, or into the list ``out``."""
    t0 = time.monotonic()
    notes: list[str] = []
    # [first, last] excerpt of the lines that named a failure, and of the weak ones
    strong: list[list[str]] = []
    weak: list[list[str]] = []
    block: list[str] = []
    after = 0
    sanity = 0
    proc = subprocess.Popen(["make", "--no-print-directory", step], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        if out is None:
            sys.stdout.write(line)
            sys.stdout.flush()
        else:
            out.append(line)
        plain = ANSI.sub("", line).strip().lstrip("│ ").strip()
        short = ANSI.sub("", line).rstrip()
        short = short if len(short) <= WHY_WIDTH else short[:WHY_WIDTH] + " [...]"
        if after:
            after -= 1
            block.append(short)
        elif WHY.search(plain) or WHY_WEAK.search(plain):  # inside an excerpt a line cannot start another
            kept = strong if WHY.search(plain) else weak
            block = [short]
            kept[:] = kept[:1] + [block]  # the first one stays, the newest is the last
            after = (WHY_FIRST if len(kept) == 1 else WHY_LAST) - 1
        for pat, render in NOTES:
            m = pat.search(plain)
            if m:
                note = render(m)
                if note == "sanity":
                    sanity += 1
                elif note not in notes:
                    notes.append(note)
    rc = proc.wait()
    if sanity:
        notes.insert(0, f"{sanity} ansible-test sanity tests")
    why = strong or weak
    lines = why[0] + ["[...]"] + why[1] if len(why) == 2 else why[0] if why else []
    return rc, time.monotonic() - t0, notes, lines if rc else []


def run_group(steps: list[str], jobs: int, title: str) -> list[tuple[int, float, list[str], list[str]]]:
    """Run ``steps`` side by side, at most ``jobs`` at a time in the order given; each one's output is
    printed whole when it ends (the printing is serialised)."""
    results: dict[int, tuple[int, float, list[str], list[str]]] = {}
    todo = list(enumerate(steps))
    lock = threading.Lock()

    def lane() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i, step = todo.pop(0)
            lines: list[str] = []
            res = run_step(step, lines)
            with lock:
                results[i] = res
                print(f"\n===== {title}: make {step} ended ({'passed' if res[0] == 0 else f'exit {res[0]}'},"
                      f" {fmt_time(res[1])}); its output:", flush=True)
                sys.stdout.write("".join(lines))
                sys.stdout.flush()

    threads = [threading.Thread(target=lane) for _lane in range(max(1, min(jobs, len(steps))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[i] for i in range(len(steps))]


def table(rows: list[list[str]], color: bool = False) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)]
        if color and n:
            code = "32" if r[1] == "passed" else "31" if r[1].startswith("failed") else "2"
            cells[1] = f"\x1b[{code}m{cells[1]}\x1b[0m"
        out.append("  ".join(cells) + "  " + r[-1])
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("steps", nargs="+")
    ap.add_argument("--title", default="steps")
    ap.add_argument("--keep-going", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--jobs", type=int, default=2, help="steps of a group (a+b) run at once (default 2)")
    a = ap.parse_args()
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    results: list[dict] = []
    t0 = time.monotonic()
    stop = False
    for i, spec in enumerate(a.steps, 1):
        group = [g for g in spec.split("+") if g]
        if stop:
            results += [{"step": step, "result": "not run", "seconds": 0.0, "notes": [], "why": []} for step in group]
            continue
        if len(group) == 1:
            print(f"\n===== {a.title}: step {i}/{len(a.steps)}: make {group[0]}", flush=True)
            ran = [run_step(group[0])]
        else:
            g0 = time.monotonic()
            print(f"\n===== {a.title}: step {i}/{len(a.steps)}: make {', '.join(group)}, side by side "
                  f"({min(a.jobs, len(group))} at a time; each one's output when it ends)", flush=True)
            ran = run_group(group, a.jobs, a.title)
            print(f"\n===== {a.title}: {', '.join(group)} took {fmt_time(time.monotonic() - g0)} together", flush=True)
        for step, (rc, secs, notes, why) in zip(group, ran, strict=True):
            results.append({"step": step, "result": "passed" if rc == 0 else f"failed (exit {rc})",
                            "seconds": round(secs, 1), "notes": notes, "why": why})
            if rc != 0 and not a.keep_going:
                stop = True
    total = time.monotonic() - t0
    passed = sum(r["result"] == "passed" for r in results)
    ok = passed == len(results)
    rows = [["STEP", "RESULT", "TIME", "WHAT IT SAID"]]
    for r in results:
        rows.append([r["step"], r["result"], fmt_time(r["seconds"]) if r["result"] != "not run" else "-",
                     "; ".join(r["notes"]) or "-"])
    text = table(rows, color)
    verdict = "all passed" if ok else f"{passed} of {len(results)} passed"
    for r in results:  # above the table, so that the last lines of the log hold both
        if r.get("why"):
            print(f"\n===== why {r['step']} failed (the first and the last lines that said so)")
            print("\n".join(r["why"]))
    print(f"\n===== {a.title}: {verdict} in {fmt_time(total)}")
    print(text)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"title": a.title, "ok": ok, "seconds": round(total, 1), "steps": results}, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
