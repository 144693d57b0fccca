"""Measure a VIP failover on the lab, on packets and HTTP (not on the speakers' word).

It polls http://VIP:PORT/ from a client host every 50 ms (each node's web root names the
node), captures the segment, injects one fault through the lab's fault API (or runs a
command such as a drain playbook), waits until the VIP is served by the node the election
names next, and reports:
  first_announce_s  fault -> first gratuitous ARP / unsolicited NA (or ARP reply) for the VIP
                    from the new owner's MAC, read from the capture
  http_back_s       fault -> first HTTP answer from the new owner
  http_failed       failed HTTP requests from the fault on (0 is the drain's promise); a request
                    with no answer within 1 s counts as failed
  longest_outage_s  longest run of failed requests
  failures          each failed request: seconds after the fault, and the error
  served_by         [seconds after the fault, node] each time the node serving the VIP changed
  resets_at_move    failed requests reset by the peer between the last answer of one node and the
                    first of the next: a connection that straddled the switch of MACs
Then it undoes the fault and waits until the original owner serves again (restored_s).
``--fault watch --command CMD`` (no --host) only watches while CMD runs (a migration): command_rc,
http_requests, http_failed, longest_outage_s, failures, served_by and announcers (every node whose
MAC sent a gratuitous ARP or an ARP reply for the VIP, with its first time), from an ARP-only capture; with
--fault watch also announce_runs ([time, node] at each change of the announcing node) and tasks ([time, task]
for each Ansible task the command started), to place an announcement on the playbooks' timeline.
One JSON object on stdout. Usage: measure.py --lab l2 --vip IP --port 8080 --fault kill --host n1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

LABCTL = Path(__file__).resolve().parents[3] / "roles" / "lab" / "files" / "labctl.py"

POLLER = r"""
import json, sys, time, urllib.request
url, interval, until, stop = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
import os
while time.time() < until and not os.path.exists(stop):
    t = time.time()
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:
            body, ok = r.read().decode().strip(), True
    except Exception as exc:
        body, ok = f"{type(exc).__name__}: {exc}"[:160], False
    print(json.dumps({"t": t, "ok": ok, "body": body}), flush=True)
    time.sleep(max(0.0, interval - (time.time() - t)))
"""


def labctl(lab: str, *args: str, check: bool = True) -> str:
    proc = subprocess.run([sys.executable, str(LABCTL), *args[:1], "-n", lab, *args[1:]], capture_output=True,
                          text=True, timeout=120, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"labctl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def order(nodes: list[str], ip: str) -> list[str]:
    return sorted(nodes, key=lambda n: hashlib.sha256(f"{n}#{ip}".encode()).digest())


class Poller:
    def __init__(self, lab: str, client: str, url: str, seconds: float) -> None:
        self.lab, self.client = lab, client
        self.stop_file = f"/tmp/ndp-poll-stop-{int(time.time() * 1000)}"
        cmd = [sys.executable, str(LABCTL), "exec", "-n", lab, client, "--", "python3", "-c", POLLER, url, "0.05",
               str(time.time() + seconds), self.stop_file]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.samples: list[dict] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.samples.append(sample)

    def since(self, t0: float) -> list[dict]:
        with self.lock:
            return [s for s in self.samples if s["t"] >= t0]

    def wait_for(self, body: str, t0: float, timeout: float, streak: int = 3) -> float | None:
        """Time of the first of `streak` consecutive answers `body` after t0, or None."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            run = 0
            for s in self.since(t0):
                run = run + 1 if s["ok"] and s["body"] == body else 0
                if run >= streak:
                    firsts = [x["t"] for x in self.since(t0) if x["ok"] and x["body"] == body]
                    return firsts[0] if firsts else None
            time.sleep(0.1)
        return None

    def close(self) -> None:
        labctl(self.lab, "exec", self.client, "--", "touch", self.stop_file, check=False)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        labctl(self.lab, "exec", self.client, "--", "rm", "-f", self.stop_file, check=False)
        self.thread.join(timeout=2)


def outage(samples: list[dict]) -> tuple[int, float]:
    failed, longest, start = 0, 0.0, None
    for s in samples:
        if not s["ok"]:
            failed += 1
            start = s["t"] if start is None else start
        elif start is not None:
            longest, start = max(longest, s["t"] - start), None
    if start is not None and samples:
        longest = max(longest, samples[-1]["t"] - start)
    return failed, round(longest, 3)


def http_report(samples: list[dict], t0: float) -> dict:
    """Requests, failures (each, seconds after t0), the longest outage and each change of the node serving."""
    out: dict = {"http_requests": len(samples)}
    out["http_failed"], out["longest_outage_s"] = outage(samples)
    out["failures"] = [{"t": round(s["t"] - t0, 3), "error": s["body"]} for s in samples if not s["ok"]][:20]
    out["served_by"], last = [], None
    for s in samples:
        if s["ok"] and s["body"] != last:
            out["served_by"].append([round(s["t"] - t0, 3), s["body"]])
            last = s["body"]
    out["resets_at_move"] = resets_at_move(samples)
    return out


