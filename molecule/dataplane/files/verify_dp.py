"""Verify the data-plane scenario on the lab: client traffic, the servers' view, captures.

Claims (each one exits 1 with the evidence when it does not hold):
  spread      20 fresh connections per VIP reach both real servers of its method
  signature   NAT: the server sees the client and its replies arrive at the director;
              full-NAT: the server sees the snat address (the VIP) or the director's own;
              DR: replies on the lan carry a real server's source MAC and none leaves the director
  drain       a real server whose service stops is out of the director's table within
              fall x interval (+ margin) and gets no new connection
  failover    the VIPs' leader freezes; the other director takes over; new connections work;
              established ones: NAT, full-NAT with snatAddress = VIP, DR (Maglev) go on to the
              same server; full-NAT with masquerade breaks (reported, not required)
Prints one JSON document with the figures. Usage: verify_dp.py --lab dp
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "roles" / "lab" / "files"))
import labctl  # noqa: E402

CLIENT = "192.0.2.10"
VIPS = {"nat": "198.51.100.201", "fullnat": "198.51.100.202", "fullnat-masq": "198.51.100.204",
        "dr": "198.51.100.203"}
SERVERS = {"nat": ("s1", "s2"), "fullnat": ("s3", "s4"), "fullnat-masq": ("s3", "s4"), "dr": ("s5", "s6")}
NLB = "/opt/nocloudlb/venv/bin/nocloudlb"

CLIENT_CODE = r"""
import json, socket, sys
vip, n = sys.argv[1], int(sys.argv[2])
out = []
for i in range(n):
    try:
        s = socket.create_connection((vip, 8080), timeout=3)
        s.sendall(b"hi\n")
        out.append(s.recv(100).decode().strip())
        s.close()
    except OSError as exc:
        out.append("error " + type(exc).__name__)
print(json.dumps(out))
"""

HOLD_CODE = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], 8080), timeout=5)
s.sendall(b"HOLD\n")
print(s.recv(100).decode().split()[0], flush=True)
for line in sys.stdin:
    try:
        s.sendall(b"more\n")
        print((s.recv(100).decode().split() or ["closed"])[0], flush=True)
    except OSError as exc:
        print("error-" + type(exc).__name__, flush=True)
"""

failures: list[str] = []
report: dict = {}


def claim(ok: bool, what: str, evidence: object) -> None:
    if not ok:
        failures.append(f"{what}: {evidence}")


def status(lab, node: str) -> dict:
    out = lab.exec(node, [NLB, "status", "--json"], check=False, timeout=20)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {}


def table(st: dict, vip: str) -> set[str]:
    for svc in st.get("modes", {}).get("dataplane", {}).get("services", {}).values():
        for r in svc.get("rules", []):
            if r["vip"] == vip:
                return {b["backend"].split(":")[0] for b in r["backends"] if b["inTable"]}
    return set()


