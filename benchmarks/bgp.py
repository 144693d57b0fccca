"""BGP mode against real FRR on the lab: withdrawal times, config change to route, 1,000 VIPs.

A lab ``bgpbench`` (nodes n1 and n2, router r1 with a passive peer group, multipath and BFD
100 ms x 3, timers 3/9) is booted; the speaker's BGP mode (``BgpMode``) runs here and drives
the nodes' FRR through nsenter, exactly the calls a node's speaker makes. Every time is read
at the router (``ip route``, ``vtysh ... json``), polled every ~20 ms (so about 20-40 ms of the
figures is the polling itself).

- withdrawal of one node's next hop at the router after: drain, withdraw_all (what SIGTERM
  does), bgpd frozen (SIGSTOP; the mode's watch blocks BFD), node frozen (cgroup freezer),
  node link down; ``--runs`` each;
- config change (a new service) to the route at the router, with the session's
  connectionsEstablished and uptime before and after (no reset);
- N VIPs (IPv6 pool, 10/100/1,000/2,000 in turn): decision + render time, frr-reload time, time
  until the router has received all N from both nodes and has all N with two next hops in its
  kernel table, bgpd's and zebra's memory on a node and on the router; then all withdrawn at once.

    sudo .venv/bin/python benchmarks/bgp.py --runs 3 [--sizes 10,100,1000,2000] [--parts scale]
        [--json] [--out FILE]

The JSON document carries the run's conditions (start and end time, load average, commit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "roles", "lab", "files"))

import labctl  # noqa: E402
from nocloudlb.bgp.frr import FrrControl  # noqa: E402
from nocloudlb.bgp.mode import BgpMode  # noqa: E402
from nocloudlb.core.election import DRAIN_LABEL, NodeView  # noqa: E402
from nocloudlb.core.routes import kernel_next_hops  # noqa: E402
from nocloudlb.core.schema import parse_resources  # noqa: E402

NODES = {"n1": "198.51.100.11", "n2": "198.51.100.12"}
VIP = "203.0.113.10"
TOPOLOGY = {
    "name": "bgpbench",
    "segments": {"lan": {}},
    "hosts": {
        "n1": {"services": ["frr"], "interfaces": [
            {"segment": "lan", "addresses": ["198.51.100.11/24", "2001:db8:1::11/64"]}]},
        "n2": {"services": ["frr"], "interfaces": [
            {"segment": "lan", "addresses": ["198.51.100.12/24", "2001:db8:1::12/64"]}]},
        "r1": {"services": ["frr"], "forwarding": True,
               "interfaces": [{"segment": "lan", "addresses": ["198.51.100.1/24", "2001:db8:1::1/64"]}]},
    },
}
ROUTER = ["configure terminal", "bfd", "profile fast", "receive-interval 100", "transmit-interval 100", "exit", "exit",
          "router bgp 64500", "bgp router-id 198.51.100.1", "no bgp ebgp-requires-policy",
          "neighbor nodes peer-group", "neighbor nodes remote-as 64512", "neighbor nodes bfd",
          "neighbor nodes bfd profile fast", "neighbor nodes timers 3 9",
          "bgp listen range 198.51.100.0/24 peer-group nodes",
          "neighbor nodes6 peer-group", "neighbor nodes6 remote-as 64512",
          "bgp listen range 2001:db8:1::/64 peer-group nodes6",
          "address-family ipv4 unicast", "maximum-paths 8", "exit-address-family",
          "address-family ipv6 unicast", "neighbor nodes6 activate", "maximum-paths 8", "exit-address-family"]


def docs(n_v4: int = 1, n_v6: int = 0) -> object:
    out: list[dict] = [
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "v4"},
         "spec": {"addresses": ["203.0.113.0/24"]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "v6"},
         "spec": {"addresses": ["2001:db8:5::/116"]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "BFDProfile", "metadata": {"name": "fast"},
         "spec": {"receiveInterval": 100, "transmitInterval": 100}},
        {"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer", "metadata": {"name": "r1"},
         "spec": {"myASN": 64512, "peerASN": 64500, "peerAddress": "198.51.100.1", "holdTime": "9s",
                  "keepaliveTime": "3s", "connectTime": "2s", "bfdProfile": "fast"}},
        {"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer", "metadata": {"name": "r1v6"},
         "spec": {"myASN": 64512, "peerASN": 64500, "peerAddress": "2001:db8:1::1", "connectTime": "2s"}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "BGPAdvertisement", "metadata": {"name": "v4"},
         "spec": {"ipAddressPools": ["v4"], "peers": ["r1"]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "BGPAdvertisement", "metadata": {"name": "v6"},
         "spec": {"ipAddressPools": ["v6"], "peers": ["r1v6"]}},
    ]
    for i in range(n_v4):
        out.append(_svc(f"v4-{i}", f"203.0.113.{10 + i}"))
    for i in range(n_v6):
        out.append(_svc(f"v6-{i}", f"2001:db8:5::{i + 1:x}"))
    return parse_resources(out)


def _svc(name: str, ip: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "bench"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}


class Bench:
    def __init__(self, lab: labctl.Lab) -> None:
        self.lab = lab
        self.modes: dict[str, BgpMode] = {}
        for host in NODES:
            pid = str(lab.pid(host))
            frr = FrrControl(prefix=["nsenter", "-t", pid, "-m", "-u", "-i", "-n", "-p"], root=f"/proc/{pid}/root")
            self.modes[host] = BgpMode(host, frr, debounce=0.2, retry=1.0, registry=None)
        for m in self.modes.values():
            m.start()

    def apply(self, cfg, drained: tuple[str, ...] = (), wait: bool = True) -> float:
        nodes = [NodeView(h, {DRAIN_LABEL: ""} if h in drained else {}) for h in self.modes]
        t0 = time.monotonic()
        for name, m in self.modes.items():
            m.apply(name, nodes, cfg)
        took = (time.monotonic() - t0) / len(self.modes)
        if wait:
            for m in self.modes.values():
                m.wait_applied(120)
        return took

    def hops(self, prefix: str) -> set[str]:
        return kernel_next_hops(self.lab.exec("r1", ["ip", "-j", "route", "show", prefix], timeout=10).stdout, prefix)

    def vt(self, host: str, command: str) -> dict:
        return json.loads(self.lab.exec(host, ["vtysh", "-c", command], timeout=60).stdout or "{}")

    def session(self, addr: str, family: str = "ipv4") -> dict:
        return self.vt("r1", f"show bgp {family} unicast summary json").get("peers", {}).get(addr, {})

    def bfd_up(self, addr: str) -> bool:
        out = self.lab.exec("r1", ["vtysh", "-c", "show bfd peers json"], timeout=30).stdout
        return any(p.get("peer") == addr and p.get("status") == "up" for p in json.loads(out or "[]"))

    def rss_kib(self, host: str, daemon: str = "bgpd") -> int:
        pid = self.lab.exec(host, ["cat", f"/run/frr/{daemon}.pid"]).stdout.strip()
        for line in self.lab.exec(host, ["cat", f"/proc/{pid}/status"]).stdout.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def close(self) -> None:
        for m in self.modes.values():
            m.withdraw_all()
            m.close()


def wait_for(pred, timeout: float, step: float = 0.01):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def until(pred, timeout: float) -> float | None:
    t0 = time.monotonic()
    return round(time.monotonic() - t0, 3) if wait_for(pred, timeout) else None


def withdrawals(b: Bench, runs: int) -> dict[str, list[float | None]]:
    cfg = docs()
    both = set(NODES.values())
    out: dict[str, list[float | None]] = {k: [] for k in ("drain", "SIGTERM (withdraw_all)", "bgpd frozen",
                                                          "node frozen", "link down")}
    n1 = NODES["n1"]

    def ready(after: str = "start") -> None:
        b.apply(cfg)
        if not wait_for(lambda: b.hops(VIP) == both, 120, 0.2):
            raise SystemExit(f"after {after}: not back to two next hops: {b.hops(VIP)}; n1 session at the "
                             f"router {b.session(n1)}; n1's mode {json.dumps(b.modes['n1'].status())[:3000]}; "
                             f"n1's networks {b.lab.exec('n1', ['vtysh', '-c', 'show running-config']).stdout[-1500:]}")
        wait_for(lambda: b.modes["n1"].status()["frr"]["healthy"] is True, 20, 0.1)
        if not wait_for(lambda: b.bfd_up(n1), 60, 0.2):  # a fault on a node whose BFD is not up measures the hold time
            raise SystemExit(f"BFD with {n1} not up at the router")
        time.sleep(1.0)

    for _run in range(runs):
        ready("link down (previous run)" if _run else "start")
        b.apply(cfg, drained=("n1",), wait=False)
        out["drain"].append(until(lambda: n1 not in b.hops(VIP), 10))
        ready("drain")
        t0 = time.monotonic()
        b.modes["n1"].withdraw_all()
        gone = wait_for(lambda: n1 not in b.hops(VIP), 10)
        out["SIGTERM (withdraw_all)"].append(round(time.monotonic() - t0, 3) if gone else None)
        ready("withdraw_all")
        bgpd = b.lab.exec("n1", ["cat", "/run/frr/bgpd.pid"]).stdout.strip()
        b.lab.exec("n1", ["kill", "-STOP", bgpd])
        out["bgpd frozen"].append(until(lambda: n1 not in b.hops(VIP), 15))
        b.lab.exec("n1", ["kill", "-CONT", bgpd])
        ready("bgpd frozen")
        fault = b.lab.fault_freeze("n1")
        out["node frozen"].append(until(lambda: n1 not in b.hops(VIP), 15))
        b.lab.undo(fault["id"])
        ready("node frozen")
        fault = b.lab.fault_link_down("n1")
        out["link down"].append(until(lambda: n1 not in b.hops(VIP), 15))
        b.lab.undo(fault["id"])
    ready("link down")
    return out


def config_change(b: Bench) -> dict:
    b.apply(docs())
    wait_for(lambda: b.hops(VIP) == set(NODES.values()), 60, 0.2)
    time.sleep(2.0)
    before = b.session(NODES["n1"])
    t0 = time.monotonic()
    b.apply(docs(n_v4=2), wait=False)
    t = until(lambda: NODES["n1"] in b.hops("203.0.113.11"), 30)
    after = b.session(NODES["n1"])
    return {"new service to route at the router (s)": t, "seconds": round(time.monotonic() - t0, 3),
            "connectionsEstablished before/after": [before.get("connectionsEstablished"),
                                                    after.get("connectionsEstablished")],
            "uptime before/after (ms)": [before.get("peerUptimeMsec"), after.get("peerUptimeMsec")],
            "reset": after.get("connectionsEstablished") != before.get("connectionsEstablished")}


def router_table(b: Bench) -> tuple[int, int]:
    """The router's IPv6 BGP routes in its kernel table, and how many of them have both nodes as next hops."""
    out = b.lab.exec("r1", ["ip", "-j", "-6", "route", "show", "proto", "bgp"], timeout=30).stdout
    routes = json.loads(out or "[]")
    return len(routes), sum(1 for r in routes if len(r.get("nexthops", [])) >= len(NODES))


