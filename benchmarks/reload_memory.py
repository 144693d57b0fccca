#!/usr/bin/env python
"""Memory across reloads of a changed config (issue 23 part 4: "memory that returns to its start-up level").

One speaker in this process's child (the real ``Speaker``: config loading, membership on loopback, the
layer-2 mode with a recording announcer, as the unit tests' ``inproc_speaker.Harness`` builds it; no
root, no namespaces), ``--vips`` services in one pool. After the first reconcile it rewrites the
config ``--reloads`` times with one label changed on every service (so every reload parses and
applies a new config, as a real edit does), reloads and reconciles, and after each prints:

- RSS (``/proc/self/statm``);
- the memory blocks Python holds (``sys.getallocatedblocks``: live objects, whichever allocator);
- pymalloc's arenas (1 MiB each) in use (``sys._debugmallocstats``; none under ``PYTHONMALLOC=malloc``).

It runs once per allocator, side by side: CPython's default (pymalloc for small objects) and
``PYTHONMALLOC=malloc`` (every object from glibc malloc, whose free pages ``malloc_trim`` can return).

    .venv/bin/python benchmarks/reload_memory.py                 # 10,000 VIPs, 8 reloads (about 1 min)
    .venv/bin/python benchmarks/reload_memory.py --vips 2000 --reloads 4
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

HERE = Path(__file__).resolve().parent
ALLOCATORS = {"pymalloc (default)": {}, "PYTHONMALLOC=malloc": {"PYTHONMALLOC": "malloc"}}


def docs(n: int, tag: str) -> list[dict]:
    """core_bench's pool and services (198.18.0.0/16, RFC 2544's range: 10,000 need a /16), labelled ``tag``."""
    sys.path.insert(0, str(HERE))
    from core_bench import l2_docs  # noqa: PLC0415

    return l2_docs(n, {"edit": tag})


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def pymalloc() -> dict[str, int]:
    """pymalloc's arenas in use (sys._debugmallocstats, its stderr read back) and the blocks allocated."""
    import ctypes  # noqa: PLC0415

    err = tempfile.TemporaryFile()
    saved = os.dup(2)
    try:
        os.dup2(err.fileno(), 2)
        sys._debugmallocstats()
        ctypes.CDLL(None).fflush(None)  # C stdio's buffer, before fd 2 goes back
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    err.seek(0)
    text = err.read().decode(errors="replace")
    arenas = re.search(r"# arenas allocated current\s*=\s*([\d,]+)", text)
    return {"arenas": int(arenas.group(1).replace(",", "")) if arenas else 0, "blocks": sys.getallocatedblocks()}


def child(vips: int, reloads: int) -> None:
    """Run in the child: one speaker, reloads, a JSON line per step on stdout."""
    sys.path[:0] = [str(HERE.parent / "tests" / "unit" / "speaker"), str(HERE.parent / "tests" / "netns")]
    from inproc_speaker import Harness  # noqa: PLC0415

    h = Harness(Path(tempfile.mkdtemp(prefix="nocloudlb-reload-")))
    try:
        sp = h.speaker("s", docs(vips, "r0"))
        sp.reconcile()
        print(json.dumps({"step": 0, "rss_mb": round(rss_mb(), 1), **pymalloc()}), flush=True)
        for i in range(1, reloads + 1):
            h.write("s", h.config("s", docs(vips, f"r{i}")))
            started = time.monotonic()
            out = sp.reload()
            sp.reconcile()
            took = time.monotonic() - started
            print(json.dumps({"step": i, "ok": bool(out.get("ok")), "s": round(took, 2), "rss_mb": round(rss_mb(), 1),
                              **pymalloc()}), flush=True)
    finally:
        h.close()


def run(label: str, env: dict[str, str], vips: int, reloads: int) -> list[dict]:
    print(f"# {label}: {vips} VIPs, {reloads} reloads", file=sys.stderr, flush=True)
    proc = subprocess.run([sys.executable, __file__, "--child", "--vips", str(vips), "--reloads", str(reloads)],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=1800, check=False)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{\"step\"")]
    if proc.returncode != 0 or len(rows) != reloads + 1:
        raise SystemExit(f"{label}: the child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--vips", type=int, default=10_000)
    ap.add_argument("--reloads", type=int, default=8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.child:
        child(a.vips, a.reloads)
        return 0
    results = {label: run(label, env, a.vips, a.reloads) for label, env in ALLOCATORS.items()}
    if a.json:
        print(json.dumps(results, indent=2))
        return 0
    labels = list(results)
    print(f"{a.vips} VIPs, one speaker; RSS MB / blocks Python holds (thousands) / pymalloc arenas (1 MiB) / "
          "reload+reconcile s")
    print("| after | " + " | ".join(labels) + " |")
    print("| --- |" + " --- |" * len(labels))
    for i in range(a.reloads + 1):
        cells = []
        for label in labels:
            r = results[label][i]
            cells.append(f"{r['rss_mb']} / {r['blocks'] // 1000}k / {r['arenas']}" + (f" / {r['s']}" if i else ""))
        print(f"| {'start' if i == 0 else f'reload {i}'} | " + " | ".join(cells) + " |")
    for label in labels:
        rows = results[label]
        print(f"{label}: RSS {rows[0]['rss_mb']} -> {rows[-1]['rss_mb']} MB "
              f"({(rows[-1]['rss_mb'] / rows[0]['rss_mb'] - 1) * 100:+.0f} %), blocks Python holds "
              f"{rows[0]['blocks']} -> {rows[-1]['blocks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
