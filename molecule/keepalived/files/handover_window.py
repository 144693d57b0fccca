"""Count, on packets, what a keepalived VIP handover loses while a command runs (drain/undrain cycles).

While CMD runs, the client sends to each VIP an ICMP echo every --ping-interval s (ping) and opens a TCP
connection every 10 ms with one HTTP GET on it; every node counts, in nftables' prerouting, the
packets for a VIP that reach it while the VIP is not local there (``fib daddr type != local``):
packets a client still sent to that node's MAC after the node dropped the VIP, which its kernel
drops (the nodes do not forward). Neighbour discovery is not counted (the kernel answers it only
for addresses on the asking interface). Reports one JSON object:
  command_rc      CMD's exit status
  icmp            per VIP: sent, answered, lost (sequence numbers never answered, up to the last
                  answer) and lost_near: the move of the VIP nearest to each lost echo
  tcp             connections, failed (refused, reset, no answer within 3 s), slow (> 0.5 s: a SYN
                  or the request retransmitted), and each failure or slow one (seconds from start)
  not_local       per node: packets for a VIP that reached it while the VIP was not local there
  moves           [seconds, VIP, node] for each gratuitous ARP / unsolicited NA from a new node
Usage: handover_window.py --lab kad --vip IP [--vip IP6] --port 8080 --nodes n1,n2,n3 --command CMD
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

LABCTL = Path(__file__).resolve().parents[3] / "roles" / "lab" / "files" / "labctl.py"
TABLE = "kad_window"

CLIENT = r"""
import json, os, re, signal, socket, subprocess, sys, threading, time
vips, port, stop, interval = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
t0 = time.time()
# ping writes a line per answer: to a file, not a pipe nobody reads until the end (it would block)
logs = {v: open(f"{stop}.ping-{i}", "w+") for i, v in enumerate(vips)}
pings = {v: subprocess.Popen(["ping", "-n", "-D", "-i", interval, "-W", "1", v], stdout=logs[v],
                             stderr=subprocess.STDOUT) for v in vips}
results, lock = [], threading.Lock()

def get(vip, start):
    try:
        with socket.create_connection((vip, port), timeout=3) as s:
            s.settimeout(3)
            s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        ok = data.startswith(b"HTTP/1.0 200")
        err = "" if ok else data[:40].decode("latin-1")
    except Exception as exc:
        ok, err = False, f"{type(exc).__name__}: {exc}"[:120]
    with lock:
        results.append({"vip": vip, "t": round(start - t0, 3), "s": round(time.time() - start, 3),
                        "ok": ok, "err": err})

threads = []
while not os.path.exists(stop):
    for v in vips:
        th = threading.Thread(target=get, args=(v, time.time()), daemon=True)
        th.start()
        threads.append(th)
    time.sleep(0.01)
for th in threads:
    th.join(timeout=5)
icmp = {}
for v, p in pings.items():
    p.send_signal(signal.SIGINT)
    p.wait(timeout=10)
    logs[v].seek(0)
    out = logs[v].read()
    logs[v].close()
    os.unlink(logs[v].name)
    # icmp_seq is 16 bits: unwrap it; what was never answered between the first and the last answer is lost
    # (-D: each answer's time; a lost echo is placed at the time of the answer before it)
    seqs, base, prev, when = set(), 0, None, {}
    for ts, m in re.findall(r"\[([0-9.]+)\].*?icmp_seq=(\d+)", out):
        n = int(m)
        if prev is not None and n < prev - 32768:
            base += 65536
        prev = n
        seqs.add(base + n)
        when[base + n] = float(ts)
    sent = re.search(r"(\d+) packets transmitted", out)
    lost = sorted(set(range(min(seqs), max(seqs) + 1)) - seqs) if seqs else []
    lost_t = []
    for n in lost[:50]:
        k = n - 1
        while k not in when:
            k -= 1
        lost_t.append(round(when[k] - t0, 4))
    icmp[v] = {"sent": int(sent.group(1)) if sent else None, "answered": len(seqs), "lost": len(lost),
               "lost_at": lost_t}
