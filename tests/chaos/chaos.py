# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Chaos on the namespace lab: who answers for every VIP while faults hit the speakers.

Brings up the lab ``chaos`` (tests/chaos/topology.yml: n1-n3 run the speaker, c1 is the client),
deploys it with tests/chaos/converge.yml (HTTP servers, then site.yml) and the cluster of
tests/chaos/inventory, then runs fault phases one after the other through labctl's fault API.
Throughout, the client asks every VIP over ARP/NDP every 0.1 s (tests/chaos/prober.py: only
replies addressed to it count) and fetches every service over HTTP; the segment is captured.

For each phase and VIP it reports the longest stretch with two or more MACs answering, the
longest stretch with none, the owners seen, and the failed HTTP requests; then checks the goals
(docs/chaos.md): never two owners beyond the detection window, never no owner beyond
detection plus announcement, a drained node stays drained across restart and reboot.

  python tests/chaos/chaos.py --full --docs     # every phase; writes docs/chaos.md and the picture
  python tests/chaos/chaos.py --short           # the bounded run `make test` uses (exit 1 on a broken goal)
  python tests/chaos/chaos.py --phases freeze,partition-2+1 --keep
Results: JSON on stdout; with every probe round in /var/lib/nocloudlb-lab/chaos-results.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "roles" / "lab" / "files"))
import labctl  # noqa: E402

LAB = "chaos"
NODES = ["n1", "n2", "n3"]
CLIENT = "c1"
SPEAKER = "nocloudlb-speaker.service"
NOCLOUDLB = "/opt/nocloudlb/venv/bin/nocloudlb"
DRAIN_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
ROUND = 0.1  # seconds between ARP/NDP probe rounds
ANNOUNCEMENTS = "(arp and arp[14:4] = arp[24:4]) or (icmp6 and ip6[40] == 136 and dst host ff02::1)"

# Goals, in seconds (docs/chaos.md). The detection window is the `lan` profile's worst case:
# a silent member is usually declared dead in 1.5-2.5 s, but Lifeguard stretches the suspicion up
# to suspicionMaxMult (6) times its minimum (1 s with three members) when no other member
# confirms it: 6 s plus a probe interval. After a spell of loss, Lifeguard also slows a node's own
# probing by up to awarenessMax (8) times the 0.5 s probe interval while its local health recovers:
# a phase that starts in that state gets the degraded window, 8 x 0.5 s + 6 s. A new owner announces
# within a round of its decision. The margin is wide: this machine is shared and timing under load
# is worse.
DETECTION = {"calm": 6 * 1.0 + 0.5, "degraded": 8 * 0.5 + 6 * 1.0}
ANNOUNCE = 1.0
MARGIN = 3.0


def limits(window: str = "calm") -> tuple[float, float]:
    """(two owners, no owner): the longest stretch each may last."""
    return DETECTION[window] + MARGIN, DETECTION[window] + ANNOUNCE + MARGIN


LIMIT_TWO, LIMIT_NONE = limits()
RESULTS = labctl.STATE_ROOT / "chaos-results.json"


def order(nodes: list[str], ip: str) -> list[str]:
    """MetalLB's layer-2 order: sha256(node#ip), the first one announces."""
    return sorted(nodes, key=lambda n: hashlib.sha256(f"{n}#{ip}".encode()).digest())


@dataclass
class Phase:
    name: str
    title: str
    run: Callable[[Chaos], None]
    goals: bool = True  # False: measured and shown, but the design promises nothing here (see docs)
    note: str = ""
    window: str = "calm"  # the detection window the goals use: calm | degraded (right after loss)


@dataclass
class Record:
    name: str
    title: str
    start: float
    fault: float = 0.0
    end: float = 0.0
    goals: bool = True
    note: str = ""
    marks: list[tuple[float, str]] = field(default_factory=list)
    drained: str | None = None
    drained_from: float = 0.0
    drained_until: float = 0.0
    error: str = ""
    window: str = "calm"
    lab_error: str = ""  # the lab (not the speakers) failed and was repaired; see restart_host


