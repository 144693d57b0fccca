"""BGP mode against real FRR on the lab: withdrawal times, config change to route, 1,000 VIPs.

A lab ``bgpbench`` (nodes n1 and n2, router r1 with a passive peer group, multipath and BFD
100 ms x 3, timers 3/9) is booted; the speaker's BGP mode (``BgpMode``) runs here and drives
the nodes' FRR through nsenter, exactly the calls a node's speaker makes. Every time is read
at the router. Withdrawals are read event-driven: ``ip -o -ts monitor route`` and ``tcpdump``
(BGP UPDATEs from n1) run in r1's network namespace from before the first fault, and a
withdrawal's time is the timestamp of the first route event after the fault whose route no
longer has n1 as a next hop (the poll of ``ip route`` every ~20 ms is kept only to know when to
go on, and its figure is printed beside). For drain and SIGTERM the table also splits the time:
fault -> ``no network`` sent to bgpd (the mode's own record), -> UPDATE on the wire at r1, ->
route gone from r1's kernel table. The other parts poll (``ip route``, ``vtysh ... json``).

- withdrawal of one node's next hop at the router after: drain, withdraw_all (what SIGTERM
  does), bgpd frozen (SIGSTOP; the mode's watch blocks BFD), node frozen (cgroup freezer),
  node link down; ``--runs`` each;
- config change (a new service) to the route at the router, with the session's
  connectionsEstablished and uptime before and after (no reset);
- N VIPs (IPv6 pool, 10/100/1,000/2,000 in turn): decision + render time, frr-reload time, time
  until the router has received all N from both nodes and has all N with two next hops in its
  kernel table, bgpd's and zebra's memory on a node and on the router; then all withdrawn at once;
- ``delta`` (no lab: zebra and bgpd of the lab's base image in two network namespaces,
  tests/netns/frr_harness.py): adding ``--delta-sizes`` prefixes in turn (1,000 then 10,000) to
  one VIP, once by delta (``network`` lines on bgpd's vty socket) and once by full reload
  (frr-reload), side by side: the worker's time, the time from the change until the router has
  received all of them, and the router's table counted afterwards.

    sudo .venv/bin/python benchmarks/bgp.py --runs 3 [--sizes 10,100,1000,2000] [--parts scale]
        [--json] [--out FILE] [--lab NAME] [--withdraw-via vty|vtysh]
    sudo .venv/bin/python benchmarks/bgp.py --parts delta [--delta-sizes 1000,10000]

The JSON document carries the run's conditions (start and end time, load average, commit).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "roles", "lab", "files"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "netns"))

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


class RouterEvents:
    """Route events and BGP UPDATEs seen in r1's network namespace, timestamped by ``ip`` and
    ``tcpdump`` themselves (wall clock), read by threads from before the first fault."""

    TS = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)\]\s*(.*)$")

    def __init__(self, lab: labctl.Lab, router: str, node_addr: str) -> None:
        ns = ["nsenter", "-t", str(lab.pid(router)), "-n"]
        env = dict(os.environ, TZ="UTC")
        self.routes: list[tuple[float, str]] = []
        self.updates: list[float] = []
        self._lock = threading.Lock()
        self.procs = [
            subprocess.Popen(ns + ["ip", "-o", "-ts", "monitor", "route"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=env),
            # BGP messages of type 2 (UPDATE) from the node: byte 18 of the BGP header, after the TCP header
            subprocess.Popen(ns + ["tcpdump", "-i", "any", "-n", "-tt", "-l", "-U", "-Q", "in",
                                   f"src host {node_addr} and tcp port 179 and "
                                   "tcp[((tcp[12:1] & 0xf0) >> 2) + 18:1] = 2"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)]
        self.update_filter_ok = True
        for target, proc in ((self._read_routes, self.procs[0]), (self._read_updates, self.procs[1])):
            threading.Thread(target=target, args=(proc,), daemon=True).start()
        time.sleep(1.0)  # both listening before the first fault

    def _read_routes(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = self.TS.match(line.strip())
            if m:
                at = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
                    tzinfo=datetime.UTC).timestamp()
                with self._lock:
                    self.routes.append((at, m.group(2)))

    def _read_updates(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            try:  # the filter admits only the node's segments that begin with an UPDATE
                at = float(parts[0]) if parts else None
            except ValueError:
                continue
            if at is not None:
                with self._lock:
                    self.updates.append(at)

    def route_gone(self, since: float, prefix: str, hop: str) -> float | None:
        """The first route event for ``prefix`` after ``since`` that leaves ``hop`` out."""
        with self._lock:
            events = list(self.routes)
        for at, text in events:
            words = text.split()
            if at < since or not words:
                continue
            deleted = words[0] == "Deleted"
            dst = words[1] if deleted and len(words) > 1 else words[0]
            if dst.split("/")[0] == prefix and (deleted or f"via {hop} " not in text + " "):
                return at
        return None

    def update_after(self, since: float) -> float | None:
        with self._lock:
            return next((t for t in self.updates if t >= since), None)

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_for(pred, timeout: float, step: float = 0.01):
    return labctl.wait_for(pred, timeout, step)


def until(pred, timeout: float) -> float | None:
    t0 = time.monotonic()
    return round(time.monotonic() - t0, 3) if wait_for(pred, timeout) else None


def withdrawals(b: Bench, runs: int) -> dict:
    cfg = docs()
    both = set(NODES.values())
    out: dict[str, list[float | None]] = {k: [] for k in ("drain", "SIGTERM (withdraw_all)", "bgpd frozen",
                                                          "node frozen", "link down")}
    polled: dict[str, list[float | None]] = {k: [] for k in out}
    split: dict[str, list[dict]] = {"drain": [], "SIGTERM (withdraw_all)": []}
    events: list[dict] = []
    n1 = NODES["n1"]
    ev = RouterEvents(b.lab, "r1", n1)

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

    def measure(name: str, t0: float, timeout: float) -> None:
        gone = wait_for(lambda: n1 not in b.hops(VIP), timeout)
        polled[name].append(round(time.time() - t0, 3) if gone else None)
        time.sleep(0.2)  # the monitor's line is read
        at = ev.route_gone(t0, VIP, n1)
        out[name].append(round(at - t0, 3) if at is not None and gone else None)
        events.append({"fault": name, "t0": t0, "route_event": at, "polled": polled[name][-1],
                       "text": next((t for a, t in ev.routes if a == at), "")})
        if name in split:
            w = b.modes["n1"].last_withdraw
            sent = w.get("sent") if w.get("at", 0) >= t0 - 0.001 else None
            update = ev.update_after(t0)
            split[name].append({"sent": round(sent - t0, 4) if sent else None,
                                "update on the wire": round(update - t0, 4) if update else None,
                                "route gone": round(at - t0, 4) if at else None, "via": w.get("via"),
                                "polled": polled[name][-1]})
            print(f"{name}: {json.dumps(split[name][-1])}", file=sys.stderr, flush=True)
        else:
            print(f"{name}: {out[name][-1]} (polled {polled[name][-1]})", file=sys.stderr, flush=True)

    try:
        for run in range(runs):
            ready("link down (previous run)" if run else "start")
            t0 = time.time()
            b.apply(cfg, drained=("n1",), wait=False)
            measure("drain", t0, 10)
            ready("drain")
            t0 = time.time()
            b.modes["n1"].withdraw_all()
            measure("SIGTERM (withdraw_all)", t0, 10)
            ready("withdraw_all")
            bgpd = b.lab.exec("n1", ["cat", "/run/frr/bgpd.pid"]).stdout.strip()
            t0 = time.time()
            b.lab.exec("n1", ["kill", "-STOP", bgpd])
            measure("bgpd frozen", t0, 15)
            b.lab.exec("n1", ["kill", "-CONT", bgpd])
            ready("bgpd frozen")
            t0 = time.time()
            fault = b.lab.fault_freeze("n1")
            measure("node frozen", t0, 15)
            b.lab.undo(fault["id"])
            ready("node frozen")
            t0 = time.time()
            fault = b.lab.fault_link_down("n1")
            measure("link down", t0, 15)
            b.lab.undo(fault["id"])
        ready("link down")
    finally:
        ev.close()
    return {"times": out, "polled": polled, "split": split, "events": events}


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


def delta_docs(n: int) -> object:
    """One IPv6 pool (/112) with ``n`` VIPs, one IPv6 peer (the router at 2001:db8:1::12)."""
    out: list[dict] = [
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "v6"},
         "spec": {"addresses": ["2001:db8:5::/112"]}},
        {"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer", "metadata": {"name": "r1v6"},
         "spec": {"myASN": 64512, "peerASN": 64500, "peerAddress": "2001:db8:1::12", "connectTime": "1s"}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "BGPAdvertisement", "metadata": {"name": "v6"},
         "spec": {"ipAddressPools": ["v6"]}}]
    out += [_svc(f"v6-{i}", f"2001:db8:5::{i + 1:x}") for i in range(n)]
    return parse_resources(out)


def delta_path(path: str, adds: list[int]) -> list[dict]:
    """One node and one router (fresh bgpds); the node's mode applies one VIP (a full reload), then
    ``adds`` more in turn by ``path`` ("delta", or "reload" with the delta turned off)."""
    from frr_harness import FrrHost, frr_image, router_lines  # noqa: PLC0415 - only this part needs them
    from netns import make_segment  # noqa: PLC0415
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    image = frr_image()
    if image is None:
        raise SystemExit("no lab base image with FRR (roles/lab/files/labctl.py builds it)")
    rows = []
    with make_segment("nbdb", hosts=2, client=False) as seg:
        node, router = FrrHost(seg, seg.hosts[0].ns, "n1", image), FrrHost(seg, seg.hosts[1].ns, "r1", image)
        mode = None
        try:
            node.start()
            router.start()
            router.vtysh(*router_lines(64500, {"2001:db8:1::11": 64512}, ("ipv6",)))
            mode = BgpMode("n1", node.control(), debounce=0.05, retry=1.0, registry=CollectorRegistry())
            mode.delta = path == "delta"
            mode.start()
            total = 1
            mode.apply("n1", [NodeView("n1", {})], delta_docs(total))
            if not mode.wait_applied(120) or not wait_for(lambda: router.received("2001:db8:1::11", "ipv6") == 1,
                                                          60, 0.1):
                raise SystemExit(f"{path}: the first VIP never reached the router: {mode.status()['config']}")
            for n in adds:
                total += n
                cfg = delta_docs(total)
                t0 = time.monotonic()
                mode.apply("n1", [NodeView("n1", {})], cfg)
                render_s = time.monotonic() - t0
                applied = mode.wait_applied(1800)
                applied_s = time.monotonic() - t0
                got = wait_for(lambda total=total: router.received("2001:db8:1::11", "ipv6") >= total, 600, 0.05)
                received_s = time.monotonic() - t0
                status = mode.status()["config"]
                table = len(router.table("ipv6"))
                rows.append({"path": path, "added": n, "total": total, "decide+render (s)": round(render_s, 3),
                             "worker (s)": status["lastDeltaSeconds" if path == "delta" else "lastReloadSeconds"],
                             "of it vty (s)": (round(mode.reloader.deltas.last_vty_seconds, 4)
                                               if path == "delta" else "-"),
                             "applied (s)": round(applied_s, 3) if applied else None,
                             "router received all (s)": round(received_s, 3) if got else None,
                             "router table": table, "path taken": status["lastPath"],
                             "deltas/reloads": f"{status['deltas']}/{status['reloads']}"})
                print("delta:", json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            if mode is not None:
                mode.close()
            for h in (node, router):
                h.close()
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
    ap.add_argument("--delta-sizes", default="1000,10000", help="prefixes added in turn by the delta part")
    ap.add_argument("--parts", default="withdrawal,config,scale", help="which parts to run (comma-separated)")
    ap.add_argument("--json", action="store_true", help="print only the JSON document")
    ap.add_argument("--out", help="also write the JSON document to this file")
    ap.add_argument("--lab", default="bgpbench", help="the lab's name (default bgpbench)")
    ap.add_argument("--withdraw-via", choices=("vty", "vtysh"), default="vty",
                    help="how the mode withdraws: bgpd's vty socket (the speaker's way) or a vtysh process "
                    "(its fallback; for comparison)")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    result: dict = {"conditions": conditions()}
    result["conditions"]["withdraw_via"] = a.withdraw_via
    if "delta" in parts:
        adds = [int(s) for s in a.delta_sizes.split(",")]
        result["delta"] = delta_path("delta", adds) + delta_path("reload", adds)
    if parts - {"delta"}:
        lab_parts(a, parts, result)
    result["conditions"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["conditions"]["loadavg_end"] = os.getloadavg()
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    report(result)
    return 0


def lab_parts(a: argparse.Namespace, parts: set[str], result: dict) -> None:
    """The parts that run on a lab (withdrawal, config, scale)."""
    lab = labctl.Lab(a.lab)
    lab.down()
    lab.up(TOPOLOGY)
    b = None
    try:
        lab.exec("r1", ["vtysh"] + [x for line in ROUTER for x in ("-c", line)], timeout=30)
        b = Bench(lab)
        for m in b.modes.values():
            m.vty_withdraw = a.withdraw_via == "vty"
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


def report(result: dict) -> None:
    print("conditions:", json.dumps(result["conditions"]))
    drows = result.get("delta", [])
    if drows:
        print("\nprefixes added to a node's bgpd, by delta and by full reload (router: a second bgpd)")
        print("| " + " | ".join(drows[0]) + " |\n|" + " --- |" * len(drows[0]))
        for row in sorted(drows, key=lambda r: (r["total"], r["path"])):
            print("| " + " | ".join(str(v) for v in row.values()) + " |")
    w = result.get("withdrawal", {})
    if w:
        withdrawal_report(w)
    if "config_change" in result:
        print("\nconfig change:", json.dumps(result["config_change"]))
    rows = result.get("scale", [])
    if rows:
        print("\n| " + " | ".join(rows[0]) + " |\n|" + " --- |" * len(rows[0]))
        for row in rows[:-1]:
            print("| " + " | ".join(str(v) for v in row.values()) + " |")
        print(json.dumps(rows[-1]))
    print("\nJSON " + json.dumps(result))


def withdrawal_report(w: dict) -> None:
    print("\nwithdrawal of n1's next hop at the router (s; r1's route event, `ip -ts monitor route`), "
          "BFD 100 ms x 3, timers 3/9")
    print("| event | runs | each | polled instead (ip route every ~20 ms) |\n| --- | --- | --- | --- |")
    for event, times in w.get("times", {}).items():
        each = ", ".join("-" if t is None else f"{t:.3f}" for t in times)
        pol = ", ".join("-" if t is None else f"{t:.3f}" for t in w.get("polled", {}).get(event, []))
        print(f"| {event} | {len(times)} | {each} | {pol} |")
    if w.get("split"):
        print("\nwhere the time goes (s after the fault): withdrawal sent to bgpd / UPDATE on the wire at r1 / "
              "route gone at r1")
        print("| event | via | sent | UPDATE at r1 | route gone |\n| --- | --- | --- | --- | --- |")
        for event, rows in w["split"].items():
            for row in rows:
                print(f"| {event} | {row['via']} | {row['sent']} | {row['update on the wire']} | {row['route gone']} |")


if __name__ == "__main__":
    sys.exit(main())
