"""Run the ``ansible-playbook`` lines of README.md, docs/howto.md and docs/operations.md as written, in
the infra repository the collection is installed in (its ansible.cfg, ``inventory/`` and group
``speakers``; lab hosts n1-n3).

    python doc_playbooks.py --infra INFRA {deploy,day2}

``deploy``: the README's own site line (the repository's playbooks/site.yml). ``day2``: every other
line once (the same command on several pages runs once), except those the page says no test runs
and the README's drains, which quickstart.py runs with their check on the node. After each: exit 0, its
PLAY RECAP, its time, and a check of what it must have done (a check-mode run changed nothing on
the nodes: the speakers still run; a rotation left one key id on every node). ``-e @vault.yml``
gets a vault.yml written first with a new key, as the page's comment says.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

from doc_commands import Command, commands

PAGES = ("README.md", "docs/howto.md", "docs/operations.md")
NODES = ("n1", "n2", "n3")


def runnable(c: Command) -> bool:
    return c.page in PAGES and c.reason is None and c.cmd.startswith("ansible-playbook ")


def selected(phase: str) -> list[Command]:
    """The commands this script runs in ``phase``, each text once, in page order."""
    seen: set[str] = set()
    out = []
    for page in PAGES:
        for c in commands(page):
            if not runnable(c) or c.cmd in seen:
                continue
            deploy = c.page == "README.md" and c.cmd == "ansible-playbook playbooks/site.yml"
            # quickstart.py runs the README's drains (its infra repository cycle) and checks them on the node
            readme_drain = c.page == "README.md" and re.search(r"nocloud\.loadbalancer\.drain\b", c.cmd)
            if (phase == "deploy") == deploy and not readme_drain:
                seen.add(c.cmd)
                out.append(c)
    return out


def on_nodes(infra: Path, cmd: str) -> dict[str, str]:
    """``cmd`` on every lab node in one ad-hoc ``ansible`` run (the infra repository's inventory and
    connection): node -> its stdout, read from the JSON callback."""
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    r = subprocess.run(["ansible", ":".join(NODES), "-m", "ansible.builtin.command", "-a", cmd], cwd=infra,
                       capture_output=True, text=True, timeout=120, check=False, env=env)
    try:  # the JSON document; a timing callback enabled by ansible.cfg may print after it
        doc = json.JSONDecoder().raw_decode(r.stdout[r.stdout.index("{"):])[0]
        hosts = doc["plays"][0]["tasks"][0]["hosts"]
        out = {h: hosts[h]["stdout"].strip() for h in NODES if hosts[h].get("rc") == 0}
    except (ValueError, KeyError, IndexError):
        out = {}
    if r.returncode or len(out) != len(NODES):
        raise SystemExit(f"doc_playbooks: `{cmd}` on {', '.join(NODES)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return out


def check(infra: Path, c: Command) -> str:
    """What the command must have done, checked on the nodes; a line saying what was seen."""
    if "--check" in c.cmd.split():
        states = on_nodes(infra, "systemctl is-active nocloudlb-speaker")
        if set(states.values()) != {"active"}:
            raise SystemExit(f"doc_playbooks: after `{c.cmd}` (check mode) the speakers are {states}")
        return "check mode: every speaker still active"
    if "nocloud.loadbalancer.rotate_key" in c.cmd:
        ids = {h: json.loads(text).get("keyIds") for h, text in on_nodes(infra, "nocloudlb keys").items()}
        if len(set(map(tuple, ids.values()))) != 1 or len(ids["n1"]) != 1:
            raise SystemExit(f"doc_playbooks: after `{c.cmd}` the nodes' key ids are {ids}: expected one, alike")
        return f"one key id on every node: {ids['n1'][0]}"
    return "exit 0"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--infra", required=True, type=Path)
    ap.add_argument("phase", choices=("deploy", "day2"))
    a = ap.parse_args()
    todo = selected(a.phase)
    if not todo:
        print(f"doc_playbooks: no {a.phase} command found in {', '.join(PAGES)}")
        return 1
    for c in todo:
        if "-e @vault.yml" in c.cmd and not (a.infra / "vault.yml").exists():
            key = base64.b64encode(secrets.token_bytes(32)).decode()
            (a.infra / "vault.yml").write_text(f"nocloudlb_gossip_key: {key}\n")
        t = time.monotonic()
        r = subprocess.run(["bash", "-c", c.cmd], cwd=a.infra, capture_output=True, text=True, timeout=900,
                           check=False)
        took = time.monotonic() - t
        if r.returncode:
            print(r.stdout[-6000:] + r.stderr[-3000:])
            print(f"doc_playbooks: {c.page}:{c.line} `{c.cmd}` exited {r.returncode}")
            return 1
        recap = [ln.split(":", 1)[1].split() for ln in r.stdout.splitlines()[-12:] if re.match(r"^\w+\s+: ok=", ln)]
        changed = sum(int(f.split("=")[1]) for fields in recap for f in fields if f.startswith("changed="))
        print(f"  {c.page}:{c.line}: {c.cmd[len('ansible-playbook '):][:80]}")
        print(f"    -> exit 0 in {took:.1f} s, {len(recap)} hosts, changed={changed}; {check(a.infra, c)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
