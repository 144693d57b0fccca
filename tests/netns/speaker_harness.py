"""The speaker tests' one harness: N real ``nocloudlb speaker`` processes in namespaces, and the
documents, VIP choice and waiting every speaker test shares.

It holds no tests; it is imported by the tests in tests/netns, by benchmarks (failover,
handover, side_by_side) and by tests/unit/speaker/inproc_speaker.py, the in-process variant (a
real Speaker whose layer-2 side effects are recorded instead of sent), which takes
``pool_docs``, ``service_doc``, ``spread_vips`` and ``wait_for`` from here: one definition of
them. Everything it starts runs through ``Segment.popen`` and is killed by PID when the segment
closes.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from netns import Segment
from nocloudlb.core.control_client import request
from nocloudlb.core.election import election_order
from nocloudlb.membership import generate_key

POOL_V4 = "198.51.100.200-198.51.100.239"
POOL_V6 = "2001:db8:1::200-2001:db8:1::23f"


def pool_docs(node_selectors: list | None = None) -> list[dict]:
    """Pool ``default`` (IPv4 and IPv6) and an L2Advertisement of it (optionally with nodeSelectors)."""
    adv: dict[str, Any] = {"ipAddressPools": ["default"]}
    if node_selectors:
        adv["nodeSelectors"] = node_selectors
    return [
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "default"},
         "spec": {"addresses": [POOL_V4, POOL_V6]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "default"},
         "spec": adv},
    ]


def service_doc(name: str, ips: str | list[str], policy: str = "Cluster", annotations: dict | None = None) -> dict:
    """A LoadBalancer Service in namespace ``test`` holding ``ips`` (one address or a list), port 80."""
    ips = [ips] if isinstance(ips, str) else ips
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "test", "annotations": annotations or {}},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": policy,
                     "ports": [{"port": 80, "protocol": "TCP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": ip} for ip in ips]}}}


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition", step: float = 0.05) -> Any:
    """``pred()``'s first true value, polled every ``step`` s; AssertionError naming ``what`` after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        time.sleep(step)


def spread_vips(nodes: list[str], per_node: int = 1, start: str = "198.51.100.200") -> dict[str, str]:
    """Pick pool addresses so that every node leads ``per_node`` of them: ip -> leader."""
    out: dict[str, str] = {}
    count = dict.fromkeys(nodes, 0)
    ip = ipaddress.ip_address(start)
    while any(c < per_node for c in count.values()):
        leader = election_order(nodes, str(ip))[0]
        if count[leader] < per_node:
            count[leader] += 1
            out[str(ip)] = leader
        ip += 1
    return out


