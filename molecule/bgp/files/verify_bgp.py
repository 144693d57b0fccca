"""verify of the molecule scenario ``bgp``: every claim is read from the router r1 (vtysh json,
ip route) or from the client c2's traffic. Prints one ``BGP ...`` line per check with its
figures, ``BGP-FIGURES {json}`` at the end, and exits 1 at the first failed check.

The interop matrix: the nodes run Debian 12's FRR 8.4 and peer with r1 (FRR 8.4), r2 (Debian 13's
FRR 10.3) and r3 (BIRD 2). (Nodes on FRR 10.3 are left out: with BFD their sessions never start
against these passive routers; docs/bgp.md, "Routers and FRR releases".) Each check that moves a next
hop (drain, a clean stop, a frozen node, a frozen bgpd) is timed at the three routers at once,
from their kernel's FIB; sessions, ECMP next hops and communities are read from each router's
own tool (vtysh json, birdc). ``BGP-MATRIX {json}`` carries the figures per router and node.

    verify_bgp.py LAB_NAME REPO_ROOT
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
from nocloudlb.core.routes import kernel_next_hops  # noqa: E402

lab = labctl.Lab(LAB)
NODES = {"n1": "198.51.100.11", "n2": "198.51.100.12", "n3": "198.51.100.13"}
ROUTERS = {"r1": "frr", "r2": "frr", "r3": "bird"}  # r1: Debian 12's FRR 8.4; r2: Debian 13's FRR 10.3
ALL = set(NODES.values())
WEB, LOCAL, AGG = "203.0.113.10", "203.0.113.11", "203.0.113.66"
DRAIN = "node.kubernetes.io/exclude-from-external-load-balancers"
CLI = "/opt/nocloudlb/venv/bin/nocloudlb"
figures: dict[str, object] = {}

CLIENT = r"""
import http.client, json, sys, time, os
ip, n, every, stop = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
seen, failed, total = {}, [], 0
while (n and total < n) or (not n and not os.path.exists(stop)):
    total += 1
    t = time.time()
    try:
        c = http.client.HTTPConnection(ip, 8080, timeout=1)
        c.request("GET", "/")
        body = c.getresponse().read().decode().strip()
        c.close()
        seen[body] = seen.get(body, 0) + 1
    except Exception as exc:
        failed.append({"t": t, "error": repr(exc)})
    if every:
        time.sleep(every)
print(json.dumps({"total": total, "seen": seen, "failed": failed}))
"""


def fail(msg: str) -> None:
    print(f"BGP FAILED: {msg}", flush=True)
    for host in ("r1", "r2"):
        print(host, lab.exec(host, ["vtysh", "-c", "show bgp summary"], check=False).stdout)
    print("r3", lab.exec("r3", ["birdc", "show", "protocols"], check=False).stdout)
    for host in NODES:
        print(host, lab.exec(host, ["sh", "-c", f"{CLI} status --json | head -c 3000; "
                                    "journalctl -u nocloudlb-speaker -n 30 --no-pager"], check=False).stdout)
    sys.exit(1)


def check(cond: bool, msg: str) -> None:
    if not cond:
        fail(msg)


def vt(host: str, command: str) -> dict:
    out = lab.exec(host, ["vtysh", "-c", command], timeout=30).stdout
    return json.loads(out or "{}")


def hops(prefix: str, router: str = "r1") -> set[str]:
    return kernel_next_hops(lab.exec(router, ["ip", "-j", "route", "show", prefix], timeout=10).stdout, prefix)


def bird_protocols(router: str) -> dict[str, dict[str, str]]:
    """``birdc show protocols all``: protocol name -> its fields (state, Neighbor address, BGP state...)."""
    out, name, blocks = lab.exec(router, ["birdc", "show", "protocols", "all"], timeout=15).stdout, "", {}
    for line in out.splitlines():
        if line and not line[0].isspace() and len(line.split()) >= 4 and line.split()[1] == "BGP":
            name = line.split()[0]
            blocks[name] = {"state": line.split()[3]}
        elif name and ":" in line:
            k, _sep, v = line.strip().partition(":")
            blocks[name].setdefault(k.strip(), v.strip())
    return blocks


def established(router: str) -> set[str]:
    """The nodes' addresses with an Established session at ``router``."""
    if ROUTERS[router] == "bird":
        return {b.get("Neighbor address", "") for b in bird_protocols(router).values()
                if b.get("BGP state") == "Established"}
    peers = vt(router, "show bgp ipv4 unicast summary json").get("peers", {})
    return {a for a, p in peers.items() if p.get("state") == "Established"}


