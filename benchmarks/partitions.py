#!/usr/bin/env python
"""The partition matrix as a benchmark: the rows of tests/netns/test_partition_matrix.py for the
``fast`` and the ``lan`` profile, figures printed, and with ``--docs`` written into docs/chaos.md
(the block between ``<!-- partitions:results:begin -->`` and ``<!-- partitions:results:end -->``)
with an owners-over-time picture, docs/images/partitions-timeline.png.

Each row: real speakers in namespaces (three nodes, four for the partial partition, two for the
two-node row), the fault made with nftables rules inside the nodes' namespaces and held 10 s, then
healed; a client asks for every VIP every 0.1 s with a broadcast ARP request and records every MAC
that answers (tests/netns/partition_matrix.py, arp_sampler.py). The bounds are the ``fast``
profile's (the test asserts them); ``lan`` is shown against the same bounds for comparison.

The two-node row runs with the client's address as ``memberlist.witness``; a build whose config
refuses that option runs it without a witness and says so.

Run as root, under the namespace tests' lock (``make chaos-partitions`` does both)::

    .venv/bin/python benchmarks/partitions.py [--profiles fast,lan] [--rows inbound-drop,...] [--docs]

About 2 minutes per profile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "netns"))

from partition_matrix import ROWS, Matrix, Row, RowResult, run_row, witness_problem  # noqa: E402

DOC = ROOT / "docs" / "chaos.md"
PNG = ROOT / "docs" / "images" / "partitions-timeline.png"
JSON = ROOT / "docs" / "images" / "partitions.json"
BEGIN, END = "<!-- partitions:results:begin -->", "<!-- partitions:results:end -->"
COLORS = {"n1": "#4C72B0", "n2": "#55A868", "n3": "#C44E52", "n4": "#8172B2"}


def run_profile(profile: str, rows: list[Row], workdir: Path, witness: bool) -> list[RowResult]:
    made: dict[tuple[int, bool], Matrix] = {}
    out: list[RowResult] = []
    try:
        for row in rows:
            use_witness = row.witness and witness
            key = (row.nodes, use_witness)
            if key not in made:
                made[key] = Matrix(workdir / f"{profile}-{row.nodes}{'w' if use_witness else ''}", nodes=row.nodes,
                                   profile=profile, witness=use_witness, prefix="bpm")
            res = run_row(made[key], row)
            if row.witness:
                res.witness = "the client" if use_witness else "none (memberlist.witness refused by this build)"
            problems = res.problems()
            print(f"  {res.line()}  {'meets the bounds' if not problems else 'FAILS: ' + '; '.join(problems)}",
                  flush=True)
            out.append(res)
    finally:
        for m in made.values():
            m.close()
    return out


def _bound(value: float | None, zero: str = "0") -> str:
    if value is None:
        return "-"
    return zero if value == 0 else f"<= {value:g} s"


def _healed(res: RowResult) -> str:
    if res.info.get("heal") is None:
        return "-"
    return "never" if res.healed is None else f"{res.healed:.2f} s"


def table(results: list[RowResult]) -> str:
    lines = ["| profile | fault (10 s, then healed) | two owners: longest (bound) | no owner: longest (bound) "
             "| one owner after healing (bound) | within the bounds |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        row = r.row
        title = row.title + (f"; witness: {r.witness}" if r.witness else "")
        problems = r.problems()
        lines.append(f"| {r.profile} | {title} | {r.two_owner:.2f} s ({_bound(row.two_owner)}) | "
                     f"{r.no_owner:.2f} s ({_bound(row.no_owner)}) | {_healed(r)} ({_bound(row.healed, 'at once')}) | "
                     f"{'yes' if not problems else 'no: ' + '; '.join(problems)} |")
    return "\n".join(lines)


def picture(results: list[RowResult], path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    profiles = sorted({r.profile for r in results}, key=lambda p: (p != "fast", p))
    keys = [row.key for row in ROWS if any(r.row.key == row.key for r in results)]
    fig, axes = plt.subplots(len(keys), len(profiles), figsize=(7.5 * len(profiles), 0.6 + 1.3 * len(keys)),
                             squeeze=False)
    for ci, profile in enumerate(profiles):
        for ri, key in enumerate(keys):
            ax = axes[ri][ci]
            res = next((r for r in results if r.profile == profile and r.row.key == key), None)
            if res is None:
                ax.set_axis_off()
                continue
            vips = sorted(res.timeline)
            end = max((s[-1][0] for s in res.timeline.values() if s), default=1.0) + 0.1
            for lane, ip in enumerate(vips):
                # one bar per run of samples with the same answer (each lasting until the next sample), split
                # into one stripe per answering node, with a magenta band on top when two or more answered
                runs: list[list] = []  # [names, x, width]
                samples = res.timeline[ip]
                for i, (t, names) in enumerate(samples):
                    width = min((samples[i + 1][0] if i + 1 < len(samples) else t + 0.1) - t, 0.3)
                    if runs and runs[-1][0] == names and abs(runs[-1][1] + runs[-1][2] - t) < 0.15:
                        runs[-1][2] = t + width - runs[-1][1]
                    else:
                        runs.append([names, t, width])
                for names, x, width in runs:
                    if not names:
                        ax.broken_barh([(x, width)], (lane - 0.4, 0.8), color="#000000")
                        continue
                    h = 0.8 / len(names)
                    for k, name in enumerate(names):
                        ax.broken_barh([(x, width)], (lane - 0.4 + k * h, h), color=COLORS.get(name, "#999999"))
                    if len(names) >= 2:
                        ax.broken_barh([(x, width)], (lane + 0.4, 0.15), color="#FF00FF")
            ax.axvline(0, color="#333333", lw=0.8, ls="--")
            ax.text(0.05, len(vips) - 0.45, "fault", fontsize=6, va="bottom")
            if res.info.get("heal") is not None:
                healed_at = res.info["heal"] - res.info["fault"]
                ax.axvline(healed_at, color="#333333", lw=0.8, ls="--")
                ax.text(healed_at + 0.05, len(vips) - 0.45, "healed", fontsize=6, va="bottom")
            leaders = res.info.get("leaders", {})
            ax.set_yticks(range(len(vips)), [f"{ip} ({leaders.get(ip, '?')})" for ip in vips], fontsize=6)
            ax.set_ylabel("VIP (elected node)", fontsize=6)
            ax.set_ylim(-0.6, len(vips) + 0.3)
            ax.set_xlim(min(-1.0, min((s[0][0] for s in res.timeline.values() if s), default=-1.0)), end)
            verdict = "within the bounds" if not res.problems() else "OUT OF BOUNDS"
            ax.set_title(f"{profile}: {res.row.title} [{verdict}]", fontsize=7, loc="left")
            ax.tick_params(axis="x", labelsize=6)
    for ci in range(len(profiles)):
        axes[-1][ci].set_xlabel("seconds since the fault", fontsize=7)
    handles = [Patch(color=c, label=f"{n} answers") for n, c in COLORS.items()]
    handles += [Patch(color="#FF00FF", label="two or more MACs (band above the stripes)"),
                Patch(color="#000000", label="no answer")]
    fig.legend(handles=handles, loc="upper right", ncol=6, fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.25 / (0.6 + 1.3 * len(keys))))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def as_json(results: list[RowResult]) -> list[dict]:
    return [{"profile": r.profile, "row": r.row.key, "title": r.row.title, "two_owner": r.two_owner,
             "no_owner": r.no_owner, "healed_after": r.healed, "witness": r.witness,
             "during": {"two_owner": r.during.two_owner, "no_owner": r.during.no_owner},
             "after": None if r.after is None else {"two_owner": r.after.two_owner, "no_owner": r.after.no_owner},
             "seconds": round(r.seconds, 1), "node": r.info.get("node"), "problems": r.problems()}
            for r in results]


def write_docs(results: list[RowResult], when: str, seconds: float) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: the markers {BEGIN} / {END} are missing")
    block = "\n".join([
        BEGIN, "",
        f"Run of {when}, {seconds:.0f} s, written by `make chaos-partitions`. "
        "Bounds are the `fast` profile's, asserted by `tests/netns/test_partition_matrix.py`; `lan` is shown "
        "against the same bounds for comparison.", "",
        table(results), "",
        "![owners over time, partition matrix](images/partitions-timeline.png)", "", END])
    DOC.write_text(text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):])


def _commit() -> str:
    import subprocess  # noqa: PLC0415

    out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                         text=True, check=False)
    return out.stdout.strip() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", default="fast,lan")
    ap.add_argument("--rows", default=",".join(r.key for r in ROWS), help="row keys, comma separated")
    ap.add_argument("--docs", action="store_true", help="write docs/chaos.md's block, the picture and the JSON")
    ap.add_argument("--json", type=Path, default=None, help=f"figures here (--docs: {JSON.relative_to(ROOT)})")
    ap.add_argument("--png", type=Path, default=None, help=f"draw the picture here (--docs: {PNG.relative_to(ROOT)})")
    a = ap.parse_args()
    wanted = a.rows.split(",")
    unknown = sorted(set(wanted) - {r.key for r in ROWS})
    if unknown:
        ap.error(f"--rows: unknown {', '.join(unknown)} (rows: {', '.join(r.key for r in ROWS)})")
    rows = [r for r in ROWS if r.key in wanted]
    refused = witness_problem()
    if refused:
        print(f"memberlist.witness refused by this build ({refused}): the two-node row runs without a witness")
    t0 = time.time()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results: list[RowResult] = []
    with tempfile.TemporaryDirectory(prefix="partitions-") as tmp:
        for profile in a.profiles.split(","):
            print(f"profile {profile}:", flush=True)
            results += run_profile(profile, rows, Path(tmp), witness=not refused)
    seconds = time.time() - t0
    print()
    print(table(results))
    print(f"\n{len(results)} rows in {seconds:.0f} s")
    json_path = a.json or (JSON if a.docs else None)
    png_path = a.png or (PNG if a.docs else None)
    if json_path:
        json_path.write_text(json.dumps({"when": when, "commit": _commit(), "seconds": round(seconds),
                                         "rows": as_json(results)}, indent=1) + "\n")
    if png_path:
        picture(results, png_path)
    if a.docs:
        write_docs(results, when, seconds)
        print(f"wrote {DOC.relative_to(ROOT)}, {PNG.relative_to(ROOT)}, {JSON.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
