"""Measure a migration on the lab: run a command (the migration playbooks) while a client polls
http://VIP:PORT/ every 50 ms and the segment's ARP traffic is captured; print one JSON object:
command_rc, http_requests, http_failed, longest_outage_s, served_by (each change of the node
answering), announcers (every MAC, by node, that sent a gratuitous ARP or an ARP reply for the
VIP during the run). Uses the poller of molecule/default/files/measure.py; the capture is
filtered to ARP, so a ten-minute run stays small.
Usage: migrate_measure.py --lab kad --vip IP --port 8080 --command "..." [--timeout 1200]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "default" / "files"))
from measure import Poller, labctl, outage  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lab", required=True)
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--client", default="c1")
    ap.add_argument("--segment", default="lan")
    ap.add_argument("--command", required=True)
    ap.add_argument("--timeout", type=float, default=1200)
    a = ap.parse_args()
    inv = json.loads(Path(labctl(a.lab, "inventory").strip()).read_text())["all"]
    macs = {inv["hosts"][h]["lab_interfaces"][0]["mac"].lower(): h for h in inv["children"]["speakers"]["hosts"]}
    url = f"http://{a.vip}:{a.port}/"
    poller = Poller(a.lab, a.client, url, a.timeout + 60)
    capture = json.loads(labctl(a.lab, "capture", "start", a.segment, "--filter", "arp"))
    result: dict = {"vip": a.vip}
    try:
        time.sleep(2)
        t0 = time.time()
        proc = subprocess.run(a.command, shell=True, capture_output=True, text=True, timeout=a.timeout, check=False)
        result["command_rc"] = proc.returncode
        if proc.returncode != 0:
            result["command_output"] = (proc.stdout + proc.stderr)[-3000:]
        time.sleep(1)
        samples = poller.since(t0)
        result["seconds"] = round(time.time() - t0, 1)
        result["http_requests"] = len(samples)
        result["http_failed"], result["longest_outage_s"] = outage(samples)
        result["failures"] = [{"t": round(s["t"] - t0, 3), "error": s["body"]} for s in samples if not s["ok"]][:20]
        result["served_by"], last = [], None
        for s in samples:
            if s["ok"] and s["body"] != last:
                result["served_by"].append([round(s["t"] - t0, 3), s["body"]])
                last = s["body"]
    finally:
        labctl(a.lab, "capture", "stop", capture["name"], check=False)
        poller.close()
    events = json.loads(labctl(a.lab, "capture", "read", capture["pcap"], "--kinds", "arp"))
    announcers: dict[str, int] = {}
    for e in events:
        if e["kind"] == "arp" and e["sender_ip"] == a.vip and (e["gratuitous"] or e["op"] == "reply"):
            who = macs.get(e["sender_mac"].lower(), e["sender_mac"].lower())
            announcers[who] = announcers.get(who, 0) + 1
    result["announcers"] = announcers
    Path(capture["pcap"]).unlink(missing_ok=True)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