def communities(router: str, prefix: str) -> list[str]:
    """The community string of each path ``router`` holds for ``prefix``."""
    if ROUTERS[router] == "bird":
        out = lab.exec(router, ["birdc", "show", "route", "for", prefix, "all"], timeout=15).stdout
        return [ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.strip().startswith("BGP.community:")]
    return [p.get("community", {}).get("string", "") for p in vt(router, f"show bgp ipv4 unicast {prefix} json")
            .get("paths", [])]


def version(host: str, kind: str) -> str:
    if kind == "bird":
        r = lab.exec(host, ["bird", "--version"], check=False)
        return (r.stdout + r.stderr).strip().replace("BIRD version ", "BIRD ")
    first = lab.exec(host, ["vtysh", "-c", "show version"], timeout=15).stdout.strip().splitlines()[0]
    return "FRR " + first.split()[1] if first.startswith("FRRouting") else first


def timed_all(pred, timeout: float) -> dict[str, float | None]:
    """``pred(router)`` polled at every router at once: router -> seconds until it held (None: never)."""
    out: dict[str, float | None] = {}
    t0 = time.monotonic()

    def one(r: str) -> None:
        out[r] = time.monotonic() - t0 if wait_for(lambda: pred(r), timeout) else None

    threads = [threading.Thread(target=one, args=(r,)) for r in ROUTERS]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out


def all_back(what: str, timeout: float = 90) -> None:
    for r in ROUTERS:
        check(bool(wait_for(lambda r=r: hops(WEB, r) == ALL, timeout, 0.2)), f"{what}: {r} routes {WEB} via "
              f"{hops(WEB, r)}")


def fmt(times: dict[str, float | None]) -> str:
    return ", ".join(f"{r} {'never' if t is None else f'{t:.3f} s'}" for r, t in times.items())


def sessions() -> dict[str, dict]:
    return vt("r1", "show bgp ipv4 unicast summary json").get("peers", {})


def client(ip: str, n: int, every: float = 0.0) -> dict:
    return json.loads(lab.exec("c2", ["python3", "-c", CLIENT, ip, str(n), str(every), "/tmp/stop"],
                               timeout=120).stdout)


# 1. sessions and ECMP --------------------------------------------------------------------
check(bool(wait_for(lambda: all(sessions().get(a, {}).get("state") == "Established" for a in ALL), 90, 0.5)),
      f"sessions not Established from every node: {sessions()}")
print("BGP sessions Established from", sorted(ALL), flush=True)
check(bool(wait_for(lambda: hops(WEB) == ALL, 60, 0.2)), f"{WEB}: next hops {hops(WEB)}, want {ALL}")
route = vt("r1", f"show bgp ipv4 unicast {WEB}/32 json")
paths = route.get("paths", [])
check(len(paths) == 3 and sum(1 for p in paths if p.get("multipath") or p.get("bestpath")) == 3,
      f"{WEB}: paths {paths}")
comms = {p.get("community", {}).get("string") for p in paths}
check(comms == {"64512:100"}, f"{WEB}: communities {comms}")
print(f"BGP {WEB}/32 has 3 equal next hops {sorted(hops(WEB))}, community 64512:100 from every node", flush=True)
spread = client(WEB, 60)
check(not spread["failed"] and len(spread["seen"]) > 1, f"client flows: {spread}")
figures["spread"] = spread["seen"]
print(f"BGP client c2: 60 connections spread over {spread['seen']} (fib_multipath_hash_policy 1)", flush=True)

