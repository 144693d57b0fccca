"""docs/own-hosts.md executed as written, on hosts the collection did not build, reached the way users reach theirs.

The environment (what a user has before the page's first command):

- lab ``oh``: nodes node1 and node2 on Debian 13 (Python 3.13), node3 on Debian 12 (Python 3.11),
  each with sshd, a user ``operator`` with passwordless sudo, an HTTP server of its own on port 80
  (the service the page gives a VIP), and a client c1 on the same segment;
- a controller user without root (USER, made here and removed at the end) on the machine's
  Debian Python 3.11, in an empty directory holding only ``collections-download/`` (what
  ``ansible-galaxy collection download nocloud.loadbalancer`` writes: this tree's tarball and
  the collections it declares, with a requirements.yml);
- the user's ``~/.ssh/config``: the lab's key and pinned host keys, and a jump to the hosts'
  segment (the nodes live in network namespaces: a ProxyCommand through socat into the lab's
  controller namespace, as a bastion would be).

Then every ``console`` block of the page runs in order: on the controller as USER (bash -e), or
on c1 when the block's first line is ``# on a client``. The first deploy installs the previous
release (the commit release/previous.json names, from ``git archive``); before the page's upgrade
block the test puts this tree's collection into collections-download/, as a new download would.
After the blocks, this test looks for itself: each node's venv runs its own Python (the
wheelhouse per node platform); one MAC answers ARP for the VIP and HTTP reaches that node (IPv6
too); the node commands of README.md, docs/troubleshooting.md and docs/monitoring.md run as
written on a node that does not own the VIP (over ssh with sudo; --watch and tcpdump stopped
after 3 s); the upgrade, remove_node and site.yml --limit lose no HTTP request sent every 50 ms
from c1, and change each node's daemon / the members seen; the uninstall leaves nothing (unit,
files, tables, addresses on lo). Each step prints its time.

Run as root: .venv/bin/python tests/install/own_hosts.py  (KEEP=1 keeps the lab and the directory)
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

TOP = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TOP / "roles" / "lab" / "files"))
import labctl  # noqa: E402  (the lab's own module, from this tree)
from doc_commands import Command, blocks, commands  # noqa: E402

NAME = os.environ.get("OWN_HOSTS_LAB", "oh")
USER = os.environ.get("OWN_HOSTS_USER", "nlbadmin")
# the release an upgrade starts from: {"commit": ...}; OWN_HOSTS_PREVIOUS=<commit> overrides it
PREVIOUS_FILE = TOP / "release" / "previous.json"
PAGE = TOP / "docs" / "own-hosts.md"
VIP = "198.51.100.200"
VIP6 = "2001:db8:1::200"
NODES = {"node1": ("trixie", "198.51.100.11"), "node2": ("trixie", "198.51.100.12"),
         "node3": (None, "198.51.100.13")}
# the other pages whose commands run on a node (a node that does not own VIP, so that probe asks the wire)
NODE_PAGES = ("README.md", "docs/troubleshooting.md", "docs/monitoring.md")
NODE_COMMAND = re.compile(r"^(?:nocloudlb|tcpdump|systemctl|journalctl) ")
ENDLESS = ("--watch", "tcpdump ")  # run for 3 s, then stopped (exit 124 is theirs)
TOPOLOGY = {
    "name": NAME,
    "segments": {"lan": {}},
    "hosts": {
        **{n: {"groups": ["nodes"], "ssh": True, **({"release": rel} if rel else {}),
               "interfaces": [{"segment": "lan",
                               "addresses": [f"{addr}/24", f"2001:db8:1::{addr.rsplit('.', 1)[1]}/64"]}]}
           for n, (rel, addr) in NODES.items()},
        "c1": {"groups": ["clients"],
               "interfaces": [{"segment": "lan", "addresses": ["198.51.100.50/24", "2001:db8:1::50/64"]}]},
    },
}
T0 = time.monotonic()


def step(msg: str) -> None:
    print(f"\n=== [{time.monotonic() - T0:5.0f}s] {msg}", flush=True)


def fail(msg: str) -> None:
    raise SystemExit(f"own-hosts-test: FAILED: {msg}")


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, text=True, capture_output=True, check=False, **kw)  # type: ignore[call-overload]


def page_blocks(page: Path) -> list[tuple[str, str]]:
    """The page's console blocks in order, each (where, text): where is "client" or "controller"."""
    return [("client" if text.startswith("# on a client") else "controller", text)
            for _line, text in blocks(str(page.relative_to(TOP)))]