bad = [r for r in results if not r["ok"] or r["s"] > 0.5]
print(json.dumps({"t0": t0, "icmp": icmp, "tcp": {"connections": len(results), "bad": bad}}))
"""


def labctl(lab: str, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(LABCTL), args[0], "-n", lab, *args[1:]], capture_output=True,
                          text=True, timeout=120, check=False, **kw)
    if check and proc.returncode != 0:
        raise SystemExit(f"labctl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def nft_table(vips: list[str], node: str) -> str:
    v4 = [v for v in vips if ":" not in v]
    v6 = [v for v in vips if ":" in v]
    lines = [f"table inet {TABLE} {{", "  chain pre {", "    type filter hook prerouting priority -150; policy accept;",
             "    icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept"]
    if v4:
        lines.append(f"    ip daddr {{ {', '.join(v4)} }} fib daddr type != local counter"
                     f' limit rate 50/second log prefix "{TABLE} {node}: "')
    if v6:
        lines.append(f"    ip6 daddr {{ {', '.join(v6)} }} fib daddr type != local counter"
                     f' limit rate 50/second log prefix "{TABLE} {node}: "')
    return "\n".join(lines + ["  }", "}"]) + "\n"


def announcements(events: list[dict], vips: list[str], t0: float, host_of_mac: dict[str, str]) -> list:
    """[seconds after t0, VIP, node] for the first gratuitous ARP / unsolicited NA of each burst."""
    moves: list = []
    last: dict[str, tuple[float, str]] = {}
    for e in events:
        if e["kind"] == "arp" and e["gratuitous"] and e["sender_ip"] in vips:
            vip, mac = e["sender_ip"], e["sender_mac"]
        elif e["kind"] == "ndp" and e.get("type") == "na" and e.get("target") in vips \
                and not e.get("flags", {}).get("solicited"):
            vip, mac = e["target"], e.get("lladdr") or e.get("src_mac") or ""
        else:
            continue
        node = host_of_mac.get(mac.lower(), mac)
        prev = last.get(vip)
        if prev is None or prev[1] != node:
            moves.append([round(e["t"] - t0, 4), vip, node])
        last[vip] = (e["t"], node)
    return moves


def nearest(moves: list, vip: str, t: float, before: float = 1.0, after: float = 1.0) -> list | None:
    """The move of the VIP nearest to t, [seconds, VIP, node it moved to], if t is at most `before` s
    before it or `after` s after it; else None (a SYN lost to the lab's web server's accept queue, far
    from any move, is no handover's)."""
    near = min((m for m in moves if m[1] == vip and -after <= m[0] - t <= before),
               key=lambda m: abs(m[0] - t), default=None)
    return near


# A connection can lose its SYN to a move only if it began just before the move (the old owner drops
# the VIP when the new one's advert arrives, a few ms before its gratuitous ARP, which is when a move is
# timed here) or after it (until the client has read that ARP). A slow connection that began 0.7 s
# before the move lost its first SYN to something else (seen in a loaded run: 4 such, and 16 more a
# second earlier with no move near).
SYN_BEFORE_MOVE = 0.1
SYN_AFTER_MOVE = 1.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lab", required=True)
    ap.add_argument("--vip", action="append", required=True)
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--client", default="c1")
    ap.add_argument("--segment", default="lan")
    ap.add_argument("--ping-interval", type=float, default=0.0005, help="seconds between echo requests per VIP")
    ap.add_argument("--nodes", required=True, help="comma-separated nodes whose not-local packets are counted")
    ap.add_argument("--command", required=True)
    a = ap.parse_args()
    nodes = a.nodes.split(",")
    for node in nodes:
        labctl(a.lab, "exec", node, "--", "sh", "-c", f"nft delete table inet {TABLE} 2>/dev/null; true")
        labctl(a.lab, "exec", node, "--", "nft", "-f", "-", input=nft_table(a.vip, node))
    inv = json.loads(Path(labctl(a.lab, "inventory").stdout.strip()).read_text())["all"]
    host_of_mac = {inv["hosts"][h]["lab_interfaces"][0]["mac"].lower(): h for h in nodes}
    capture = json.loads(labctl(a.lab, "capture", "start", a.segment, "--filter",
                                "arp or (icmp6 and ip6[40] == 136)").stdout)
    stop = f"/tmp/kad-window-stop-{int(time.time() * 1000)}"
    client = subprocess.Popen([sys.executable, str(LABCTL), "exec", "-n", a.lab, a.client, "--", "python3", "-c",
                               CLIENT, json.dumps(a.vip), str(a.port), stop, str(a.ping_interval)],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    try:
        rc = subprocess.run(a.command, shell=True, check=False, stdout=sys.stderr, stderr=sys.stderr).returncode
        time.sleep(1.0)
    finally:
        labctl(a.lab, "exec", a.client, "--", "touch", stop, check=False)
        out = client.communicate(timeout=60)[0]
        labctl(a.lab, "exec", a.client, "--", "rm", "-f", stop, check=False)
    labctl(a.lab, "capture", "stop", capture["name"], check=False)
    events = json.loads(labctl(a.lab, "capture", "read", capture["pcap"], "--kinds", "arp,ndp").stdout)
    Path(capture["pcap"]).unlink(missing_ok=True)
    not_local = {}
    for node in nodes:
        listing = labctl(a.lab, "exec", node, "--", "nft", "list", "table", "inet", TABLE, check=False).stdout
        not_local[node] = sum(int(n) for n in re.findall(r"counter packets (\d+)", listing))
        labctl(a.lab, "exec", node, "--", "nft", "delete", "table", "inet", TABLE, check=False)
    empty = {"icmp": {}, "tcp": {"connections": 0, "bad": []}}
    probe = json.loads(out.strip().splitlines()[-1]) if out.strip() else empty
    bad = probe["tcp"]["bad"]
    moves = announcements(events, a.vip, probe.get("t0", 0.0), host_of_mac)
    for b in bad:  # the move nearest to each bad connection
        b["near_move"] = nearest(moves, b["vip"], b["t"], SYN_BEFORE_MOVE, SYN_AFTER_MOVE)
    for vip, res in probe["icmp"].items():  # and to each lost echo
        res["lost_near"] = [nearest(moves, vip, t) for t in res.pop("lost_at", [])]
    print(json.dumps({
        "command_rc": rc,
        "icmp": probe["icmp"],
        "tcp": {"connections": probe["tcp"]["connections"], "failed": sum(1 for r in bad if not r["ok"]),
                "slow": sum(1 for r in bad if r["ok"]), "bad": bad[:40]},
        "not_local": not_local,
        "moves": moves,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