# 1b. the interop matrix: every router, every node's FRR --------------------------------------
matrix: dict[str, dict] = {r: {"router": version(r, k)} for r, k in ROUTERS.items()}
node_frr = {n: version(n, "frr") for n in NODES}
for r in ROUTERS:
    check(bool(wait_for(lambda r=r: established(r) == ALL, 90, 0.5)),
          f"{r} ({matrix[r]['router']}): sessions Established from {sorted(established(r))}, want {sorted(ALL)}")
    check(bool(wait_for(lambda r=r: hops(WEB, r) == ALL, 60, 0.2)), f"{r}: {WEB} via {hops(WEB, r)}, want {ALL}")
    comms = communities(r, f"{WEB}/32")
    check(len(comms) == 3 and set(comms) in ({"64512:100"}, {"(64512,100)"}), f"{r}: {WEB} communities {comms}")
    matrix[r].update(sessions=len(ALL), ecmp=len(hops(WEB, r)), community=comms[0])
    print(f"BGP matrix {r} ({matrix[r]['router']}): sessions from n1 ({node_frr['n1']}), n2 ({node_frr['n2']}) "
          f"and n3 ({node_frr['n3']}) Established; {WEB}/32 via 3 next hops in the kernel; community {comms[0]} "
          "on each path", flush=True)
# n3 runs Debian 13's FRR (10.3): its BGP starts only once BFD is up, which the routers' static
# BFD sessions (router_bfd_peers) make possible; every later step is timed for it and for n1 (FRR 8.4)
check(node_frr["n3"] != node_frr["n1"], f"n1 and n3 run the same FRR ({node_frr}): the matrix needs two releases")

# 2. aggregation refused by the router's /32-only filter ---------------------------------
adv = vt("n1", "show bgp ipv4 unicast neighbors 198.51.100.1 advertised-routes json")
check("203.0.113.64/30" in adv.get("advertisedRoutes", {}), f"n1 does not advertise 203.0.113.64/30: {adv}")
check(not hops("203.0.113.64/30") and not vt("r1", "show bgp ipv4 unicast 203.0.113.64/30 json").get("paths"),
      "r1 accepted the aggregated 203.0.113.64/30")
check(not hops(f"{AGG}/32"), f"r1 routes {AGG}")
print("BGP aggregationLength 30: n1 sends 203.0.113.64/30, r1's filter refuses it (no route)", flush=True)

# 3. Local policy -------------------------------------------------------------------------
check(bool(wait_for(lambda: hops(LOCAL) == ALL, 30, 0.2)), f"{LOCAL}: next hops {hops(LOCAL)}")
lab.exec("n1", ["systemctl", "stop", "lab-http@8082.service"])
t = timed(lambda: hops(LOCAL) == ALL - {NODES["n1"]}, 30)
check(t is not None, f"{LOCAL}: n1's check fails but next hops are {hops(LOCAL)}")
figures["local_check_fail_s"] = round(t or 0, 3)
lab.exec("n1", ["systemctl", "start", "lab-http@8082.service"])
check(bool(wait_for(lambda: hops(LOCAL) == ALL, 90, 0.2)), f"{LOCAL}: n1 healthy again, hops {hops(LOCAL)}")
print(f"BGP Local policy: n1's check failed -> its next hop gone after {t:.2f} s (check 0.5 s x fall 2); "
      "back when healthy", flush=True)


# 4. drain: next hop goes, session stays, no request lost ------------------------------------
def drain(node: str, while_drained=None) -> dict[str, float | None]:
    """Drain ``node`` by its label, time its next hop's removal at every router, run ``while_drained``,
    undrain and wait for the next hop back everywhere."""
    lab.exec(node, [CLI, "label", "set", f"{DRAIN}=true"])
    times = timed_all(lambda r: hops(WEB, r) == ALL - {NODES[node]}, 10)
    check(None not in times.values(), f"drain {node}: next hops gone at {fmt(times)}")
    if while_drained:
        while_drained()
    lab.exec(node, [CLI, "label", "unset", DRAIN])
    all_back(f"undrain {node}")  # additions: a reload
    for r, dt in times.items():
        matrix[r][f"drain_{node}_s"] = round(dt or 0, 3)
    return times