class Chaos:
    def __init__(self, deploy: bool = True) -> None:
        self.lab = labctl.Lab(LAB)
        self.rounds: list[dict] = []
        self.http: list[dict] = []
        self.lock = threading.Lock()
        self.records: list[Record] = []
        self.current: Record | None = None
        self.drained: set[str] = set()
        self.prober: subprocess.Popen[str] | None = None
        self.stop_file = f"/tmp/chaos-prober-stop-{os.getpid()}"
        self.capture: dict | None = None
        self.up(deploy)
        inv = json.loads(self.lab.inventory_file.read_text())["all"]["hosts"]
        self.macs = {h: inv[h]["lab_interfaces"][0]["mac"].lower() for h in NODES}
        self.host_of = {m: h for h, m in self.macs.items()}
        self.vips = self._vips()

    # -- setup ------------------------------------------------------------------------------
    def up(self, deploy: bool) -> None:
        self.lab.up(HERE / "topology.yml")
        if self._ready():
            return
        if not deploy:
            raise SystemExit("the chaos lab's speakers are not ready and --no-deploy was given")
        coll = Path(f"/tmp/chaos-collections-{os.getpid()}")
        (coll / "ansible_collections" / "nocloud").mkdir(parents=True, exist_ok=True)
        link = coll / "ansible_collections" / "nocloud" / "loadbalancer"
        if not link.exists():
            link.symlink_to(ROOT, target_is_directory=True)
        bindir = Path(sys.executable).parent
        env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(coll), PATH=f"{bindir}:{os.environ.get('PATH', '')}",
                   ANSIBLE_HOME=str(coll / "home"), ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_NOCOLOR="1")
        t0 = time.time()
        proc = subprocess.run([str(bindir / "ansible-playbook"), "-i", str(HERE / "inventory" / "hosts.yml"),
                               str(HERE / "converge.yml")], env=env, cwd=str(ROOT),
                              capture_output=True, text=True, timeout=1200, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"deploying the chaos lab failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
        log(f"deployed the speakers in {time.time() - t0:.0f} s")
        if not self._ready(timeout=60):
            raise SystemExit("the chaos lab's speakers are not ready after deploying")

    def status(self, host: str) -> dict | None:
        try:
            res = self.lab.exec(host, [NOCLOUDLB, "status", "--json"], check=False, timeout=10)
        except labctl.LabError:
            return None
        if res.returncode != 0:
            return None
        try:
            return json.loads(res.stdout)
        except ValueError:
            return None

    def _ready(self, timeout: float = 5.0) -> bool:
        deadline = time.time() + timeout
        while True:
            good = 0
            for host in NODES:
                st = self.status(host)
                if st and st.get("ready") and sum(m["state"] == "alive" for m in st.get("members", [])) == len(NODES):
                    good += 1
            if good == len(NODES):
                return True
            if time.time() > deadline:
                return False
            time.sleep(1)

    def _vips(self) -> list[dict]:
        st = self.status(NODES[0]) or {}
        ports = {}
        import yaml

        for svc in yaml.safe_load((HERE / "inventory" / "group_vars" / "nodes.yml").read_text())["nocloudlb_services"]:
            ports[f"{svc['namespace']}/{svc['name']}"] = svc["ports"][0]
        out = []
        for v in st.get("vips", []):
            local = v["service"].endswith("/local")
            out.append({"ip": v["ip"], "service": v["service"], "port": ports.get(v["service"], 8080), "local": local})
        if not out:
            raise SystemExit("no VIPs in the speakers' status")
        return sorted(out, key=lambda v: (":" in v["ip"], v["ip"]))

    # -- observation ------------------------------------------------------------------------
    def start_observing(self, seconds: float) -> None:
        code = (HERE / "prober.py").read_text()
        args = ["python3", "-c", code, "eth0", str(ROUND), str(time.time() + seconds), self.stop_file]
        args += [f"{v['ip']}={v['port']}" for v in self.vips]
        self.prober = self.lab.popen_exec(CLIENT, args, stderr=subprocess.DEVNULL)
        threading.Thread(target=self._read, daemon=True).start()
        # announcements only (gratuitous ARP: sender IP = target IP; unsolicited NA to all nodes): the probes
        # are counted by the prober itself, and a capture of them would take minutes to read back
        self.capture = self.lab.capture_start("lan", f"chaos-{os.getpid()}", bpf=ANNOUNCEMENTS)
        time.sleep(1.0)

    def _read(self) -> None:
        assert self.prober is not None and self.prober.stdout is not None
        for line in self.prober.stdout:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                (self.rounds if item["k"] == "arp" else self.http).append(item)

    def stop_observing(self) -> list[dict]:
        try:
            self.lab.exec(CLIENT, ["touch", self.stop_file], check=False)
        except labctl.LabError:
            pass
        if self.prober is not None:
            try:
                self.prober.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.prober.kill()
                self.prober.wait()
        try:
            self.lab.exec(CLIENT, ["rm", "-f", self.stop_file], check=False)
        except labctl.LabError:
            pass
        events: list[dict] = []
        if self.capture is not None:
            cap = self.lab.capture_stop(self.capture["name"])
            try:
                events = labctl.read_events(cap["pcap"], kinds=("arp", "ndp"))
            finally:
                Path(cap["pcap"]).unlink(missing_ok=True)
        return events

    def owners_now(self, window: float = 1.0) -> dict[str, list[str]]:
        """Per VIP, the union of MACs (as hosts) that answered in the last `window` seconds."""
        with self.lock:
            recent = [r for r in self.rounds if r["t"] >= time.time() - window - ROUND]
        out: dict[str, set[str]] = {v["ip"]: set() for v in self.vips}
        for r in recent:
            for ip, macs in r["a"].items():
                out.setdefault(ip, set()).update(self.host_of.get(m, m) for m in macs)
        return {ip: sorted(h) for ip, h in out.items()}

    def expected(self) -> dict[str, str]:
        eligible = [n for n in NODES if n not in self.drained]
        return {v["ip"]: order(eligible, v["ip"])[0] for v in self.vips}

    def settle(self, timeout: float = 60.0, steady: float = 2.0) -> bool:
        """Wait until every VIP has been answered by exactly its elected node for `steady` seconds."""
        deadline = time.time() + timeout
        since = None
        while time.time() < deadline:
            now = self.owners_now(window=0.5)
            exp = self.expected()
            ok = all(now.get(ip) == [host] for ip, host in exp.items())
            if ok:
                since = since or time.time()
                if time.time() - since >= steady:
                    return True
            else:
                since = None
            time.sleep(0.2)
        log(f"not settled after {timeout:.0f} s: {self.owners_now()} (expected {self.expected()})")
        return False

    # -- phases -----------------------------------------------------------------------------
    def mark(self, text: str) -> float:
        t = time.time()
        if self.current is not None:
            self.current.marks.append((t, text))
        log(f"  {text}")
        return t

    def fault_at(self) -> None:
        assert self.current is not None
        self.current.fault = time.time()

    def leader(self) -> str:
        """The node that owns the most VIPs (the one a fault should hit)."""
        exp = list(self.expected().values())
        return max(sorted(set(exp)), key=exp.count)

    def speaker_pid(self, host: str) -> int:
        res = self.lab.exec(host, ["systemctl", "show", "-p", "MainPID", "--value", SPEAKER], check=False)
        return int(res.stdout.strip() or 0)

    def run_phase(self, phase: Phase) -> Record:
        log(f"phase {phase.name}: {phase.title}")
        if not self._ready(timeout=30):
            log("  a speaker is not ready before the phase: repairing the lab (labctl up)")
            try:
                self.lab.up(HERE / "topology.yml")
            except labctl.LabError as exc:
                log(f"  repair failed: {exc}")
            self._ready(timeout=60)
            self.settle(timeout=60)
        rec = Record(phase.name, phase.title, start=time.time(), goals=phase.goals, note=phase.note,
                     window=phase.window)
        self.current = rec
        try:
            phase.run(self)
        except Exception as exc:  # a fault that could not be applied or undone is a result too
            rec.error = f"{type(exc).__name__}: {exc}"[:300]
            log(f"  phase failed: {rec.error}")
        finally:
            if not rec.fault:
                rec.fault = rec.start
            self.settle(timeout=90)
            rec.end = time.time()
            self.current = None
            self.records.append(rec)
        return rec


def log(text: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the faults


def ph_baseline(c: Chaos, hold: float = 6.0) -> None:
    c.mark("no fault")
    time.sleep(hold)


def ph_kill(c: Chaos) -> None:
    host = c.leader()
    c.fault_at()
    c.lab.fault_kill(host, unit=SPEAKER)  # systemd restarts it (Restart=)
    c.mark(f"kill -9 speaker on {host}")
    time.sleep(8)


def ph_restarts(c: Chaos, count: int = 3, every: float = 4.0) -> None:
    host = c.leader()
    c.fault_at()
    for i in range(count):
        c.lab.exec(host, ["systemctl", "restart", SPEAKER], check=False, timeout=60)
        c.mark(f"restart {i + 1}/{count} on {host}")
        time.sleep(every)


def ph_freeze(c: Chaos, hold: float = 8.0) -> None:
    host = c.leader()
    c.fault_at()
    f = c.lab.fault_freeze(host)
    c.mark(f"freeze {host}")
    time.sleep(hold)
    c.lab.undo(f["id"])
    c.mark(f"thaw {host}")
    time.sleep(6)


def ph_cpu(c: Chaos, hold: float = 15.0) -> None:
    host = c.leader()
    burn = f"for i in 1 2 3 4; do (while :; do :; done) & done; sleep {int(hold)}; kill $(jobs -p)"
    c.fault_at()
    proc = c.lab.popen_exec(host, ["sh", "-c", burn])
    c.mark(f"4 busy loops on {host}")
    proc.wait(timeout=hold + 30)
    c.mark("busy loops end")
    time.sleep(3)


def ph_loss(c: Chaos, percent: int, hold: float = 15.0) -> None:
    c.fault_at()
    ids = [c.lab.fault_loss(n, percent)["id"] for n in NODES]
    c.mark(f"{percent} % loss at every node's port")
    time.sleep(hold)
    for i in ids:
        c.lab.undo(i)
    c.mark("loss removed")
    time.sleep(3)


def ph_partition_isolated(c: Chaos, hold: float = 12.0) -> None:
    host = c.leader()
    others = [n for n in NODES if n != host] + [CLIENT]
    c.fault_at()
    f = c.lab.fault_partition([host], others)
    c.mark(f"{host} | {', '.join(others)}")
    time.sleep(hold)
    c.lab.undo(f["id"])
    c.mark("healed")
    time.sleep(6)


def ph_partition_after_loss(c: Chaos) -> None:
    """30 % loss for 15 s, then at once the 2+1 partition: detection while local health recovers."""
    ids = [c.lab.fault_loss(n, 30)["id"] for n in NODES]
    c.mark("30 % loss at every node's port")
    time.sleep(15)
    for i in ids:
        c.lab.undo(i)
    c.mark("loss removed")
    ph_partition_isolated(c)


def ph_partition_leader(c: Chaos, hold: float = 12.0) -> None:
    host = c.leader()
    peers = [n for n in NODES if n != host]
    c.fault_at()
    f = c.lab.fault_partition([host], peers)
    c.mark(f"{host} | {', '.join(peers)} (client sees both)")
    time.sleep(hold)
    c.lab.undo(f["id"])
    c.mark("healed")
    time.sleep(6)


def ph_gossip_sockets(c: Chaos) -> None:
    host = c.leader()
    c.fault_at()
    res = c.lab.exec(host, ["ss", "-K", "-tuan", "sport = :7946"], check=False)
    c.mark(f"gossip sockets destroyed on {host} (ss -K, rc {res.returncode})")
    time.sleep(10)
    pid = c.speaker_pid(host)
    c.mark(f"speaker pid now {pid}; restarting it to clean up")
    c.lab.exec(host, ["systemctl", "restart", SPEAKER], check=False, timeout=60)
    time.sleep(3)


def restart_host(c: Chaos, host: str, hard: bool) -> None:
    """labctl's restart, and a guard should it fail to re-wire the host.

    The kernel deletes the old network namespace's veth pair asynchronously: labctl used to re-wire
    the host before that was done, find the old switch port, create no new pair and fail with
    'Cannot find device "eth0"' (about half the graceful reboots of the first runs). labctl's
    _wire_host now removes such a port itself (tests/lab/test_faults.py); should the restart still
    fail, `up` on the running lab repairs it and the lab's error stays in the phase's record.
    """
    try:
        c.lab.fault_restart(host, hard=hard, timeout=120)
    except labctl.LabError as exc:
        assert c.current is not None
        c.current.lab_error = f"{exc}"[:200]
        c.mark(f"lab restart failed ({str(exc)[:60]}...); repairing with labctl up")
        for attempt in range(20):  # until the kernel has removed the old pair
            time.sleep(1)
            try:
                c.lab.up(HERE / "topology.yml")
                break
            except labctl.LabError:
                if attempt == 19:
                    raise


def ph_reboot(c: Chaos) -> None:
    host = c.leader()
    c.fault_at()
    c.mark(f"reboot {host}")
    restart_host(c, host, hard=False)
    c.mark(f"{host} running again")
    c._ready(timeout=60)
    time.sleep(3)


def ph_drain(c: Chaos, reboot: bool = True) -> None:
    host = c.leader()
    assert c.current is not None
    c.fault_at()
    c.lab.exec(host, [NOCLOUDLB, "label", "set", f"{DRAIN_LABEL}="])  # raises: a drain that did not happen
    c.drained.add(host)
    c.mark(f"drain {host}")
    c.settle(timeout=30)
    c.current.drained, c.current.drained_from = host, time.time()
    c.lab.exec(host, ["systemctl", "restart", SPEAKER], check=False, timeout=60)
    c.mark(f"restart drained {host}")
    time.sleep(6)
    if reboot:
        c.mark(f"reboot drained {host}")
        restart_host(c, host, hard=True)
        c.mark(f"{host} running again")
        c._ready(timeout=60)
        time.sleep(4)
    c.current.marks.append((time.time(), "drain check ends"))
    c.current.drained_until = time.time()
    c.lab.exec(host, [NOCLOUDLB, "label", "unset", DRAIN_LABEL], check=False)
    c.drained.discard(host)
    c.mark(f"undrain {host}")


PHASES: dict[str, Phase] = {p.name: p for p in [
    Phase("baseline", "no fault", ph_baseline),
    Phase("kill", "kill -9 of the leader's speaker (systemd restarts it)", ph_kill),
    Phase("restarts", "three restarts of the leader's speaker, 4 s apart", ph_restarts),
    Phase("freeze", "leader host frozen 8 s (cgroup freezer, silent), then thawed", ph_freeze),
    Phase("cpu", "leader's CPU saturated by 4 busy loops for 15 s", ph_cpu),
    Phase("loss10", "10 % frame loss at every node for 15 s", lambda c: ph_loss(c, 10)),
    Phase("loss30", "30 % frame loss at every node for 15 s", lambda c: ph_loss(c, 30)),
    Phase("partition-2+1", "leader cut from its peers and the client (2+1) for 12 s", ph_partition_isolated),
    Phase("partition-leader", "leader cut from its peers, not from the client, for 12 s", ph_partition_leader,
          goals=False, note="the lab drops every frame between the leader's port and its peers', broadcasts "
                            "too: the leader cannot see the new owner's announcement, cannot tell this from "
                            "every node being cut, and keeps its VIP (docs/concepts.md, the wire rule's limit)"),
    Phase("gossip", "gossip sockets destroyed inside the leader's running speaker (ss -K)", ph_gossip_sockets),
    Phase("reboot", "graceful reboot of the leader's lab host", ph_reboot),
    Phase("drain", "leader drained, its speaker restarted, its host power-cycled, then undrained", ph_drain),
    Phase("partition-after-loss", "30 % loss for 15 s, then at once the leader cut from everyone for 12 s",
          ph_partition_after_loss, window="degraded"),
]}

# the loss phases last: Lifeguard's slower detection after loss would leak into the next phases
FULL = ["baseline", "kill", "restarts", "freeze", "cpu", "partition-2+1", "partition-leader", "gossip", "reboot",
        "drain", "loss10", "loss30", "partition-after-loss"]
SHORT = ["baseline", "kill", "restarts", "freeze", "partition-2+1", "drain"]


# --------------------------------------------------------------------------- analysis


def stretches(rounds: list[dict], ip: str, test: Callable[[list[str]], bool],
              bridge: int = 0) -> list[tuple[float, float]]:
    """Maximal runs of consecutive rounds where test(macs) holds: [(start, end)], end = last round + ROUND.

    With bridge=N, runs separated by at most N rounds where it does not hold count as one.
    """
    out: list[tuple[float, float]] = []
    start = last = None
    for r in rounds:
        hit = test(r["a"].get(ip, []))
        if hit:
            if start is None:
                start = r["t"]
            last = r["t"]
        elif start is not None:
            out.append((start, last + ROUND))
            start = None
    if start is not None:
        out.append((start, last + ROUND))
    if bridge:
        merged: list[tuple[float, float]] = []
        for a, b in out:
            if merged and a - merged[-1][1] <= bridge * ROUND + 1e-6:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        out = merged
    return out


def analyse(c: Chaos, rec: Record) -> dict[str, Any]:
    rounds = [r for r in c.rounds if rec.start <= r["t"] <= rec.end]
    http = [h for h in c.http if rec.start <= h["t"] <= rec.end]
    vips: dict[str, Any] = {}
    problems: list[str] = []
    for v in c.vips:
        ip = v["ip"]
        # two owners: a lost reply (or one side answering late) must not split one overlap into
        # several short ones, so gaps of up to two rounds are bridged; loss only ever removes
        # answers, so the no-owner stretches are taken as they are
        two = stretches(rounds, ip, lambda m: len(m) >= 2, bridge=2)
        none = stretches(rounds, ip, lambda m: len(m) == 0)
        seen: list[str] = []
        for r in rounds:
            for m in r["a"].get(ip, []):
                h = c.host_of.get(m, m)
                if h not in seen:
                    seen.append(h)
        reqs = [h for h in http if h["ip"] == ip]
        longest_two = max((b - a for a, b in two), default=0.0)
        longest_none = max((b - a for a, b in none), default=0.0)
        item = {
            "service": v["service"], "owners": seen, "two_s": round(sum(b - a for a, b in two), 2),
            "two_max_s": round(longest_two, 2), "none_s": round(sum(b - a for a, b in none), 2),
            "none_max_s": round(longest_none, 2), "http": len(reqs), "http_failed": sum(not h["ok"] for h in reqs),
        }
        if rec.drained:
            until = rec.drained_until or rec.end
            bad = [r for r in rounds if rec.drained_from <= r["t"] <= until
                   and c.macs[rec.drained] in r["a"].get(ip, [])]
            item["drained_answers"] = len(bad)
            if bad:
                problems.append(f"{ip}: drained {rec.drained} answered in {len(bad)} rounds")
        limit_two, limit_none = limits(rec.window)
        if longest_two > limit_two:
            problems.append(f"{ip}: two owners for {longest_two:.2f} s (goal <= {limit_two} s)")
        if longest_none > limit_none:
            problems.append(f"{ip}: no owner for {longest_none:.2f} s (goal <= {limit_none} s)")
        vips[ip] = item
    if rec.error:
        problems.append(f"the phase failed: {rec.error}")
    return {"name": rec.name, "title": rec.title, "goals": rec.goals, "note": rec.note, "start": rec.start,
            "fault": rec.fault, "end": rec.end, "seconds": round(rec.end - rec.start, 1),
            "marks": [(round(t - rec.start, 2), text) for t, text in rec.marks], "rounds": len(rounds),
            "window": rec.window, "lab_error": rec.lab_error,
            "vips": vips, "problems": problems, "ok": not problems or not rec.goals}


# --------------------------------------------------------------------------- report


def announcements(c: Chaos, results: list[dict], events: list[dict]) -> None:
    """Add to each phase the gratuitous ARPs / unsolicited NAs each node sent during it."""
    for res in results:
        counts: dict[str, int] = {}
        for e in events:
            if not res["start"] <= e["t"] <= res["end"]:
                continue
            mac = (e.get("sender_mac") or e.get("lladdr") or e.get("src_mac") or "").lower()
            host = c.host_of.get(mac, mac)
            counts[host] = counts.get(host, 0) + 1
        res["announcements"] = dict(sorted(counts.items()))


def table(results: list[dict], vips: list[dict]) -> str:
    lines = ["| phase | VIP | owners seen | two owners: longest / total (s) | no owner: longest / total (s) "
             "| HTTP failed / sent | goals |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for res in results:
        for v in vips:
            item = res["vips"][v["ip"]]
            goal = "met" if not res["problems"] else ("**broken**" if res["goals"] else "not promised")
            if "drained_answers" in item:
                goal += f"; drained node answered {item['drained_answers']} rounds"
            lines.append(f"| {res['name']} | {v['ip']} ({v['service']}) | {' '.join(item['owners']) or '-'} | "
                         f"{item['two_max_s']:.2f} / {item['two_s']:.2f} | {item['none_max_s']:.2f} / "
                         f"{item['none_s']:.2f} | {item['http_failed']} / {item['http']} | {goal} |")
    return "\n".join(lines)


def picture(c: Chaos, results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colors = {"n1": "#4C72B0", "n2": "#55A868", "n3": "#C44E52"}
    n = len(results)
    fig, axes = plt.subplots(n, 1, figsize=(12, 1.0 + 1.25 * n), squeeze=False)
    for ax, res in zip([a[0] for a in axes], results, strict=True):
        start = res["start"]
        rounds = [r for r in c.rounds if res["start"] <= r["t"] <= res["end"]]
        for row, v in enumerate(c.vips):
            ip = v["ip"]
            # one bar per run of rounds with the same answer, each round lasting until the next one
            runs: list[list] = []
            for i, r in enumerate(rounds):
                macs = r["a"].get(ip, [])
                key = "two" if len(macs) >= 2 else c.host_of.get(macs[0], "?") if macs else "none"
                width = min((rounds[i + 1]["t"] if i + 1 < len(rounds) else r["t"] + ROUND) - r["t"], 3 * ROUND)
                if runs and runs[-1][0] == key and abs(runs[-1][1] + runs[-1][2] - (r["t"] - start)) < 1e-6 + ROUND:
                    runs[-1][2] = r["t"] - start + width - runs[-1][1]
                else:
                    runs.append([key, r["t"] - start, width])
            for key, x, width in runs:
                color = {"two": "#FF00FF", "none": "#000000"}.get(key) or colors.get(key, "#999999")
                ax.broken_barh([(x, width)], (row - 0.4, 0.8), color=color)
        for t, text in res["marks"]:
            ax.axvline(t, color="#333333", lw=0.8, ls="--")
            ax.text(t, len(c.vips) - 0.3, text, fontsize=6, rotation=0, va="bottom", ha="left")
        ax.set_yticks(range(len(c.vips)), [v["ip"] for v in c.vips], fontsize=6)
        ax.set_ylim(-0.6, len(c.vips) + 0.4)
        ax.set_xlim(0, res["end"] - start)
        verdict = "goals met" if not res["problems"] else ("GOALS BROKEN" if res["goals"] else "not promised")
        ax.set_title(f"{res['name']}: {res['title']} [{verdict}]", fontsize=8, loc="left")
        ax.tick_params(axis="x", labelsize=6)
    axes[-1][0].set_xlabel("seconds since the phase began", fontsize=7)
    handles = [Patch(color=col, label=f"{h} answers") for h, col in colors.items()]
    handles += [Patch(color="#FF00FF", label="two or more MACs"), Patch(color="#000000", label="no answer")]
    fig.legend(handles=handles, loc="upper right", ncol=5, fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_docs(c: Chaos, results: list[dict], events: list[dict], seconds: float) -> None:
    doc = ROOT / "docs" / "chaos.md"
    img = ROOT / "docs" / "images" / "chaos-timeline.png"
    picture(c, results, img)
    text = doc.read_text() if doc.exists() else ""
    begin, end = "<!-- chaos:results:begin -->", "<!-- chaos:results:end -->"
    garps = sum(1 for e in events if e.get("kind") == "arp" and e.get("gratuitous"))
    nas = sum(1 for e in events if e.get("kind") == "ndp" and e.get("type") == "na")
    body = [begin, "", f"Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {seconds:.0f} s, "
            f"{len(c.rounds)} probe rounds, {len(c.http)} HTTP requests; the capture saw {garps} gratuitous ARP "
            f"and {nas} neighbour advertisements. Limits: two owners <= {LIMIT_TWO} s, no owner <= {LIMIT_NONE} s "
            f"(after loss: {limits('degraded')[0]} s and {limits('degraded')[1]} s).",
            "", table(results, c.vips), "", "![owners over time](images/chaos-timeline.png)", ""]
    body.append("Announcements (gratuitous ARP and unsolicited NA) per phase and node: " + "; ".join(
        f"`{res['name']}` {', '.join(f'{h} {n}' for h, n in res.get('announcements', {}).items()) or 'none'}"
        for res in results) + ".")
    body.append("")
    for res in results:
        if res.get("lab_error"):
            body.append(f"- `{res['name']}`: the lab's restart failed and was repaired: {res['lab_error']}")
        if res["problems"]:
            body.append(f"- `{res['name']}`{' (not promised)' if not res['goals'] else ''}: "
                        + "; ".join(res["problems"]))
    body += ["", end]
    if begin in text and end in text:
        text = text[:text.index(begin)] + "\n".join(body) + text[text.index(end) + len(end):]
    else:
        text = text + "\n" + "\n".join(body) + "\n"
    doc.write_text(text)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="every phase")
    ap.add_argument("--short", action="store_true", help="the bounded set make test runs")
    ap.add_argument("--phases", help="comma-separated phases: " + ", ".join(PHASES))
    ap.add_argument("--docs", action="store_true", help="write docs/chaos.md's results and docs/images/chaos-*.png")
    ap.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    ap.add_argument("--no-deploy", action="store_true", help="fail instead of deploying when speakers are not ready")
    a = ap.parse_args(argv)
    names = FULL if a.full else SHORT if a.short or not a.phases else a.phases.split(",")
    unknown = [n for n in names if n not in PHASES]
    if unknown:
        ap.error(f"unknown phases {unknown}; known: {', '.join(PHASES)}")
    if os.geteuid() != 0:
        ap.error("run as root (the lab needs it)")
    t0 = time.time()
    c = Chaos(deploy=not a.no_deploy)
    results: list[dict] = []
    events: list[dict] = []
    try:
        c.start_observing(seconds=3600)
        if not c.settle(timeout=60):
            raise SystemExit("the VIPs are not answered by their elected nodes before any fault")
        for name in names:
            rec = c.run_phase(PHASES[name])
            res = analyse(c, rec)
            results.append(res)
            RESULTS.write_text(json.dumps({"partial": True, "phases": results}))
            log(f"  -> {'ok' if res['ok'] else 'GOALS BROKEN'}: {'; '.join(res['problems']) or 'no problem'}")
    finally:
        c.lab.undo_all()
        for host in list(c.drained):
            c.lab.exec(host, [NOCLOUDLB, "label", "unset", DRAIN_LABEL], check=False)
        events = c.stop_observing()
        if not a.keep:
            c.lab.down()
    seconds = time.time() - t0
    out = {"seconds": round(seconds, 1), "limits": {"two_s": LIMIT_TWO, "none_s": LIMIT_NONE},
           "vips": c.vips, "macs": c.macs, "phases": results}
    announcements(c, results, events)
    RESULTS.write_text(json.dumps({**out, "rounds": c.rounds, "http": c.http}))
    print(json.dumps(out, indent=1))
    if a.docs:
        write_docs(c, results, events, seconds)
    print(table(results, c.vips), file=sys.stderr)
    broken = [r["name"] for r in results if not r["ok"]]
    if broken:
        log(f"goals broken in: {', '.join(broken)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