class SpeakerCluster:
    def __init__(self, seg: Segment, workdir: Path, profile: str = "fast", resources: list[dict] | None = None,
                 memberlist_extra: dict | None = None, keys: list[str] | None = None) -> None:
        self.seg = seg
        self.dir = workdir
        self.names = [f"n{i + 1}" for i in range(len(seg.hosts))]
        self.profile = profile
        self.resources = resources or pool_docs()
        self.memberlist_extra = memberlist_extra or {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.env: dict[str, dict[str, str]] = {}  # extra environment per node (e.g. NOTIFY_SOCKET)
        self.wrap: dict[str, list[str]] = {}  # a command the node's speaker runs under (argv prefix, must exec it)
        # a source tree to run the node's speaker from: its import root goes first on PYTHONPATH, ahead of
        # the editable install (previous_release.materialise makes one of another commit)
        self.source: dict[str, Path] = {}
        self.logs: dict[str, Path] = {}
        self.keys = keys or [generate_key()]
        self.key_files: dict[str, Path] = {}
        for name in self.names:
            (self.dir / name).mkdir(parents=True, exist_ok=True)
            self.set_key_file(name, self.keys)
            self.write_config(name)

    # -- files -----------------------------------------------------------------------------
    def host(self, name: str):
        return self.seg.hosts[self.names.index(name)]

    def mac(self, name: str) -> str:
        return self.host(name).mac

    def sock(self, name: str) -> str:
        return str(self.dir / name / "speaker.sock")

    def config_path(self, name: str) -> Path:
        return self.dir / name / "config.yaml"

    def set_key_file(self, name: str, keys: list[str]) -> None:
        path = self.dir / name / "memberlist.key"
        path.write_text("".join(k + "\n" for k in keys))
        path.chmod(0o600)
        self.key_files[name] = path

    def config(self, name: str, resources: list[dict] | None = None, **extra: Any) -> dict:
        h = self.host(name)
        ml = {"bind": f"{h.ipv4}:7946", "join": [f"{x.ipv4}:7946" for x in self.seg.hosts],
              "keyFile": str(self.key_files[name]), "profile": self.profile, **self.memberlist_extra}
        doc = {"node": {"name": name, "labels": {"rack": name}}, "memberlist": ml,
               "stateDir": str(self.dir / name / "state"), "socket": self.sock(name),
               "metrics": {"bind": "127.0.0.1:7472"}, "logLevel": "info",
               "resources": resources if resources is not None else self.resources}
        doc.update(extra)
        return doc

    def write_config(self, name: str, doc: dict | None = None, text: str | None = None) -> None:
        self.config_path(name).write_text(text if text is not None else yaml.safe_dump(doc or self.config(name)))

    # -- processes -------------------------------------------------------------------------
    def start(self, name: str) -> subprocess.Popen:
        log = self.dir / name / "speaker.log"
        self.logs[name] = log
        fh = open(log, "a")  # noqa: SIM115 - handed to the child
        argv = [*self.wrap.get(name, []), sys.executable, "-m", "nocloudlb.cli", "speaker", "-c",
                str(self.config_path(name))]
        env = self.env.get(name)
        root = self.source.get(name)
        if root is not None:
            rest = (env or {}).get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
            env = dict(env or {}, PYTHONPATH=os.pathsep.join(p for p in (str(root), rest) if p))
        proc = self.seg.popen(self.host(name).ns, argv, stdout=fh, stderr=fh, env=env)
        fh.close()
        self.procs[name] = proc
        return proc

    def start_all(self, timeout: float = 20.0) -> None:
        for name in self.names:
            self.start(name)
        self.wait(lambda: all(self.members_alive(n) == set(self.names) for n in self.names), timeout,
                  "all speakers ready with full membership")
        self.wait(self.settled, timeout, "every VIP past its conflict check on every node")

    def settled(self) -> bool:
        """No node has a VIP in a passing state (its RFC 5227 check running, or not yet taken by the
        L2 layer): what a test then observes is the steady state, not a start-up race."""
        transient = {"conflictCheck", "l2Pending"}
        for name in self.names:
            st = self.try_status(name)
            if not st or any(v.get("reason") in transient for v in st["vips"]):
                return False
        return True

    def send_signal(self, name: str, sig: int) -> float:
        t = time.time()
        os.kill(self.procs[name].pid, sig)  # the ip-netns-exec'd speaker itself (exec keeps the PID)
        return t

    def stop(self, name: str, sig: int = signal.SIGKILL) -> float:
        t = self.send_signal(name, sig)
        self.procs[name].wait(timeout=10)
        return t

    # -- observing -------------------------------------------------------------------------
    def status(self, name: str) -> dict:
        return request(self.sock(name), {"cmd": "status"})

    def try_status(self, name: str) -> dict | None:
        try:
            return self.status(name)
        except (OSError, ValueError):
            return None

    def members_alive(self, name: str) -> set[str]:
        st = self.try_status(name)
        if not st or not st.get("ready"):
            return set()
        return {m["name"] for m in st["members"] if m["state"] == "alive"}

    def vip(self, name: str, ip: str) -> dict:
        return next(v for v in self.status(name)["vips"] if v["ip"] == ip)

    def announcing(self, name: str, ip: str) -> bool:
        st = self.try_status(name)
        return bool(st) and any(v["ip"] == ip and v["announcing"] for v in st["vips"])

    def events(self, name: str, event: str | None = None) -> list[dict]:
        out = []
        for line in self.logs[name].read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if event is None or rec.get("event") == event:
                out.append(rec)
        return out

    @staticmethod
    def wait(pred: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
        return wait_for(pred, timeout, what, step)

    def probe(self, ip: str, timeout: float = 0.5) -> list[dict]:
        """Every MAC that answers ARP/NS for ``ip``, asked from the client (real packets)."""
        code = (f"import json; from nocloudlb.l2 import probe; "
                f"print(json.dumps(probe({ip!r}, 'eth0', {timeout})))")
        return self.seg.python_json(self.seg.client.ns, code)

    def owner_of(self, mac: str) -> str | None:
        return next((n for n in self.names if self.mac(n) == mac), None)

    def answered_by(self, ip: str, name: str, timeout: float = 0.2) -> bool:
        """``name``'s MAC and no other answers ``ip`` (one probe from the client)."""
        return [a["mac"] for a in self.probe(ip, timeout)] == [self.mac(name)]

    # -- acting ----------------------------------------------------------------------------
    def label(self, name: str, *args: str) -> None:
        """``nocloudlb label ARGS`` (this code's CLI) on ``name``'s control socket, whatever version runs
        there; RuntimeError with what the CLI said when it fails."""
        out = subprocess.run([sys.executable, "-m", "nocloudlb.cli", "label", "--socket", self.sock(name), *args],
                             capture_output=True, text=True, timeout=10, check=False)
        if out.returncode:
            raise RuntimeError(f"nocloudlb label {' '.join(args)} on {name}: {out.stdout}{out.stderr}")


SLOW_HTTP = r"""
import http.server, socket, sys, time
name = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(0.05)  # a slow answer: some connection is always in flight when the VIP moves
        body = (name + "\n").encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
class S(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
S(("::", 8090), H).serve_forever()
"""

POLL_HTTP = r"""
import json, sys, time, urllib.request
url, end = sys.argv[1], time.time() + float(sys.argv[2])
while time.time() < end:
    t = time.time()
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            print(json.dumps({"t": t, "ok": True, "body": r.read().decode().strip()}), flush=True)
    except Exception as exc:
        print(json.dumps({"t": t, "ok": False, "body": f"{type(exc).__name__}: {exc}"}), flush=True)
"""


def start_slow_http(c: SpeakerCluster, port: int = 8090) -> None:
    """On every node an HTTP server on [::]:port whose answers (the node's name) take 50 ms, so some
    connection is always in flight; killed with the segment."""
    for name in c.names:
        c.seg.popen(c.host(name).ns, [sys.executable, "-u", "-c", SLOW_HTTP.replace("8090", str(port)), name])


class ClientLines:
    """A program in the client's namespace that prints one JSON object a line; a thread reads them into
    ``samples`` (those ``keep`` accepts). ``stop()`` kills it by PID."""

    def __init__(self, seg: Segment, argv: list[str], keep: Callable[[dict], bool] = lambda rec: True,
                 **popen: Any) -> None:
        self.proc = seg.popen(seg.client.ns, argv, **popen)
        self.samples: list[dict] = []
        self._keep = keep
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            rec = json.loads(line)
            if self._keep(rec):
                self.samples.append(rec)

    def stop(self) -> None:
        Segment.kill(self.proc)
        self.thread.join(timeout=5)


class HttpPoller(ClientLines):
    """GET ``url`` from the client back to back for ``seconds``; ``samples`` has each answer or error."""

    def __init__(self, seg: Segment, url: str, seconds: float) -> None:
        super().__init__(seg, [sys.executable, "-u", "-c", POLL_HTTP, url, str(seconds)])

    def served_by(self, node: str, since: float, streak: int = 3) -> bool:
        return sum(1 for s in list(self.samples) if s["t"] > since and s["ok"] and s["body"] == node) >= streak

    @property
    def failed(self) -> list[dict]:
        return [s for s in self.samples if not s["ok"]]

    @property
    def moves(self) -> int:
        ok = [s["body"] for s in self.samples if s["ok"]]
        return sum(1 for a, b in zip(ok, ok[1:], strict=False) if a != b)


class Capture:
    """tcpdump on the client's eth0 (ARP and ICMP, with MACs and epoch timestamps)."""

    LINE = re.compile(r"^(?P<ts>\d+\.\d+) (?P<src>[0-9a-f:]{17}) > (?P<dst>[0-9a-f:]{17}), (?P<rest>.*)$")

    def __init__(self, seg: Segment, path: Path, expr: str = "arp or icmp or icmp6") -> None:
        self.path = path
        fh = open(path, "w")  # noqa: SIM115
        self.proc = seg.popen(seg.client.ns, ["tcpdump", "-i", "eth0", "-l", "-n", "-e", "-tt", "-U", expr],
                              stdout=fh, stderr=subprocess.DEVNULL)
        fh.close()
        time.sleep(0.6)  # tcpdump needs a moment before it captures

    def lines(self) -> list[dict]:
        out = []
        for line in self.path.read_text().splitlines():
            m = self.LINE.match(line)
            if m:
                out.append({"ts": float(m["ts"]), "src": m["src"], "dst": m["dst"], "rest": m["rest"]})
        return out

    def gratuitous(self, ip: str, mac: str | None = None, after: float = 0.0) -> list[dict]:
        """Gratuitous ARP (request or reply form, sender = target = ip) seen after ``after``."""
        ip_re = re.escape(ip)
        pat = re.compile(rf"(Request who-has {ip_re}( \([^)]*\))? tell {ip_re},|Reply {ip_re} is-at )")
        return [x for x in self.lines() if x["ts"] >= after and pat.search(x["rest"])
                and (mac is None or x["src"] == mac)]

    def icmp_replies(self, ip: str, after: float = 0.0) -> list[dict]:
        return [x for x in self.lines() if x["ts"] >= after and f"{ip} > " in x["rest"]
                and "echo reply" in x["rest"]]


class VipWatch:
    """Slow HTTP servers on every node (start_slow_http), a client that asks who answers ARP for every VIP
    every ``interval`` s into ``samples`` (arp_sampler.py) and GETs each VIP back to back for ``seconds``;
    ready once every VIP is served by its leader (``vips``)."""

    def __init__(self, c: SpeakerCluster, vips: dict[str, str], samples: Path, interval: float, window: float,
                 seconds: float) -> None:
        start_slow_http(c)
        self.samples = samples
        sampler_py = Path(__file__).resolve().parent / "arp_sampler.py"
        with open(samples, "w") as fh:  # the child keeps its own descriptor
            self.sampler = c.seg.popen(c.seg.client.ns, [sys.executable, "-u", str(sampler_py), "eth0",
                                                         str(interval), str(window), *sorted(vips)], stdout=fh)
        self.polls = {ip: HttpPoller(c.seg, f"http://{ip}:8090/", seconds) for ip in vips}
        for ip, leader in vips.items():
            c.wait(lambda ip=ip, leader=leader: self.polls[ip].served_by(leader, 0), 20, f"{ip} served by {leader}")

    def stop(self, t0: float, t_end: float) -> tuple[dict[str, list], dict[str, list[dict]]]:
        """Stop the sampler and the GETs; (ARP samples per VIP, failed GETs per VIP) from ``t0`` to ``t_end``."""
        import arp_sampler  # noqa: PLC0415 - beside this module, only the tests that watch need it

        self.sampler.send_signal(signal.SIGTERM)
        self.sampler.wait(timeout=5)
        for p in self.polls.values():
            p.stop()
        failed = {ip: [f for f in p.failed if t0 <= f["t"] <= t_end] for ip, p in self.polls.items()}
        return arp_sampler.load(self.samples, t0, t_end), failed