def session_kept() -> None:
    s = sessions()[NODES["n1"]]
    check(s["state"] == "Established" and s["connectionsEstablished"] == before, f"drain reset the session: {s}")
    time.sleep(1.0)


before = sessions()[NODES["n1"]]["connectionsEstablished"]
lab.exec("c2", ["rm", "-f", "/tmp/stop"])
poller = lab.popen_exec("c2", ["python3", "-c", CLIENT, WEB, "0", "0.05", "/tmp/stop"])
time.sleep(1.0)
drained = drain("n1", session_kept)
t = drained["r1"]
time.sleep(1.0)
lab.exec("c2", ["touch", "/tmp/stop"])
out, _err = poller.communicate(timeout=30)
polled = json.loads(out)
figures["drain_s"] = round(t or 0, 3)
figures["drain_requests"] = polled["total"]
figures["drain_failed"] = len(polled["failed"])
check(not polled["failed"], f"drain lost requests: {polled}")
print(f"BGP drain n1: next hop gone after {fmt(drained)}, session kept; {polled['total']} requests every 50 ms, "
      f"{len(polled['failed'])} failed; undrain brings it back", flush=True)
print(f"BGP drain n3 ({node_frr['n3']}): next hop gone after {fmt(drain('n3'))}", flush=True)

