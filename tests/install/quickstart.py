"""Run docs/quickstart.md's commands on a lab deployed from the installed collection.

    python quickstart.py --lab fh --labctl PATH/labctl.py --doc docs/quickstart.md \
        [--top CHECKOUT] [--readme README.md --infra INFRA_REPO]

Takes the quickstart's console blocks, keeps the lines that run a command in a lab host
(`$L exec -n l2 HOST -- ...`), points them at this lab, and runs each (interactive
shells and --watch, which never ends, are left out); `nocloudlb` is run as written, from
the node's PATH, and `nocloudlb --version` must name the collection's version.
Then the documented drains, by FQCN, each followed by its undrain, checked on the node
(the drain label set, no VIP elected to it; then cleared): with --readme and --infra,
the README's `ansible-playbook nocloud.loadbalancer.drain ...` lines in the infra
repository (the installed collection); with --top, the quickstart's planned move, run
in the checkout as the quickstart says. Then watches a VIP move as the quickstart tells:
`nocloudlb status --watch` on a backup node while the owner is frozen with
`$L fault ... freeze OWNER`; the watch must print the change of owner with its time.
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

from doc_commands import TOP, Command, commands

DRAIN_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
#: the quickstart's fault line: ``$L fault -n l2 freeze OWNER``
FREEZE = re.compile(r"\$L fault -n l2 freeze \w+$")


def selected(cmds: list[Command]) -> list[Command]:
    """The commands of docs/quickstart.md (or the README's drains) this script runs: ``L=`` (the labctl
    it is given stands for ``$L``), each ``$L exec`` line that runs a command (the ``--watch`` one in
    the watch below), the ``$L fault ... freeze`` line, and the drains by FQCN."""
    out = []
    for c in cmds:
        if c.reason is not None:
            continue
        if (c.cmd.startswith("L=") or re.match(r"\$L exec -n l2 \w+ -- \S", c.cmd)
                or FREEZE.match(c.cmd)
                or re.search(r"ansible-playbook .*nocloud\.loadbalancer\.drain ", c.cmd)):
            out.append(c)
    return out


def status(labctl: list[str], lab: str, host: str) -> dict:
    proc = subprocess.run([*labctl, "exec", "-n", lab, host, "--", "nocloudlb", "status", "-o", "json", "--all"],
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(proc.stdout)


def drained_view(labctl: list[str], lab: str, node: str) -> tuple[bool, list[str]]:
    """Whether node carries the drain label (its own status), and the VIPs elected to it (another node's view)."""
    mine = status(labctl, lab, node)
    other = next(n for n in ("n1", "n2", "n3") if n != node)
    theirs = status(labctl, lab, other)
    leads = sorted({v["ip"] for v in theirs["vips"] if v.get("leader") == node})
    return DRAIN_LABEL in (mine.get("labels") or {}), leads


def drain_cycle(labctl: list[str], lab: str, drain: str, undrain: str, cwd: str, what: str) -> bool:
    """Run a documented drain and its undrain (shell lines, in cwd) and check the result on the node."""
    m = re.search(r"-e target=(\w+)", drain)
    if not m:
        print(f"quickstart: {what}: no -e target=NODE in {drain!r}")
        return False
    node = m.group(1)
    for line, want_drained in ((drain, True), (undrain, False)):
        t0 = time.monotonic()
        proc = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
        took = time.monotonic() - t0
        if proc.returncode != 0:
            print(proc.stdout[-4000:] + proc.stderr[-2000:])
            print(f"quickstart: {what}: `{line}` (in {cwd}) exited {proc.returncode}")
            return False
        deadline = time.monotonic() + 15
        while True:
            labelled, leads = drained_view(labctl, lab, node)
            ok = labelled and not leads if want_drained else not labelled
            if ok or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        state = "drained" if want_drained else "undrained"
        print(f"  {what}: {line.split('ansible-playbook', 1)[1].strip()[:110]}")
        print(f"    -> exit 0 in {took:.1f} s; on {node}: drain label {'set' if labelled else 'absent'}, "
              f"VIPs elected to it: {', '.join(leads) or 'none'}")
        if not ok:
            print(f"quickstart: {what}: {node} is not {state} after `{line}`")
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lab", required=True)
    ap.add_argument("--labctl", required=True)
    ap.add_argument("--doc", required=True)
    ap.add_argument("--top", help="the checkout: run the quickstart's drain and undrain there")
    ap.add_argument("--readme", help="README.md: run its drain and undrain lines in --infra")
    ap.add_argument("--infra", help="the infra repository the collection is installed in")
    a = ap.parse_args()
    L = [sys.executable, a.labctl]
    lines = [c.cmd for c in selected(commands(str(Path(a.doc).resolve().relative_to(TOP))))]
    ran = 0
    for line in lines:
        m = re.match(r"\$L exec -n l2 (\w+) -- (.+)$", line)
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
        if cmd[-1:] == ["--version"] and not re.search(r"^collection: nocloud\.loadbalancer \d", proc.stdout, re.M):
            print(proc.stdout + proc.stderr)
            print("quickstart: `nocloudlb --version` does not name the collection's version")
            return 1
        ran += 1
    if ran < 5:
        print(f"quickstart: only {ran} commands found in {a.doc}; expected the status, --cluster, --version, curl "
              "and neigh lines")
        return 1
    # the documented drains, by FQCN: the README's from the infra repository, the quickstart's from the checkout
    cycles = []
    if a.readme and a.infra:
        found = [c.cmd for c in selected(commands(str(Path(a.readme).resolve().relative_to(TOP))))]
        cycles.append(("README (infra repository)", found, a.infra))
    if a.top:
        found = [ln.replace("/nocloudlb-lab/l2/", f"/nocloudlb-lab/{a.lab}/") for ln in lines
                 if re.search(r"ansible-playbook .*nocloud\.loadbalancer\.drain ", ln)]
        cycles.append(("quickstart (checkout)", found, a.top))
    for what, found, cwd in cycles:
        drains = [ln for ln in found if "state=undrained" not in ln]
        undrains = [ln for ln in found if "state=undrained" in ln]
        if len(drains) != 1 or len(undrains) != 1:
            print(f"quickstart: {what}: expected one drain and one undrain line by FQCN, found {found}")
            return 1
        if not drain_cycle(L, a.lab, drains[0], undrains[0], cwd, what):
            return 1
    # watch a VIP move, as section 3 says (nocloudlb from the node's PATH)
    nocloudlb = "nocloudlb"
    st = json.loads(subprocess.run([*L, "exec", "-n", a.lab, "n1", "--", nocloudlb, "status", "-o", "json"],
                                   capture_output=True, text=True, timeout=60, check=True).stdout)
    vip = next(v for v in st["vips"] if ":" not in v["ip"])
    owner = vip["leader"]
    watcher = next(n for n in ("n1", "n2", "n3") if n != owner)
    fault = next(ln for ln in lines if FREEZE.match(ln))
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