def received(b: Bench) -> int:
    """The fewest IPv6 prefixes the router has received from one node (each node announces them all)."""
    peers = b.vt("r1", "show bgp ipv6 unicast summary json").get("peers", {})
    return min((int(p.get("pfxRcd", 0) or 0) for p in peers.values()), default=0) if len(peers) >= len(NODES) else 0


def scale(b: Bench, sizes: list[int]) -> list[dict]:
    """For each size N (in turn, so each step adds the VIPs beyond the previous size): the time to
    decide and render, frr-reload's time on a node, the time until the router has all N prefixes
    from both nodes and all N routes with two next hops in its kernel table, and the daemons' memory.
    At the end every VIP is withdrawn at once and the time until the router's table is empty measured."""
    rows = []
    for n in sizes:
        cfg = docs(n_v6=n)
        t0 = time.monotonic()
        render_s = b.apply(cfg, wait=False)
        applied = all(m.wait_applied(600) for m in b.modes.values())
        applied_s = time.monotonic() - t0
        got = wait_for(lambda n=n: received(b) >= n, 300, 0.2)
        received_s = time.monotonic() - t0
        full = wait_for(lambda n=n: router_table(b)[1] >= n, 300, 0.2)
        table_s = time.monotonic() - t0
        total, ecmp = router_table(b)
        status = b.modes["n1"].status()["config"]
        rows.append({"vips": n, "decide+render (s)": round(render_s, 3),
                     "reload on n1 (s)": round(status["lastReloadSeconds"], 3),
                     "reload failures": status["failures"],
                     "applied on both nodes (s)": round(applied_s, 3) if applied else None,
                     "router received all from both (s)": round(received_s, 3) if got else None,
                     "router kernel has all, 2 next hops (s)": round(table_s, 3) if full else None,
                     "router kernel routes (IPv6 bgp)": total, "with 2 next hops": ecmp,
                     "bgpd RSS n1 (MiB)": round(b.rss_kib("n1") / 1024, 1),
                     "zebra RSS n1 (MiB)": round(b.rss_kib("n1", "zebra") / 1024, 1),
                     "bgpd RSS r1 (MiB)": round(b.rss_kib("r1") / 1024, 1),
                     "zebra RSS r1 (MiB)": round(b.rss_kib("r1", "zebra") / 1024, 1)})
        print("scale:", json.dumps(rows[-1]), file=sys.stderr, flush=True)
    t0 = time.monotonic()
    b.apply(docs(n_v6=0), wait=False)
    gone = wait_for(lambda: router_table(b)[0] == 0, 300, 0.2)
    rows.append({"vips": f"withdraw all {sizes[-1]}", "router kernel empty (s)":
                 round(time.monotonic() - t0, 3) if gone else None})
    return rows


