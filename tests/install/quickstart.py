"""Run docs/quickstart.md's commands on a lab deployed from the installed collection.

    python quickstart.py --lab fh --labctl PATH/labctl.py --doc docs/quickstart.md

Takes the quickstart's console blocks, keeps the lines that run a command in a lab host
(`$L exec -n l2 HOST -- ...`), points them at this lab, and runs each (interactive
shells and --watch, which never ends, are left out). Then watches a VIP move as the
quickstart tells: `nocloudlb status --watch` on a backup node while the owner
is frozen with `$L fault ... freeze OWNER`; the watch
must print the change of owner with its time.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path


def blocks(doc: str) -> list[str]:
    return [line.strip() for b in re.findall(r"```console\n(.*?)```", doc, re.S) for line in b.splitlines()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lab", required=True)
    ap.add_argument("--labctl", required=True)
    ap.add_argument("--doc", required=True)
    a = ap.parse_args()
    L = [sys.executable, a.labctl]
    lines = blocks(Path(a.doc).read_text())
    ran = 0
    for line in lines:
        m = re.match(r"\$L exec -n l2 (\w+) -- (.+?)(\s+#.*)?$", line)
        if not m or "--watch" in line:
            continue
        host, cmd = m.group(1), shlex.split(m.group(2))
        proc = subprocess.run([*L, "exec", "-n", a.lab, host, "--", *cmd], capture_output=True, text=True,
                              timeout=60, check=False)
        first = (proc.stdout.strip().splitlines() or [""])[0]
        print(f"  {host}$ {' '.join(cmd)}  -> exit {proc.returncode}: {first[:100]}")
        if proc.returncode != 0:
            print(proc.stdout + proc.stderr)
            return 1
        ran += 1
    if ran < 4:
        print(f"quickstart: only {ran} commands found in {a.doc}; expected the status, --cluster, curl and neigh lines")
        return 1
    # watch a VIP move, as section 3 says
    nocloudlb = "/opt/nocloudlb/venv/bin/nocloudlb"
    st = json.loads(subprocess.run([*L, "exec", "-n", a.lab, "n1", "--", nocloudlb, "status", "-o", "json"],
                                   capture_output=True, text=True, timeout=60, check=True).stdout)
    vip = next(v for v in st["vips"] if ":" not in v["ip"])
    owner = vip["leader"]
    watcher = next(n for n in ("n1", "n2", "n3") if n != owner)
    fault = next(ln for ln in lines if re.match(r"\$L fault -n l2 freeze \w+$", ln))
    watch = subprocess.Popen([*L, "exec", "-n", a.lab, watcher, "--", nocloudlb, "status", "--watch",
                              "--interval", "0.25", "--count", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    # kill only once the watch has drawn its first table: on a slow machine its start can take
    # longer than the whole failover, and a watch that starts late sees nothing move
    lines_out: list[str] = []
    drawn = threading.Event()

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            lines_out.append(line)
            if line.startswith("VIP "):
                drawn.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not drawn.wait(90):
        print("".join(lines_out)[-3000:])
        print(f"quickstart: `nocloudlb status --watch` on {watcher} drew nothing in 90 s")
        watch.kill()
        return 1
    time.sleep(1)
    argv = shlex.split(fault.replace("$L ", "").replace("-n l2", f"-n {a.lab}"))
    argv[argv.index("freeze") + 1] = owner
    subprocess.run([*L, *argv], check=True, capture_output=True, text=True, timeout=60)
    watch.wait(timeout=180)
    reader.join(10)
    out = "".join(lines_out)
    err = watch.stderr.read() if watch.stderr is not None else ""
    change = re.search(rf"^\d\d:\d\d:\d\d\.\d{{3}}  {re.escape(vip['ip'])} \(\S+\): owner {owner} -> (\w+)$", out, re.M)
    if watch.returncode != 0 or not change:
        print(out[-3000:] + err[-2000:])
        print(f"quickstart: the watch on {watcher} did not show {vip['ip']} leaving {owner}")
        return 1
    print(f"  watch on {watcher}: {change.group(0)}")
    subprocess.run([*L, "fault", "-n", a.lab, "undo", "--all"], capture_output=True, timeout=60, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