# 4b. drain.yml with router=r1 returns only once r1 no longer routes through the node -------------
BIN = os.path.dirname(sys.executable)
INVENTORY = ["-i", f"/var/lib/nocloudlb-lab/{LAB}/inventory.yml", "-i", f"{REPO}/molecule/bgp/inventory"]
DRAIN_PB = [f"{BIN}/ansible-playbook", *INVENTORY, f"{REPO}/playbooks/drain.yml", "-e", "target=n2", "-e", "router=r1"]
info = subprocess.run([f"{BIN}/ansible", "r1", *INVENTORY, "-m", "nocloud.loadbalancer.bgp_route_info",
                       "-a", f"source=frr prefixes={WEB} next_hop={NODES['n2']}"],
                      capture_output=True, check=False, text=True, timeout=120,
                      env=dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
                               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
try:  # the JSON document; a timing callback enabled by the caller's environment may print after it
    answer = json.JSONDecoder().raw_decode(info.stdout[info.stdout.index("{"):])[0]
    answer = answer["plays"][0]["tasks"][0]["hosts"]["r1"]
except (ValueError, KeyError, IndexError):
    answer = {}
check(answer.get("routes") == {f"{WEB}/32": sorted(ALL)} and answer.get("through_next_hop") == [f"{WEB}/32"],
      f"bgp_route_info source=frr on r1: {info.stdout[-2000:]} {info.stderr[-2000:]}")
print(f"BGP bgp_route_info (FRR's zebra on r1) agrees with r1's kernel: {WEB}/32 via {sorted(ALL)}", flush=True)
lab.exec("c2", ["rm", "-f", "/tmp/stop"])
poller = lab.popen_exec("c2", ["python3", "-c", CLIENT, WEB, "0", "0.05", "/tmp/stop"])
time.sleep(1.0)
t0 = time.monotonic()
run = subprocess.run(DRAIN_PB, capture_output=True, check=False, text=True, timeout=180)
took = time.monotonic() - t0
right_after = hops(WEB)
check(run.returncode == 0, f"drain.yml -e router=r1 failed: {run.stdout[-3000:]} {run.stderr[-2000:]}")
check(NODES["n2"] not in right_after and right_after, f"drain.yml returned while r1 routes {WEB} via {right_after}")
run = subprocess.run(DRAIN_PB + ["-e", "state=undrained"], capture_output=True, check=False, text=True, timeout=180)
check(run.returncode == 0, f"drain.yml state=undrained failed: {run.stdout[-3000:]} {run.stderr[-2000:]}")
check(bool(wait_for(lambda: hops(WEB) == ALL, 90, 0.2)), f"undrain n2: next hops {hops(WEB)}")
time.sleep(1.0)
lab.exec("c2", ["touch", "/tmp/stop"])
out, _err = poller.communicate(timeout=30)
polled = json.loads(out)
figures["drain_playbook_s"] = round(took, 1)
figures["drain_playbook_failed"] = len(polled["failed"])
check(not polled["failed"], f"drain.yml lost requests: {polled}")
print(f"BGP drain.yml -e router=r1 on n2: returned after {took:.1f} s with r1 routing {WEB} via "
      f"{sorted(right_after)} only; {polled['total']} requests every 50 ms, {len(polled['failed'])} failed",
      flush=True)

# 4c. point 8: long-lived connections across a drain (the router rehashes its ECMP flows) ------------
FLOWS = open(f"{REPO}/molecule/bgp/files/flows.py", encoding="utf-8").read()
ECHO_PORT, N_CONN = 8090, 90
MACS = {n: json.loads(lab.exec(n, ["ip", "-j", "link", "show", "eth0"]).stdout)[0]["address"] for n in NODES}
for n in NODES:
    lab.exec(n, ["systemd-run", "--unit", "lab-echo", "--collect", "python3", "-c", FLOWS, "server", str(ECHO_PORT)],
             check=False)


def drain_with_flows(node: str) -> dict:
    """Drain ``node`` and undrain it while N_CONN long-lived connections are held (both rehash)."""
    lab.exec("c2", ["rm", "-f", "/tmp/stop-flows"])
    proc = lab.popen_exec("c2", ["python3", "-c", FLOWS, "client", WEB, str(ECHO_PORT), str(N_CONN), "/tmp/stop-flows"])
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline() or "{}").get("ready")
    check(bool(ready) and len(ready) == 3, f"long-lived connections not spread over the 3 nodes: {ready}")
    time.sleep(1.0)
    lab.exec(node, [CLI, "label", "set", f"{DRAIN}=true"])
    check(bool(wait_for(lambda: hops(WEB) == ALL - {NODES[node]}, 10)), f"drain {node}: hops {hops(WEB)}")
    time.sleep(3.0)
    undrained_at = time.time()  # c2 shares this machine's clock
    lab.exec(node, [CLI, "label", "unset", DRAIN])
    check(bool(wait_for(lambda: hops(WEB) == ALL, 90, 0.2)), f"undrain {node}: next hops {hops(WEB)}")
    time.sleep(2.0)
    lab.exec("c2", ["touch", "/tmp/stop-flows"])
    out, _err = proc.communicate(timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    nodes = result["nodes"]
    return {"drained": nodes[node], "staying": {
        "connections": sum(v["connections"] for k, v in nodes.items() if k != node),
        "broken": sum(v["broken"] for k, v in nodes.items() if k != node)},
        "broken_after_undrain": sum(1 for e in result["errors"] if e["t"] >= undrained_at), "rounds": result["rounds"]}


for n in NODES:  # each speaker hands unknown mid-stream segments to the two others (bgp/flows.py)
    check(bool(wait_for(lambda n=n: lab.exec(n, ["nft", "list", "table", "ip", "nocloudlb_bgp_flows"],
                                             check=False).returncode == 0, 30, 0.5)),
          f"{n}: no flow-handover table: {lab.exec(n, [CLI, 'status', '--json'], check=False).stdout[-1500:]}")
handed = drain_with_flows("n1")
figures["flows_handover"] = handed
print(f"BGP point 8, drain and undrain n1 with {N_CONN} long-lived connections, the speakers' flow handover: "
      f"drained node {handed['drained']['broken']}/{handed['drained']['connections']} broken, staying nodes "
      f"{handed['staying']['broken']}/{handed['staying']['connections']} broken", flush=True)
OFF = "nocloud.io/bgp-flow-handover"
for n in NODES:  # the same without it: the node label turns it off
    lab.exec(n, [CLI, "label", "set", f"{OFF}=off"])
for n in NODES:
    check(bool(wait_for(lambda n=n: lab.exec(n, ["nft", "list", "table", "ip", "nocloudlb_bgp_flows"],
                                             check=False).returncode != 0, 30, 0.5)), f"{n}: handover still on")
plain = drain_with_flows("n1")
for n in NODES:
    lab.exec(n, [CLI, "label", "unset", OFF])
figures["flows_plain"] = plain
print(f"BGP point 8, the same with plain ECMP (handover off by label): drained node "
      f"{plain['drained']['broken']}/{plain['drained']['connections']} broken, staying nodes "
      f"{plain['staying']['broken']}/{plain['staying']['connections']} broken "
      f"({plain['broken_after_undrain']} of them at the undrain)", flush=True)
# the goal: no connection broken, on the drained node or on the others, by the drain or the undrain
check(handed["drained"]["broken"] == 0 and handed["staying"]["broken"] == 0,
      f"the flow handover let connections break on a drain: {handed}")
check(plain["drained"]["broken"] > 0, f"plain ECMP kept every connection of the drained node: {plain} "
      "(then this check proves nothing)")


# 5. freeze a node (BFD 100 ms x 3) ------------------------------------------------------------
def freeze_node(node: str) -> dict[str, float | None]:
    fault = lab.fault_freeze(node)
    times = timed_all(lambda r: NODES[node] not in hops(WEB, r), 15)
    lab.undo(fault["id"])
    check(None not in times.values(), f"freeze {node}: next hop gone at {fmt(times)}")
    check(max(t or 0 for t in times.values()) < 3.0, f"freeze {node}: next hop gone at {fmt(times)} (BFD 100 ms x 3)")
    all_back(f"{node} thawed")
    for r, dt in times.items():
        matrix[r][f"freeze_{node}_s"] = round(dt or 0, 3)
    return times


times = freeze_node("n3")
t = times["r1"]
figures["freeze_node_s"] = round(t or 0, 3)
print(f"BGP freeze n3 ({node_frr['n3']}): next hop gone after {fmt(times)} (BFD 100 ms x 3; wide margin 3 s)",
      flush=True)
print(f"BGP freeze n1 ({node_frr['n1']}): next hop gone after {fmt(freeze_node('n1'))}", flush=True)


# 6. freeze bgpd alone: the speaker's watch blocks BFD ------------------------------------------
def freeze_bgpd(node: str) -> dict[str, float | None]:
    bgpd = lab.exec(node, ["cat", "/run/frr/bgpd.pid"]).stdout.strip()
    lab.exec(node, ["kill", "-STOP", bgpd])
    times = timed_all(lambda r: NODES[node] not in hops(WEB, r), 15)
    lab.exec(node, ["kill", "-CONT", bgpd])
    check(None not in times.values(), f"bgpd frozen on {node}: next hop gone at {fmt(times)}")
    check(max(t or 0 for t in times.values()) < 4.0, f"bgpd frozen on {node}: next hop gone at {fmt(times)} "
          "(hold time 9 s)")
    all_back(f"bgpd thawed on {node}")
    for r, dt in times.items():
        matrix[r][f"freeze_bgpd_{node}_s"] = round(dt or 0, 3)
    return times


times = freeze_bgpd("n2")
figures["freeze_bgpd_s"] = round(times["r1"] or 0, 3)
print(f"BGP bgpd frozen on n2 ({node_frr['n2']}): next hop gone after {fmt(times)} (hold time 9 s; wide margin "
      "4 s)", flush=True)
print(f"BGP bgpd frozen on n3 ({node_frr['n3']}): next hop gone after {fmt(freeze_bgpd('n3'))}", flush=True)


# 7. a speaker that stops cleanly withdraws before it exits (seen at every router) -----------------------
def clean_stop(node: str) -> float:
    t0 = time.monotonic()
    lab.exec(node, ["systemctl", "stop", "nocloudlb-speaker.service"], timeout=60)
    took = time.monotonic() - t0
    after_stop = {r: hops(WEB, r) for r in ROUTERS}
    lab.exec(node, ["systemctl", "start", "nocloudlb-speaker.service"], timeout=60)
    still = [r for r, h in after_stop.items() if NODES[node] in h]
    check(not still, f"stopped speaker on {node}: {still} still route through it ({after_stop})")
    all_back(f"{node} restarted")
    for r in ROUTERS:
        matrix[r][f"stop_{node}"] = "gone"
    return took


for node in ("n1", "n3"):
    took = clean_stop(node)
    print(f"BGP clean stop of {node}'s speaker ({node_frr[node]}): its next hop was gone at r1, r2 and r3 when "
          f"systemctl stop returned ({took:.2f} s)", flush=True)


# 8. restarts keep the routes; a kill withdraws (issue 22 part 4, bgp/hold.py) ------------------------
def watch_hops(stop: threading.Event) -> tuple[list[threading.Thread], dict[str, dict]]:
    """Read every router's FIB for WEB until ``stop``: samples, and those missing a node's next hop."""
    seen: dict[str, dict] = {r: {"samples": 0, "short": 0, "missing": []} for r in ROUTERS}

    def one(r: str) -> None:
        while not stop.is_set():
            h = hops(WEB, r)
            seen[r]["samples"] += 1
            if h != ALL:
                seen[r]["short"] += 1
                seen[r]["missing"] = (seen[r]["missing"] + [sorted(ALL - h)])[:5]
            time.sleep(0.02)

    threads = [threading.Thread(target=one, args=(r,)) for r in ROUTERS]
    for th in threads:
        th.start()
    return threads, seen


def watched(argv: list[str], what: str) -> tuple[float, dict[str, dict], dict]:
    """Run ``argv`` (an ansible-playbook) while every router's FIB is sampled and c2 GETs WEB every 50 ms."""
    lab.exec("c2", ["rm", "-f", "/tmp/stop"])
    poller = lab.popen_exec("c2", ["python3", "-c", CLIENT, WEB, "0", "0.05", "/tmp/stop"])
    stop = threading.Event()
    watchers, seen = watch_hops(stop)
    time.sleep(1.0)
    t0, since = time.monotonic(), int(time.time())
    run = subprocess.run(argv, capture_output=True, check=False, text=True, timeout=900)
    took = time.monotonic() - t0
    time.sleep(1.0)
    stop.set()
    for th in watchers:
        th.join()
    lab.exec("c2", ["touch", "/tmp/stop"])
    out, _err = poller.communicate(timeout=30)
    polled = json.loads(out)
    check(run.returncode == 0, f"{what} failed: {run.stdout[-3000:]} {run.stderr[-2000:]}")
    journal = ["journalctl", "-u", "nocloudlb-speaker.service", "--since", f"@{since}", "-o", "cat"]
    kept = sum("bgpRoutesKept" in lab.exec(n, journal).stdout for n in NODES)
    check(kept == len(NODES), f"{what}: {kept} of {len(NODES)} speakers logged bgpRoutesKept")
    for r, w in seen.items():
        check(w["samples"] > 50 and w["short"] == 0, f"{what}: {r} lost a next hop of {WEB}: {w}")
    check(not polled["failed"] and polled["total"] > 100, f"{what} lost requests: {polled}")
    figures[what] = {"seconds": round(took, 1), "requests": polled["total"], "failed": len(polled["failed"]),
                     "fib_samples": {r: w["samples"] for r, w in seen.items()},
                     "fib_samples_short": {r: w["short"] for r, w in seen.items()}}
    return took, seen, polled


def samples(seen: dict[str, dict]) -> str:
    return ", ".join(f"{r} {w['short']} of {w['samples']}" for r, w in seen.items())


took, seen, polled = watched([f"{BIN}/ansible-playbook", *INVENTORY, f"{REPO}/playbooks/rolling_restart.yml",
                              "-e", "nocloudlb_hosts=nodes"], "rolling_restart")
for r, w in seen.items():
    matrix[r]["rolling_restart_samples_short"] = f"{w['short']}/{w['samples']}"
print(f"BGP rolling_restart.yml ({took:.1f} s, {len(NODES)} speakers restarted, none drained): FIB samples without "
      f"one of the 3 next hops of {WEB}: {samples(seen)}; {polled['total']} requests every 50 ms, "
      f"{len(polled['failed'])} failed", flush=True)

# 8b. a rolling upgrade: site.yml from a source whose version is bumped; the speaker role's handler
# restarts one node at a time (throttle 1), each speaker leaving its routes to the new one
with open(f"{REPO}/speaker/nocloudlb/__init__.py", encoding="utf-8") as fh:
    CURRENT = fh.read().split('__version__ = "', 1)[1].split('"', 1)[0]
UPGRADE = f"{CURRENT}.post1"  # PEP 440: after CURRENT
src = "/tmp/nocloudlb-upgrade-src"
subprocess.run(["rm", "-rf", src], check=True)
os.makedirs(src)
for part in ("pyproject.toml", "README.md", "speaker", "plugins"):
    subprocess.run(["cp", "-a", f"{REPO}/{part}", src], check=True)
BUMPS = ((f"{src}/pyproject.toml", 'version = "{}"'), (f"{src}/speaker/nocloudlb/__init__.py", '__version__ = "{}"'))
for path, line in BUMPS:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    check(line.format(CURRENT) in text, f"{path} does not say {line.format(CURRENT)}")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text.replace(line.format(CURRENT), line.format(UPGRADE), 1))
took, seen, polled = watched([f"{BIN}/ansible-playbook", *INVENTORY, f"{REPO}/playbooks/site.yml", "--limit", "nodes",
                              "-e", f"nocloudlb_source_dir={src}"], "rolling_upgrade")
