"""verify of the molecule scenario ``bgp-gobgp``: the interop matrix's GoBGP column, every claim read
from the router g1's RIB (``gobgp neighbor -j``, ``gobgp global rib -j``; GoBGP programs no FIB).
Nodes n1 (FRR 8.4) and n2 (FRR 10.3). Prints one ``GOBGP ...`` line per check with its figures and
``GOBGP-MATRIX {json}`` at the end; exits 1 at the first failed check.

    verify_gobgp.py LAB_NAME REPO_ROOT
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

LAB, REPO = sys.argv[1], sys.argv[2]
sys.path.insert(0, f"{REPO}/roles/lab/files")
import labctl  # noqa: E402
from labctl import timed, wait_for  # noqa: E402

lab = labctl.Lab(LAB)
NODES = {"n1": "198.51.100.11", "n2": "198.51.100.12"}
ALL = set(NODES.values())
WEB = "203.0.113.10/32"
COMMUNITY = 64512 << 16 | 100  # 64512:100 as GoBGP's JSON carries it
DRAIN = "node.kubernetes.io/exclude-from-external-load-balancers"
CLI = "/opt/nocloudlb/venv/bin/nocloudlb"
BIN = os.path.dirname(sys.executable)
INVENTORY = ["-i", f"/var/lib/nocloudlb-lab/{LAB}/inventory.yml", "-i", f"{REPO}/molecule/bgp-gobgp/inventory"]
matrix: dict[str, dict] = {n: {} for n in NODES}


def fail(msg: str) -> None:
    print(f"GOBGP FAILED: {msg}", flush=True)
    sys.exit(1)


def check(cond: bool, msg: str) -> None:
    if not cond:
        fail(msg)


def gobgp(*args: str) -> object:
    out = lab.exec("g1", ["gobgp", *args, "-j"], timeout=30, check=False).stdout
    try:
        return json.loads(out or "null")
    except ValueError:
        return None


def established() -> set[str]:
    peers = gobgp("neighbor") or []
    return {p["state"]["neighbor_address"] for p in peers if p.get("state", {}).get("session_state") == 6}


def paths(prefix: str = WEB) -> list[dict]:
    rib = gobgp("global", "rib", "-a", "ipv4") or {}
    return rib.get(prefix, []) if isinstance(rib, dict) else []


def hops(prefix: str = WEB) -> set[str]:
    return {a["nexthop"] for p in paths(prefix) for a in p.get("attrs", []) if a.get("type") == 3}


def all_back(what: str, timeout: float = 90) -> None:
    check(bool(wait_for(lambda: hops() == ALL, timeout, 0.2)), f"{what}: g1 has {WEB} via {hops()}")


def version(host: str) -> str:
    return lab.exec(host, ["sh", "-c", "vtysh -c 'show version' | head -1"], check=False).stdout.strip()


# 1. sessions, the VIP from both nodes, the community -----------------------------------------
node_frr = {n: version(n) for n in NODES}
router = lab.exec("g1", ["gobgpd", "--version"], check=False).stdout.strip()
check(bool(wait_for(lambda: established() == ALL, 90, 0.5)), f"g1: sessions Established from {established()}")
check(bool(wait_for(lambda: hops() == ALL, 60, 0.2)), f"g1: {WEB} via {hops()}, want {ALL}")
comms = [c for p in paths() for a in p.get("attrs", []) if a.get("type") == 8 for c in a.get("communities", [])]
check(comms == [COMMUNITY, COMMUNITY], f"g1: {WEB} communities {comms}, want 64512:100 on each path")
rib = gobgp("global", "rib", "-a", "ipv4")
check(isinstance(rib, dict) and set(rib) == {WEB}, f"g1's RIB holds {sorted(rib or {})}, want only {WEB}")
print(f"GOBGP g1 ({router}): sessions from n1 ({node_frr['n1']}) and n2 ({node_frr['n2']}) Established, no "
      f"password, no BFD; {WEB} in the RIB from both ({sorted(hops())}), community 64512:100 on each path",
      flush=True)
for n in NODES:
    matrix[n].update(frr=node_frr[n], session="Established", paths=2, community="64512:100")


# 2. drain, clean stop, node frozen, bgpd frozen -----------------------------------------------
def drain(node: str) -> float | None:
    lab.exec(node, [CLI, "label", "set", f"{DRAIN}=true"])
    t = timed(lambda: hops() == ALL - {NODES[node]}, 10)
    lab.exec(node, [CLI, "label", "unset", DRAIN])
    all_back(f"undrain {node}")
    return t


def clean_stop(node: str) -> bool:
    lab.exec(node, ["systemctl", "stop", "nocloudlb-speaker.service"], timeout=60)
    gone = NODES[node] not in hops()
    lab.exec(node, ["systemctl", "start", "nocloudlb-speaker.service"], timeout=60)
    all_back(f"{node} started again")
    return gone


def freeze_node(node: str) -> float | None:
    fault = lab.fault_freeze(node)
    t = timed(lambda: NODES[node] not in hops(), 20)
    lab.undo(fault["id"])
    all_back(f"{node} thawed")
    return t


def freeze_bgpd(node: str) -> float | None:
    bgpd = lab.exec(node, ["cat", "/run/frr/bgpd.pid"]).stdout.strip()
    lab.exec(node, ["kill", "-STOP", bgpd])
    t = timed(lambda: NODES[node] not in hops(), 20)
    lab.exec(node, ["kill", "-CONT", bgpd])
    all_back(f"bgpd thawed on {node}")
    return t


for n in NODES:
    t = drain(n)
    check(t is not None, f"drain {n}: its path still in g1's RIB: {hops()}")
    matrix[n]["drain_s"] = round(t or 0, 3)
    check(clean_stop(n), f"stopped speaker on {n}: g1 still has its path")
    matrix[n]["stop"] = "gone"
    t = freeze_node(n)
    check(t is not None and t < 15, f"freeze {n}: path gone after {t} s (hold time 9 s)")
    matrix[n]["freeze_node_s"] = round(t or 0, 3)
    t = freeze_bgpd(n)
    check(t is not None and t < 15, f"bgpd frozen on {n}: path gone after {t} s (hold time 9 s)")
    matrix[n]["freeze_bgpd_s"] = round(t or 0, 3)
    print(f"GOBGP {n} ({node_frr[n]}): drain: path gone from g1's RIB after {matrix[n]['drain_s']:.3f} s; clean "
          f"stop: gone when systemctl stop returned; node frozen: gone after {matrix[n]['freeze_node_s']:.2f} s and "
          f"bgpd frozen: after {matrix[n]['freeze_bgpd_s']:.2f} s (no BFD: the hold time, 9 s)", flush=True)


# 3. rolling_restart.yml keeps the routes; kill -9 of a speaker withdraws ---------------------
seen = {"samples": 0, "short": 0}
stop = threading.Event()


def sample() -> None:
    while not stop.is_set():
        h = hops()
        seen["samples"] += 1
        seen["short"] += int(h != ALL)
        time.sleep(0.02)


watcher = threading.Thread(target=sample)
watcher.start()
time.sleep(1.0)
since, t0 = int(time.time()), time.monotonic()
run = subprocess.run([f"{BIN}/ansible-playbook", *INVENTORY, f"{REPO}/playbooks/rolling_restart.yml",
                      "-e", "nocloudlb_hosts=nodes"], capture_output=True, check=False, text=True, timeout=600)
took = time.monotonic() - t0
time.sleep(1.0)
stop.set()
watcher.join()
check(run.returncode == 0, f"rolling_restart.yml failed: {run.stdout[-3000:]} {run.stderr[-2000:]}")
journal = ["journalctl", "-u", "nocloudlb-speaker.service", "--since", f"@{since}", "-o", "cat"]
kept = sum("bgpRoutesKept" in lab.exec(n, journal).stdout for n in NODES)
check(kept == len(NODES), f"rolling_restart.yml: {kept} of {len(NODES)} speakers logged bgpRoutesKept")
check(seen["samples"] > 50 and seen["short"] == 0, f"rolling restart: g1 lost a path of {WEB}: {seen}")
print(f"GOBGP rolling_restart.yml ({took:.1f} s, both speakers restarted, none drained): RIB samples without one of "
      f"the 2 paths: {seen['short']} of {seen['samples']}", flush=True)
for n in NODES:
    lab.exec(n, ["sh", "-c", "kill -9 $(systemctl show -p MainPID --value nocloudlb-speaker.service)"])
    t = timed(lambda n=n: NODES[n] not in hops(), 15)
    check(t is not None, f"kill -9 of {n}'s speaker: g1 still has its path")
    all_back(f"{n}'s speaker restarted by systemd")
    matrix[n].update(kill_speaker_s=round(t or 0, 3), rolling_restart_samples_short=f"0/{seen['samples']}")
    print(f"GOBGP kill -9 of {n}'s speaker: path gone from g1's RIB after {t:.3f} s (bgp-guard); back once systemd "
          "restarted it", flush=True)

print("GOBGP-MATRIX " + json.dumps({"router": router, "nodes": matrix}), flush=True)