def wait(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


def requests(lab, vip: str, n: int = 20) -> list[str]:
    out = lab.exec("c2", ["python3", "-c", CLIENT_CODE, vip, str(n)], timeout=120).stdout
    return json.loads(out.strip().splitlines()[-1])


def mac(lab, host: str) -> str:
    return json.loads(lab.exec(host, ["ip", "-j", "link", "show", "eth0"]).stdout)[0]["address"]


def addr(host: str) -> str:
    return {"s1": "198.51.100.31", "s2": "198.51.100.32", "s3": "198.51.100.33", "s4": "198.51.100.34",
            "s5": "198.51.100.35", "s6": "198.51.100.36"}[host]


def capture(lab, host: str, expr: str, direction: str = "inout"):
    """tcpdump in ``host``; its PID there (first line) lets ``stop`` end it (ending nsenter would not)."""
    proc = lab.popen_exec(host, ["sh", "-c", 'echo $$; exec timeout 300 tcpdump -i eth0 -e -nn -l -Q "$1" "$2"',
                                 "sh", direction, expr], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return lab, host, proc, proc.stdout.readline().strip()


def stop(cap) -> str:
    lab, host, proc, pid = cap
    time.sleep(0.5)
    lab.exec(host, ["kill", pid], check=False)
    try:
        out = proc.communicate(timeout=10)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.communicate()[0]
    return out or ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lab", default="dp")
    args = ap.parse_args()
    lab = labctl.Lab(args.lab)
    directors = ["n1", "n2"]

    # every director programmed for every VIP (not only the leader)
    for d in directors:
        wait(lambda d=d: all(len(table(status(lab, d), v)) == 2 for v in VIPS.values()), 60,
             f"{d} programs both servers of every VIP")
    leaders = {v["ip"]: v["leader"] for v in status(lab, "n1")["vips"]}
    report["leaders"] = leaders
    leader = leaders[VIPS["dr"]]
    other = next(d for d in directors if d != leader)
    claim(all(leaders[v] == leader for v in VIPS.values()), "one leader for every VIP", leaders)

    # spread and each method's signature
    caps = {"nat": capture(lab, leader, f"tcp and src port 8080 and dst host {CLIENT}", "in"),
            "dr-router": capture(lab, "r1", f"tcp and src host {VIPS['dr']}", "in"),
            "dr-director": capture(lab, leader, f"tcp and src host {VIPS['dr']}")}
    time.sleep(1.5)
    spread = {}
    for method, vip in VIPS.items():
        answers = requests(lab, vip)
        names = sorted({a.split()[0] for a in answers})
        peers = sorted({a.split()[1] for a in answers if len(a.split()) > 1})
        spread[method] = {"servers": {n: sum(1 for a in answers if a.split()[0] == n) for n in names},
                          "peers": peers}
        claim(names == list(SERVERS[method]), f"{method}: spread over both servers", answers)
        want = {"nat": [CLIENT], "dr": [CLIENT], "fullnat": [VIPS["fullnat"]]}.get(method)
        if method == "fullnat-masq":
            claim(set(peers) <= {"198.51.100.11", "198.51.100.12"} and peers, f"{method}: server sees a director",
                  peers)
        else:
            claim(peers == want, f"{method}: address the server sees", peers)
    report["spread"] = spread
    nat_lines = [ln for ln in stop(caps["nat"]).splitlines() if "> 192.0.2.10." in ln]
    claim(any(addr("s1") + ".8080" in ln or addr("s2") + ".8080" in ln for ln in nat_lines),
          "nat: the servers' replies arrive at the director", nat_lines[:3])
    server_macs = {mac(lab, "s5"): "s5", mac(lab, "s6"): "s6"}
    dr_lines = stop(caps["dr-router"]).splitlines()
    dr_src = sorted({ln.split()[1] for ln in dr_lines if len(ln.split()) > 1})
    claim(bool(dr_src) and set(dr_src) <= set(server_macs), "dr: replies' source MAC is a real server's",
          {"seen": dr_src, "servers": server_macs})
    director_lines = stop(caps["dr-director"]).strip()
    claim(director_lines == "", "dr: no reply passes the director", director_lines[:300])
    report["signature"] = {"nat_replies_at_director": len(nat_lines), "dr_reply_source_macs": dr_src,
                           "dr_replies_through_director": len(director_lines.splitlines())}

    # drain: stop s1's service (the NAT VIP), time until the leader's table drops it
    t0 = time.monotonic()
    lab.exec("s1", ["systemctl", "stop", "dp-server.service"])
    wait(lambda: table(status(lab, leader), VIPS["nat"]) == {addr("s2")}, 20, "s1 drained")
    drained = time.monotonic() - t0
    report["drain_seconds"] = round(drained, 2)
    claim(drained < 0.5 * 2 + 0.4 + 4.0, "drain within fall x interval + timeout (+4 s margin)", drained)
    after = requests(lab, VIPS["nat"], 10)
    claim(all(a.startswith("s2 ") for a in after), "no new connection to the failed server", after)
    lab.exec("s1", ["systemctl", "start", "dp-server.service"])
    wait(lambda: len(table(status(lab, leader), VIPS["nat"])) == 2, 20, "s1 back (rise)")

    # failover: connections held through the leader, then the leader freezes
    held = {}
    for method, vip in VIPS.items():
        held[method] = []
        for _conn in range(4):
            p = lab.popen_exec("c2", ["python3", "-u", "-c", HOLD_CODE, vip], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            held[method].append((p, p.stdout.readline().strip()))
    fault = lab.fault_freeze(leader, silent=True)
    t0 = time.monotonic()
    try:
        wait(lambda: all(any(v["ip"] == ip and v["announcing"] for v in status(lab, other)["vips"])
                         for ip in VIPS.values()), 30, f"{other} takes every VIP over")
        report["takeover_seconds"] = round(time.monotonic() - t0, 2)
        time.sleep(1.0)
        kept = {}
        for method, conns in held.items():
            results = []
            for p, first in conns:
                p.stdin.write("x\n")
                p.stdin.flush()
                results.append((first, p.stdout.readline().strip()))
            kept[method] = sum(1 for a, b in results if a == b)
            if method != "fullnat-masq":
                claim(kept[method] == len(conns), f"{method}: established connections survive the failover",
                      results)
        report["established_kept_of_4"] = kept
        st_other = status(lab, other)
        report["tables_after_failover"] = {m: sorted(table(st_other, v)) for m, v in VIPS.items()}
        new = {m: requests(lab, v, 20) for m, v in VIPS.items()}
        for m, answers in new.items():
            claim(sorted({a.split()[0] for a in answers}) == list(SERVERS[m]),
                  f"{m}: new connections after the failover (table of {other}: "
                  f"{report['tables_after_failover'][m]})", answers)
    finally:
        for conns in held.values():
            for p, _first in conns:
                p.kill()
                p.wait()
        lab.undo(fault["id"])
    print(json.dumps(report, indent=1, sort_keys=True))
    for f in failures:
        print("FAILED " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