class Env:
    """The user, the lab, the ssh jump and the directory; ``close`` undoes all of it."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.home = work / "home"
        self.dir = self.home / "lb"
        self.lab = labctl.Lab(NAME)
        self.jumps: list[subprocess.Popen] = []
        self.before: dict[str, str] = {}  # each node's daemon digest before the upgrade
        self.upgrade_started = 0.0  # epoch seconds: the upgrade block's restarts come after

    # -- the user
    def make_user(self) -> None:
        if run(["id", USER]).returncode == 0:
            self.drop_user()  # left by a run that was killed
        r = run(["useradd", "--create-home", "--home-dir", str(self.home), "--shell", "/bin/bash", USER])
        if r.returncode:
            fail(f"useradd {USER}: {r.stderr}")
        self.dir.mkdir()
        shutil.chown(self.dir, USER, USER)

    def user_pids(self) -> list[int]:
        try:
            uid = pwd.getpwnam(USER).pw_uid
        except KeyError:
            return []
        pids = []
        for p in Path("/proc").iterdir():
            try:
                if p.name.isdigit() and p.stat().st_uid == uid:
                    pids.append(int(p.name))
            except OSError:
                pass
        return pids

    def drop_user(self) -> None:
        for pid in self.user_pids():  # ssh masters (ControlPersist) the user's runs left
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(0.3)
        run(["userdel", USER])

    def user_env(self) -> list[str]:
        keep = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
        env = {"HOME": str(self.home), "USER": USER, "LOGNAME": USER, "LANG": "C.UTF-8",
               "PATH": "/usr/local/bin:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", **keep}
        return [f"{k}={v}" for k, v in env.items()]

    def as_user(self, script: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return run(["runuser", "-u", USER, "--", "env", "-i", *self.user_env(), "bash", "-euo", "pipefail", "-c",
                    script], cwd=self.dir, timeout=timeout)

    # -- the hosts
    def up(self) -> None:
        self.lab.down()
        res = self.lab.up(TOPOLOGY, timeout=180, log=lambda m: print("  " + m, flush=True))
        if set(res["system_state"].values()) != {"running"}:
            fail(f"lab hosts not running: {res['system_state']}")
        for n in NODES:
            ver = self.lab.exec(n, ["sh", "-c", ". /etc/os-release; echo $PRETTY_NAME; python3 -V"]).stdout
            print(f"  {n}: {' / '.join(ver.split(chr(10))[:2])}")
        for n in NODES:  # the HTTP server the page's service stands for: the node's own
            self.lab.exec(n, ["sh", "-c", f"mkdir -p /srv/www && echo {n} > /srv/www/index.html && "
                              "systemd-run --unit shop-www -p DynamicUser=yes "
                              "-p AmbientCapabilities=CAP_NET_BIND_SERVICE "
                              "python3 -m http.server 80 --bind :: --directory /srv/www >/dev/null"])

    def ssh_config(self) -> None:
        """The user's ssh setup: the lab's key and host keys, a jump into the hosts' segment."""
        jump = self.work / "jump"
        jump.mkdir(mode=0o755)
        for _rel, addr in NODES.values():
            sock = jump / f"{addr}.sock"
            self.jumps.append(subprocess.Popen(
                ["ip", "netns", "exec", self.lab.controller_ns, "socat",
                 f"UNIX-LISTEN:{sock},fork,mode=0666", f"TCP:{addr}:22"], stdout=subprocess.DEVNULL))
        ssh = self.home / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        shutil.copy(self.lab.ssh_key, ssh / "id_ed25519")
        shutil.copy(self.lab.known_hosts, ssh / "known_hosts")
        (ssh / "config").write_text(
            "# the lab's hosts sit behind a jump (socat into the lab's controller namespace)\n"
            "Host 198.51.100.*\n"
            f"    ProxyCommand socat - UNIX-CONNECT:{jump}/%h.sock\n"
            "    IdentityFile ~/.ssh/id_ed25519\n"
            "    StrictHostKeyChecking yes\n")
        for p in (ssh, *ssh.iterdir()):
            shutil.chown(p, USER, USER)
            p.chmod(0o700 if p.is_dir() else 0o600)
        for _attempt in range(50):
            if all((jump / f"{a}.sock").exists() for _r, a in NODES.values()):
                return
            time.sleep(0.1)
        fail("the ssh jump sockets did not appear")

    def collections(self, tree: Path, label: str) -> None:
        """collections-download/ as ``ansible-galaxy collection download`` leaves it, the collection built from
        ``tree`` (what was there before is replaced: a new download)."""
        dl = self.dir / "collections-download"
        shutil.rmtree(dl, ignore_errors=True)
        dl.mkdir()
        galaxy = str(TOP / ".venv" / "bin" / "ansible-galaxy")
        r = run([galaxy, "collection", "build", "--output-path", str(dl), str(tree)])
        if r.returncode:
            fail(f"ansible-galaxy collection build {tree}: {r.stderr}")
        bundled = next((TOP / ".venv" / "lib").glob("python3*/site-packages/ansible_collections"), None)
        if bundled is None:
            fail("no ansible package in .venv (make venv) to take the dependencies from")
        r = run([str(TOP / ".venv" / "bin" / "python"), str(TOP / "tests" / "install" / "pack_bundled.py"),
                 "--galaxy", str(TOP / "galaxy.yml"), "--from", str(bundled), "--out", str(dl),
                 "--ansible-galaxy", galaxy])
        if r.returncode:
            fail(f"pack_bundled.py: {r.stdout}{r.stderr}")
        lines = ["collections:"]
        for tar in sorted(dl.glob("*.tar.gz")):
            version = tar.name[:-len(".tar.gz")].rsplit("-", 1)[1]
            lines += [f"- name: {tar.name}", f"  version: {version}"]
        (dl / "requirements.yml").write_text("\n".join(lines) + "\n")
        for p in (dl, *dl.iterdir()):
            shutil.chown(p, USER, USER)
        print(f"  collections-download/ holds {label}: " + " ".join(sorted(p.name for p in dl.glob("*.tar.gz"))))

    def previous_tree(self) -> tuple[str, Path]:
        """The previous release's tree (its commit from PREVIOUS_FILE), extracted with git archive."""
        commit = os.environ.get("OWN_HOSTS_PREVIOUS") or json.loads(PREVIOUS_FILE.read_text())["commit"]
        tree = self.work / "previous"
        tree.mkdir()
        arch = subprocess.run(["git", "-C", str(TOP), "archive", "--format=tar", commit], capture_output=True,
                              check=False)
        if arch.returncode:
            fail(f"git archive {commit} (the previous release, {PREVIOUS_FILE.relative_to(TOP)}): "
                 f"{arch.stderr.decode(errors='replace').strip()} (a full clone of the repository is needed)")
        subprocess.run(["tar", "-x", "-C", str(tree)], input=arch.stdout, check=True)
        return commit, tree

    def close(self) -> None:
        for p in self.jumps:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        self.drop_user()
        self.lab.down()