def conditions() -> dict:
    try:
        commit = os.popen(f"git -C {HERE} rev-parse --short HEAD 2>/dev/null").read().strip()
    except OSError:
        commit = ""
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
            "loadavg": os.getloadavg()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--parts", default="withdrawal,config,scale", help="which parts to run (comma-separated)")
    ap.add_argument("--json", action="store_true", help="print only the JSON document")
    ap.add_argument("--out", help="also write the JSON document to this file")
    ap.add_argument("--lab", default="bgpbench", help="the lab's name (default bgpbench)")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    result: dict = {"conditions": conditions()}
    lab = labctl.Lab(a.lab)
    lab.down()
    lab.up(TOPOLOGY)
    b = None
    try:
        lab.exec("r1", ["vtysh"] + [x for line in ROUTER for x in ("-c", line)], timeout=30)
        b = Bench(lab)
        if "withdrawal" in parts:
            result["withdrawal"] = withdrawals(b, a.runs)
        if "config" in parts:
            result["config_change"] = config_change(b)
        if "scale" in parts:
            result["scale"] = scale(b, [int(s) for s in a.sizes.split(",")])
    finally:
        if b is not None:
            b.close()
        lab.down()
    result["conditions"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["conditions"]["loadavg_end"] = os.getloadavg()
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    print("conditions:", json.dumps(result["conditions"]))
    print("withdrawal of n1's next hop at the router (s), BFD 100 ms x 3, timers 3/9")
    print("| event | runs | min | median | max |\n| --- | --- | --- | --- | --- |")
    for event, times in result.get("withdrawal", {}).items():
        ok = [t for t in times if t is not None]
        print(f"| {event} | {len(times)} | {min(ok):.3f} | {statistics.median(ok):.3f} | {max(ok):.3f} |"
              if ok else f"| {event} | {len(times)} | - | - | - |")
    print("\nconfig change:", json.dumps(result.get("config_change")))
    rows = result.get("scale", [])
    if rows:
        print("\n| " + " | ".join(rows[0]) + " |\n|" + " --- |" * len(rows[0]))
        for row in rows[:-1]:
            print("| " + " | ".join(str(v) for v in row.values()) + " |")
        print(json.dumps(rows[-1]))
    print("\nJSON " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