def resets_at_move(samples: list[dict]) -> int:
    """Failed requests that were reset between the last answer of one node and the first of another:
    a connection open while the client's ARP/NDP entry switched MACs, which the new owner has no
    socket for (keepalived has no connection handover; the speaker's handover forwarding avoids it)."""
    ok = [(i, s["body"]) for i, s in enumerate(samples) if s["ok"]]
    count = 0
    for (i, before), (j, after) in zip(ok, ok[1:], strict=False):
        if before != after:
            count += sum("reset by peer" in samples[k]["body"] for k in range(i + 1, j))
    return count


def announcements(events: list[dict], vip: str, t0: float, host_of_mac: dict[str, str]) -> list[tuple[float, str]]:
    """(seconds after t0, node or MAC) of every gratuitous ARP / ARP reply / NA for the VIP."""
    out = []
    for e in events:
        if e["t"] < t0 or not (
                (e["kind"] == "arp" and e["sender_ip"] == vip and e["op"] in ("request", "reply")
                 and (e["gratuitous"] or e["op"] == "reply"))
                or (e["kind"] == "ndp" and e.get("type") == "na" and e.get("target") == vip)):
            continue
        mac = (e.get("sender_mac") or e.get("lladdr") or e.get("src_mac") or "").lower()
        out.append((round(e["t"] - t0, 3), host_of_mac.get(mac, mac)))
    return out


def announcers(events: list[dict], vip: str, t0: float, host_of_mac: dict[str, str]) -> dict[str, float]:
    """Node (or MAC) -> seconds after t0 of its first gratuitous ARP / ARP reply / NA for the VIP."""
    firsts: dict[str, float] = {}
    for t, node in announcements(events, vip, t0, host_of_mac):
        firsts.setdefault(node, t)
    return firsts


def announce_runs(events: list[dict], vip: str, t0: float, host_of_mac: dict[str, str]) -> list[list]:
    """[seconds after t0, node] at each announcement for the VIP by another node than the one before."""
    runs: list[list] = []
    for t, node in announcements(events, vip, t0, host_of_mac):
        if not runs or runs[-1][1] != node:
            runs.append([t, node])
    return runs


def run_command(command: str, timeout: float, result: dict, t0: float | None = None) -> None:
    """Run ``command``; with ``t0``, result["tasks"] lists [seconds after t0, task] for each Ansible task it
    started (to place an announcement on the timeline of the playbooks)."""
    tasks: list[list] = []
    out: list[str] = []
    with subprocess.Popen(command, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        assert proc.stdout is not None
        watchdog = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))  # the whole shell pipeline
        watchdog.start()
        try:
            for line in proc.stdout:
                out.append(line)
                if t0 is not None and line.startswith("TASK ["):
                    tasks.append([round(time.time() - t0, 1), line[6:].split("]", 1)[0]])
            rc = proc.wait()
        finally:
            watchdog.cancel()
    result["command_rc"] = rc
    if t0 is not None:
        result["tasks"] = tasks
    if rc != 0:
        result["command_output"] = "".join(out)[-3000:]