# -- the test's own checks, between the page's blocks
def check_deployed(env: Env) -> None:
    for n, (rel, _addr) in NODES.items():
        py = env.lab.exec(n, ["/opt/nocloudlb/venv/bin/python", "-c",
                              "import sys, nocloudlb; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
        sys_py = env.lab.exec(n, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
        want = "3.13" if rel == "trixie" else "3.11"
        if py != want or sys_py != want:
            fail(f"{n}: the speaker's venv runs Python {py!r}, the node's is {sys_py!r}, expected {want}")
        state = env.lab.exec(n, ["systemctl", "is-active", "nocloudlb-speaker.service"]).stdout.strip()
        if state != "active":
            fail(f"{n}: nocloudlb-speaker.service is {state}")
        print(f"  {n}: nocloudlb installed for its own Python {py}, speaker active")


def node_macs(env: Env) -> dict[str, str]:
    """Each node's eth0 MAC -> its name."""
    return {env.lab.exec(n, ["cat", "/sys/class/net/eth0/address"]).stdout.strip(): n for n in NODES}


def check_answered(env: Env) -> None:
    macs = node_macs(env)
    deadline = time.monotonic() + 30
    while True:
        out = env.lab.exec("c1", ["arping", "-c", "3", "-w", "3", "-I", "eth0", VIP], check=False).stdout
        seen = set(re.findall(r"from ([0-9a-f:]{17})", out))
        http = env.lab.exec("c1", ["curl", "-sf", "-m", "2", f"http://{VIP}/"], check=False).stdout.strip()
        owners = {macs.get(m, m) for m in seen}
        if len(owners) == 1 and http in owners:
            break
        if time.monotonic() > deadline:
            fail(f"{VIP}: ARP answered by {sorted(owners)}, HTTP answered {http!r}: one owner serving expected")
        time.sleep(1)
    print(f"  {VIP}: ARP answered by one MAC ({next(iter(seen))}, {http}), HTTP served by {http}")


def check_removed(env: Env) -> None:
    probe = ("systemctl cat nocloudlb-speaker.service >/dev/null 2>&1 && echo unit; "
             "for p in /opt/nocloudlb /etc/nocloudlb /var/lib/nocloudlb /usr/local/bin/nocloudlb "
             "/etc/sysctl.d/90-nocloudlb.conf; do [ -e $p ] && echo $p; done; "
             "nft list tables | grep nocloudlb; ip -o addr show dev lo | grep -F ' 198.51.100.'; "
             "getent passwd nocloudlb; true")
    for n in NODES:
        left = env.lab.exec(n, ["sh", "-c", probe]).stdout.split()
        if left:
            fail(f"{n}: the roll back left {left}")
        print(f"  {n}: nothing of nocloudlb left (unit, files, tables, addresses on lo, user)")
    out = env.lab.exec("c1", ["curl", "-s", "-o", "/dev/null", "-m", "2", "-w", "%{http_code}", f"http://{VIP}/"],
                       check=False).stdout
    if out not in ("000", ""):
        fail(f"{VIP} still answers HTTP ({out}) after the roll back")


# HTTP to the VIP every 50 ms from c1 until the stop file exists; then one JSON line.
LOAD_CODE = r"""
import json, os, sys, time, urllib.request
url, stop = sys.argv[1], sys.argv[2]
ok, failed, errors = 0, 0, []
while not os.path.exists(stop):
    t = time.monotonic()
    try:
        urllib.request.urlopen(url, timeout=1).read()
        ok += 1
    except Exception as exc:
        failed += 1
        errors.append("%.2f %s" % (time.time(), type(exc).__name__))
    time.sleep(max(0.0, 0.05 - (time.monotonic() - t)))
print(json.dumps({"ok": ok, "failed": failed, "errors": errors[:10]}))
"""
STOP = "/tmp/own-hosts-load.stop"


class Load:
    """Requests from c1 while a block runs; ``stop`` returns (ok, failed) and prints them."""

    def __init__(self, env: Env) -> None:
        env.lab.exec("c1", ["rm", "-f", STOP])
        self.env = env
        self.proc = env.lab.popen_exec("c1", ["python3", "-c", LOAD_CODE, f"http://{VIP}/", STOP])
        self.errors: list[float] = []  # epoch seconds of the failed requests (stop)

    def stop(self) -> tuple[int, int]:
        self.env.lab.exec("c1", ["touch", STOP])
        out, _err = self.proc.communicate(timeout=30)
        res = json.loads(out.strip().splitlines()[-1])
        print(f"  HTTP from c1 during the block: {res['ok']} answered, {res['failed']} failed {res['errors']}")
        self.errors = [float(e.split()[0]) for e in res["errors"]]
        return res["ok"], res["failed"]

    def show_journals(self) -> None:
        """Every node's speaker journal from 3 s before the first failed request to 2 s after the last, so a
        failure names the move it met (the block's playbook output has no times; the lab goes at the end)."""
        if not self.errors:
            return
        since, until = min(self.errors) - 3, max(self.errors) + 2
        for node in NODES:
            r = self.env.lab.exec(node, ["journalctl", "-u", "nocloudlb-speaker.service", "-o", "short-precise",
                                         "--since", f"@{since:.2f}", "--until", f"@{until:.2f}", "--no-pager"],
                                  check=False)
            lines = (r.stdout + r.stderr).strip().splitlines()[-40:]
            print(f"  {node}'s speaker journal around the failed requests ({len(lines)} lines):")
            print("\n".join("  | " + ln[:300] for ln in lines))


def check_cluster(env: Env, members: int) -> None:
    out = env.lab.exec("node2", ["nocloudlb", "status", "--json"]).stdout
    st = json.loads(out)
    alive = sorted(m["name"] for m in st.get("members", []) if m.get("state") == "alive")
    if len(alive) != members:
        fail(f"node2 sees members {alive}, expected {members} alive")
    print(f"  node2 sees {members} members alive: {', '.join(alive)}")


def after_remove(env: Env) -> None:
    check_answered(env)
    if env.lab.exec("node1", ["systemctl", "is-active", "nocloudlb-speaker.service"], check=False).stdout.strip() \
            == "active":
        fail("node1's speaker still runs after remove_node")
    check_cluster(env, 2)


def after_add(env: Env) -> None:
    check_deployed(env)
    check_cluster(env, 3)
    check_answered(env)


def digests(env: Env) -> dict[str, str]:
    return {n: env.lab.exec(n, ["cat", "/opt/nocloudlb/venv/nocloudlb-digest"]).stdout.strip() for n in NODES}


def before_upgrade(env: Env) -> None:
    env.before = digests(env)
    env.upgrade_started = time.time()
    env.collections(TOP, "this tree (the new release)")


def after_upgrade(env: Env) -> None:
    after = digests(env)
    same = [n for n in NODES if after[n] == env.before[n]]
    if same:
        fail(f"the upgrade left {same} on the daemon they ran before ({env.before})")
    print(f"  every node's daemon upgraded: {env.before['node1']} -> {after['node1']}")
    check_handoffs(env)
    check_cluster(env, 3)
    check_answered(env)


def check_handoffs(env: Env) -> None:
    """Each restart of the upgrade went through the unit's ExecStop (nocloudlb stop-handoff, run by this code
    against the 0.2.0 speaker it stops): the nodes that announced VIPs handed them over, and the new speaker
    removed that drain once it knew who held them (stopDrainCleared)."""
    said: dict[str, list[str]] = {}
    for node in NODES:
        r = env.lab.exec(node, ["journalctl", "-u", "nocloudlb-speaker.service", "-o", "cat", "--no-pager",
                                "--since", f"@{env.upgrade_started - 1:.0f}"], check=False)
        said[node] = [ln.strip()[:200] for ln in r.stdout.splitlines()
                      if "nocloudlb stop-handoff:" in ln or "stopDrainCleared" in ln]
        print(f"  {node}: " + (" | ".join(said[node]) or "no stop-handoff line"))
    missing = [n for n in NODES if not any("nocloudlb stop-handoff:" in ln for ln in said[n])]
    handed = [n for n in NODES if any("stop-handoff: handed over" in ln for ln in said[n])]
    uncleared = [n for n in handed if not any("stopDrainCleared" in ln for ln in said[n])]
    if missing or not handed or uncleared:
        fail(f"the upgrade's restarts did not hand over through the unit's ExecStop: no stop-handoff line on "
             f"{missing}, handed over on {handed}, drain not removed after the start on {uncleared}")


class Hook(NamedTuple):
    needle: str  # text in the block
    lossless: bool  # HTTP from c1 during the block, none may fail
    after: Callable[[Env], None]
    before: Callable[[Env], None] | None = None


def node_commands() -> list[Command]:
    """Each command of NODE_PAGES' console blocks that runs on a node."""
    return [c for page in NODE_PAGES for c in commands(page) if c.reason is None and NODE_COMMAND.match(c.text)]


def run_node_commands(env: Env) -> None:
    """The other pages' node commands, as the controller user over ssh with sudo, on a node that does not own
    the VIP."""
    macs = node_macs(env)
    neigh = env.lab.exec("c1", ["ip", "neigh", "show", VIP], check=False).stdout.split()
    owner = macs.get(neigh[neigh.index("lladdr") + 1]) if "lladdr" in neigh else None
    node = next(n for n in NODES if n != owner)
    addr = NODES[node][1]
    cmds = node_commands()
    if len(cmds) < 10:
        fail(f"only {len(cmds)} node commands found in {NODE_PAGES}")
    for c in cmds:
        page, cmd = c.page, c.text
        endless = any(e in cmd for e in ENDLESS)
        remote = "sudo bash -o pipefail -c " + shlex.quote(("timeout 3 " if endless else "") + cmd)
        t = time.monotonic()
        r = env.as_user(f"ssh operator@{addr} {shlex.quote(remote)}", timeout=60)
        if r.returncode and not (endless and r.returncode == 124):
            fail(f"{page}: `{cmd}` on {node} exited {r.returncode}:\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
        first = (r.stdout.strip().splitlines() or ["(no output)"])[0][:90]
        print(f"  {page}: {cmd.split('#')[0].strip()[:60]:60} {time.monotonic() - t:4.1f} s  {first}")
    print(f"  {len(cmds)} commands of {', '.join(NODE_PAGES)} ran on {node} (not the owner {owner})")


def after_check(env: Env) -> None:
    check_answered(env)
    six = env.lab.exec("c1", ["curl", "-sf", "-m", "2", f"http://[{VIP6}]/"], check=False).stdout.strip()
    if six not in NODES:
        fail(f"{VIP6}: HTTP answered {six!r}, expected a node's name")
    print(f"  {VIP6}: HTTP served by {six}")
    run_node_commands(env)


HOOKS = [Hook("nocloud.loadbalancer.site -e nocloudlb_hosts=lb\n", False, check_deployed),
         Hook("ip neigh show", False, after_check),
         Hook("install --offline --force", True, after_upgrade, before_upgrade),
         Hook("nocloud.loadbalancer.remove_node", True, after_remove),
         Hook("--limit node1", True, after_add),
         Hook("nocloud.loadbalancer.uninstall -e nocloudlb_hosts=lb\n", False, check_removed)]


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="nocloudlb-own-hosts."))
    work.chmod(0o755)
    env = Env(work)
    ok = False
    try:
        step(f"lab {NAME}: node1, node2 on Debian 13, node3 on Debian 12, over SSH as operator with sudo; client c1")
        env.up()
        step(f"the controller user {USER} (no root, the machine's Python 3.11), its ssh setup, "
             "collections-download/")
        env.make_user()
        env.ssh_config()
        commit, tree = env.previous_tree()
        env.collections(tree, f"the previous release ({commit})")
        print(f"  {env.as_user('python3 -V; id -un').stdout.strip()}".replace("\n", ", "))
        blocks = page_blocks(PAGE)
        if len(blocks) < 5:
            fail(f"{PAGE} has {len(blocks)} console blocks; expected the page's steps")
        for i, (where, text) in enumerate(blocks, 1):
            first = next(ln for ln in text.splitlines() if ln and not ln.startswith("#"))
            step(f"docs/own-hosts.md block {i}/{len(blocks)} on {'c1' if where == 'client' else 'the controller'}: "
                 f"{first}{' ...' if text.count(chr(10)) > 1 else ''}")
            t = time.monotonic()
            hooks = [h for h in HOOKS if h.needle in text]
            for h in hooks:
                if h.before is not None:
                    h.before(env)
            load = Load(env) if any(h.lossless for h in hooks) else None
            if where == "client":
                r = env.lab.exec("c1", ["bash", "-euo", "pipefail", "-c", text], check=False)
            else:
                r = env.as_user(text)
            out = (r.stdout + r.stderr).rstrip()
            tail = out.splitlines()[-25:]
            print("\n".join("  | " + ln for ln in tail))
            if r.returncode:
                fail(f"block {i} exited {r.returncode}:\n{text}")
            print(f"  ({time.monotonic() - t:.1f} s)")
            if load is not None:
                ok_n, failed_n = load.stop()
                if failed_n or not ok_n:
                    load.show_journals()
                    fail(f"block {i}: {failed_n} HTTP requests to {VIP} failed ({ok_n} answered)")
            for h in hooks:
                h.after(env)
        step(f"done: docs/own-hosts.md executed, deployed, answered and rolled back in {time.monotonic() - T0:.0f} s")
        ok = True
    finally:
        if os.environ.get("KEEP") == "1":
            print(f"KEEP=1: {work} and lab {NAME} left (user {USER})")
        else:
            env.close()
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