versions = {n: json.loads(lab.exec(n, [CLI, "status", "-o", "json"]).stdout).get("version") for n in NODES}
check(set(versions.values()) == {UPGRADE}, f"site.yml from {src}: the speakers run {versions}, want {UPGRADE}")
for r, w in seen.items():
    matrix[r]["rolling_upgrade_samples_short"] = f"{w['short']}/{w['samples']}"
print(f"BGP rolling upgrade (site.yml, {took:.1f} s, every speaker now {UPGRADE}): FIB samples without one of the 3 "
      f"next hops of {WEB}: {samples(seen)}; {polled['total']} requests every 50 ms, {len(polled['failed'])} failed",
      flush=True)


def kill_speaker(node: str) -> dict[str, float | None]:
    """kill -9 of the speaker alone: the unit's ExecStopPost (bgp-guard) withdraws, systemd restarts it."""
    lab.exec(node, ["sh", "-c", "kill -9 $(systemctl show -p MainPID --value nocloudlb-speaker.service)"])
    times = timed_all(lambda r: NODES[node] not in hops(WEB, r), 15)
    check(None not in times.values(), f"kill -9 of {node}'s speaker: next hop gone at {fmt(times)}")
    all_back(f"{node}'s speaker restarted by systemd")
    for r, dt in times.items():
        matrix[r][f"kill_speaker_{node}_s"] = round(dt or 0, 3)
    return times


for node in ("n1", "n3"):
    print(f"BGP kill -9 of {node}'s speaker ({node_frr[node]}): next hop gone after {fmt(kill_speaker(node))} "
          "(ExecStopPost bgp-guard); back once systemd restarted it", flush=True)

print("BGP-MATRIX " + json.dumps({"nodes": node_frr, "routers": matrix}), flush=True)

print("BGP-FIGURES " + json.dumps(figures), flush=True)