def watch(a: argparse.Namespace, host_of_mac: dict[str, str], url: str) -> dict:
    """--fault watch: measure while --command runs, nothing injected, nothing undone."""
    poller = Poller(a.lab, a.client, url, a.timeout + 60)
    capture = json.loads(labctl(a.lab, "capture", "start", a.segment, "--filter", "arp"))
    result: dict = {"fault": "watch", "vip": a.vip}
    try:
        time.sleep(2)
        t0 = time.time()
        run_command(a.command, a.timeout, result, t0)
        time.sleep(1)
        result["seconds"] = round(time.time() - t0, 1)
        result.update(http_report(poller.since(t0), t0))
    finally:
        labctl(a.lab, "capture", "stop", capture["name"], check=False)
        poller.close()
    events = json.loads(labctl(a.lab, "capture", "read", capture["pcap"], "--kinds", "arp"))
    result["announcers"] = announcers(events, a.vip, t0, host_of_mac)
    result["announce_runs"] = announce_runs(events, a.vip, t0, host_of_mac)
    Path(capture["pcap"]).unlink(missing_ok=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lab", required=True)
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--client", default="c1")
    ap.add_argument("--segment", default="lan")
    ap.add_argument("--fault", required=True, choices=["kill", "freeze", "link-down", "command", "watch"])
    ap.add_argument("--host", help="the node the fault hits (the VIP's owner); every fault but watch")
    ap.add_argument("--command", help="for --fault command or watch: shell command to run (e.g. a drain playbook)")
    ap.add_argument("--undo-command", help="for --fault command: shell command that undoes it")
    ap.add_argument("--expect-after", help="the owner expected once the fault or command is done "
                    "(default: the next node in the VIP's order)")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--settle", type=float, default=6.0,
                    help="seconds to wait before the fault, so announcement rounds of earlier moves are over")
    a = ap.parse_args()

    inv = json.loads(Path(labctl(a.lab, "inventory").strip()).read_text())["all"]
    nodes = sorted(inv["children"]["speakers"]["hosts"])
    macs = {h: inv["hosts"][h]["lab_interfaces"][0]["mac"].lower() for h in nodes}
    host_of_mac = {m: h for h, m in macs.items()}
    url = f"http://[{a.vip}]:{a.port}/" if ":" in a.vip else f"http://{a.vip}:{a.port}/"
    if a.fault == "watch" or not a.host:
        if a.fault != "watch" or not a.command:
            ap.error("--host is required, except with --fault watch, which requires --command")
        print(json.dumps(watch(a, host_of_mac, url), sort_keys=True))
        return 0
    expected_old = order(nodes, a.vip)[0]
    expected_new = a.expect_after or order([n for n in nodes if n != a.host], a.vip)[0]
    result: dict = {"fault": a.fault, "host": a.host, "vip": a.vip, "expected_owner_before": expected_old,
                    "expected_owner_after": expected_new}

    poller = Poller(a.lab, a.client, url, a.timeout * 3 + 30)
    capture = json.loads(labctl(a.lab, "capture", "start", a.segment))
    undo_id = None
    try:
        before = poller.wait_for(a.host, time.time() - 1, 15, streak=3)
        if before is None:
            raise SystemExit(f"{url} is not served by {a.host} before the fault: {poller.since(0)[-3:]}")
        time.sleep(a.settle)
        if a.fault == "kill":
            # Keep systemd from restarting the speaker, so the failover path (not a fast restart) is measured.
            labctl(a.lab, "exec", a.host, "--", "sh", "-c",
                   "mkdir -p /run/systemd/system/nocloudlb-speaker.service.d && printf '[Service]\\nRestart=no\\n' "
                   "> /run/systemd/system/nocloudlb-speaker.service.d/ndp-norestart.conf && systemctl daemon-reload")
            fault = json.loads(labctl(a.lab, "fault", "kill", a.host, "--unit", "nocloudlb-speaker.service"))
        elif a.fault == "freeze":
            fault = json.loads(labctl(a.lab, "fault", "freeze", a.host))
        elif a.fault == "link-down":
            fault = json.loads(labctl(a.lab, "fault", "link-down", a.host))
        else:
            t = time.time()
            run_command(a.command or "true", a.timeout * 2, result)
            fault = {"ts": t, "id": None}
        undo_id = fault.get("id")
        t_fault = float(fault["ts"])
        t_back = poller.wait_for(expected_new, t_fault, a.timeout)
        time.sleep(0.5)
        samples = poller.since(t_fault)
        result["new_owner_http"] = next((s["body"] for s in reversed(samples) if s["ok"]), None)
        result["http_back_s"] = round(t_back - t_fault, 3) if t_back else None
        # for a report that has to explain itself: each failed request, and when the serving node changed
        result.update(http_report(samples, t_fault))
    finally:
        labctl(a.lab, "capture", "stop", capture["name"], check=False)
    events = json.loads(labctl(a.lab, "capture", "read", capture["pcap"], "--kinds", "arp,ndp"))
    result["announcers"] = announcers(events, a.vip, t_fault, host_of_mac)
    result["first_announce_s"] = result["announcers"].get(expected_new)
    Path(capture["pcap"]).unlink(missing_ok=True)

    # Undo, and wait until the original owner serves again (MetalLB's rule: the first node in the
    # order takes its VIPs back when it returns).
    t_undo = time.time()
    if a.fault == "command":
        if a.undo_command:
            subprocess.run(a.undo_command, shell=True, capture_output=True, text=True, timeout=a.timeout * 2,
                           check=False)
    else:
        labctl(a.lab, "fault", "undo", undo_id, check=False)
        if a.fault == "kill":
            labctl(a.lab, "exec", a.host, "--", "sh", "-c",
                   "rm -f /run/systemd/system/nocloudlb-speaker.service.d/ndp-norestart.conf && "
                   "systemctl daemon-reload && systemctl start nocloudlb-speaker.service", check=False)
    if a.fault != "command" or a.undo_command:
        t_restored = poller.wait_for(a.host, t_undo, 15)
        result["restored_s"] = round(t_restored - t_undo, 3) if t_restored else None
        if t_restored is None:
            # The returning owner announced nothing the client heard, and the interim owner still
            # serves the VIP (it is on every node's lo), so the client's ARP entry, confirmed by
            # its own TCP traffic, never expires. Flush it so the next step starts clean; the
            # report keeps restored_s = null.
            labctl(a.lab, "exec", a.client, "--", "ip", "neigh", "flush", "to", a.vip, check=False)
            t_flush = time.time()
            t_restored = poller.wait_for(a.host, t_flush, a.timeout)
            result["restored_after_neigh_flush_s"] = round(t_restored - t_flush, 3) if t_restored else None
    poller.close()
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
