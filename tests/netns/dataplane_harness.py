"""A data-plane lab in namespaces: two directors, two real servers, a client on another subnet.

One Ethernet segment (netns.make_segment, 4 hosts + client)::

    n1, n2   directors 198.51.100.11/.12, each running DataplaneMode (a small runner process)
    n3, n4   real servers 198.51.100.13/.14: TCP and UDP on port 80 answer their own name
    c        client 192.0.2.10/24 (another subnet on the same wire, so NAT replies must go
             back through a director), reaching the VIP through a static neighbour entry
             that names the director in charge (a takeover = re-pointing it)

The real servers are prepared per method as the realserver role does: NAT -> default route
via the director; full-NAT -> nothing; DR -> VIP on lo with arp_ignore=1/arp_announce=2 and
the client's subnet on-link (replies go straight to the client).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator

import yaml

VIP = "198.51.100.200"
CLIENT = "192.0.2.10"
CLIENT_NET = "192.0.2.0/24"

SERVER_CODE = r"""
import socket, socketserver, sys, threading
name = sys.argv[1]
class T(socketserver.BaseRequestHandler):
    def handle(self):
        try:
            self.request.settimeout(5)
            data = self.request.recv(100)
            if data.startswith(b"HOLD"):
                while True:  # a long-lived connection: echo its name on every line
                    self.request.sendall(name.encode() + b"\n")
                    if not self.request.recv(100):
                        return
            else:
                self.request.sendall(name.encode() + b" " + str(self.client_address[0]).encode() + b"\n")
        except OSError:
            pass
class U(socketserver.BaseRequestHandler):
    def handle(self):
        self.request[1].sendto(name.encode() + b" " + str(self.client_address[0]).encode(), self.client_address)
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.daemon_threads = True
t = socketserver.ThreadingTCPServer(("0.0.0.0", 80), T)
u = socketserver.UDPServer(("0.0.0.0", 80), U)
threading.Thread(target=u.serve_forever, daemon=True).start()
print("ready", flush=True)
t.serve_forever()
"""

RUNNER_CODE = r"""
import json, logging, sys, yaml
from nocloudlb.core.election import NodeView
from nocloudlb.core.schema import parse_resources
from nocloudlb.dataplane import DataplaneMode
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
me = sys.argv[1]
mode = DataplaneMode(registry=None)
mode.start()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    try:
        if cmd == "apply":
            with open(arg) as f:
                parsed = parse_resources(yaml.safe_load(f))
            mode.apply(me, [NodeView(me, {}, "alive", frozenset())], parsed)
            out = {"ok": True}
        elif cmd == "sync":
            out = {"ok": True, "ran": mode.sync()}
        elif cmd == "status":
            out = mode.status()
        elif cmd == "quit":
            mode.close()
            print(json.dumps({"ok": True}), flush=True)
            break
        else:
            out = {"ok": False}
    except Exception as exc:
        out = {"ok": False, "error": repr(exc)}
    print(json.dumps(out), flush=True)
"""


def resources(method: str, scheduler: str, health: str | None = None, servers: list | None = None,
              ports: tuple[tuple[int, str], ...] = ((80, "TCP"), (80, "UDP")), **extra) -> list[dict]:
    spec: dict = {"method": method, "scheduler": scheduler,
                  "servers": [a if isinstance(a, dict) else {"address": a}
                              for a in servers or ["198.51.100.13", "198.51.100.14"]], **extra}
    if health:
        spec["healthCheck"] = health
    return [
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "p"},
         "spec": {"addresses": ["198.51.100.200-198.51.100.210"]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "l2"}, "spec": {}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "prod"},
         "spec": {"type": "LoadBalancer", "ports": [{"port": p, "protocol": pr} for p, pr in ports]},
         "status": {"loadBalancer": {"ingress": [{"ip": VIP}]}}},
        {"apiVersion": "nocloud.io/v1alpha1", "kind": "Backends", "metadata": {"name": "web", "namespace": "prod"},
         "spec": spec},
    ]


class Director:
    def __init__(self, seg, host, env: dict[str, str] | None = None) -> None:
        self.seg, self.host = seg, host
        self.proc = seg.popen(host.ns, [sys.executable, "-u", "-c", RUNNER_CODE, host.ns], stdin=subprocess.PIPE,
                              env=env)
        first = self._read()
        assert first.get("ready"), first

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"runner in {self.host.ns} ended: {self.proc.stderr.read() if self.proc.stderr else ''}")
        return json.loads(line)

    def cmd(self, text: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self._read()

    def apply(self, docs: list[dict]) -> None:
        fd, path = tempfile.mkstemp(prefix="dp-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(docs, f)
        assert self.cmd(f"apply {path}")["ok"]
        os.unlink(path)

    def wait_programmed(self, want, timeout: float = 20.0) -> dict:
        """Status once ``want(status)`` holds (the worker runs on its own thread)."""
        end = time.monotonic() + timeout
        st: dict = {}
        while time.monotonic() < end:
            st = self.cmd("status")
            if want(st):
                return st
            time.sleep(0.2)
        raise AssertionError(f"{self.host.ns}: not programmed in {timeout}s: {json.dumps(st)[:2000]}")

    def nft(self) -> str:
        return self.seg.run(self.host.ns, ["nft", "list", "ruleset"]).stdout

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.cmd("quit")
                self.proc.wait(timeout=10)
            except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError):
                self.seg.kill(self.proc)


@contextlib.contextmanager
def directors(seg, env: dict[str, str] | None = None) -> Iterator[Callable[..., Director]]:
    """``director(i)`` starts a speaker on host ``i`` of ``seg`` (with ``env``); all are closed afterwards."""
    made: list[Director] = []

    def director(i: int = 0) -> Director:
        d = Director(seg, seg.hosts[i], env=env)
        made.append(d)
        return d

    try:
        yield director
    finally:
        for d in made:
            d.close()


def backends_of(st: dict, vip: str = VIP, proto: str = "tcp", port: int = 80) -> list[dict]:
    for svc in st.get("services", {}).values():
        for r in svc.get("rules", []):
            if (r["vip"], r["protocol"], r["port"]) == (vip, proto, port):
                return r["backends"]
    return []


def in_table(st: dict) -> set[str]:
    return {b["backend"] for b in backends_of(st) if b["inTable"]}


def prepare(seg, method: str) -> tuple[list, list]:
    """Directors (n1, n2) and real servers (n3, n4) prepared for ``method``; servers started."""
    directors, servers = seg.hosts[:2], seg.hosts[2:4]
    c = seg.client
    seg.run(c.ns, f"ip addr add {CLIENT}/24 dev eth0 && ip route add {VIP}/32 dev eth0 src {CLIENT}")
    for d in directors:
        seg.run(d.ns, f"ip route add {CLIENT_NET} dev eth0 && sysctl -qw net.ipv4.conf.all.send_redirects=0 "
                      "net.ipv4.conf.eth0.send_redirects=0")
    for s in servers:
        if method == "nat":
            seg.run(s.ns, f"ip route add default via {directors[0].ipv4}")
        elif method == "dr":
            seg.run(s.ns, f"ip addr add {VIP}/32 dev lo && sysctl -qw net.ipv4.conf.all.arp_ignore=1 "
                          "net.ipv4.conf.all.arp_announce=2 net.ipv4.conf.eth0.arp_ignore=1 "
                          f"net.ipv4.conf.eth0.arp_announce=2 && ip route add {CLIENT_NET} dev eth0")
        p = seg.popen(s.ns, [sys.executable, "-u", "-c", SERVER_CODE, s.ns.rsplit("-", 1)[1]])
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return directors, servers


def point_client(seg, director) -> None:
    """The client sends the VIP's frames to ``director`` (what the L2 announcer's ARP answer does)."""
    seg.run(seg.client.ns, f"ip neigh replace {VIP} lladdr {director.mac} dev eth0 nud permanent")


CLIENT_CODE = r"""
import json, socket, sys, time
vip, n, proto, base = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
out = []
for i in range(n):
    try:
        if proto == "tcp":
            s = socket.socket()
            s.bind(("0.0.0.0", base + i))
            s.settimeout(3)
            s.connect((vip, 80))
            s.sendall(b"hi\n")
            out.append(s.recv(100).decode().strip())
            s.close()
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("0.0.0.0", base + i))
            s.settimeout(2)
            s.sendto(b"hi", (vip, 80))
            out.append(s.recv(100).decode().strip())
            s.close()
    except OSError as exc:
        out.append("error " + type(exc).__name__)
print(json.dumps(out))
"""

_port_base = [20000]


def requests(seg, n: int, proto: str = "tcp") -> list[str]:
    """``n`` fresh connections (or datagrams) from distinct source ports; each answer is 'name peer'."""
    base = _port_base[0]
    _port_base[0] += n + 7
    out = seg.run(seg.client.ns, [sys.executable, "-c", CLIENT_CODE, VIP, str(n), proto, str(base)],
                  timeout=60 + 4 * n).stdout
    return json.loads(out.strip().splitlines()[-1])


def spread(answers: list[str]) -> Counter:
    return Counter(a.split()[0] for a in answers)


# A client that holds one TCP connection to VIP:80 from a fixed source port and sends a line
# on every line of its stdin, printing each answer ("closed" or "error ..." when it breaks).
# argv: VIP, source port, connect/read timeout in seconds.
HOLD_CODE = r"""
import socket, sys
s = socket.socket()
s.bind(("0.0.0.0", int(sys.argv[2])))
s.settimeout(float(sys.argv[3]))
s.connect((sys.argv[1], 80))
s.sendall(b"HOLD\n")
print(s.recv(100).decode().strip(), flush=True)
for line in sys.stdin:
    try:
        s.sendall(b"more\n")
        print(s.recv(100).decode().strip() or "closed", flush=True)
    except OSError as exc:
        print("error " + type(exc).__name__, flush=True)
"""


STAND_IN = r"""#!/bin/sh
# A stand-in for nft (tests only): runs the real one unless a file in CTL says otherwise.
#   CTL/fail     every run fails (exit 1), as a broken nft would
#   CTL/match    a script holding one of its lines fails, checks (-c) too: nft refusing those rules
#   CTL/garbage  -j prints junk and exits 0; -f runs the real nft, then prints junk on stdout
CTL=@CTL@
REAL=@REAL@
echo "$(date +%s.%N) $*" >> "$CTL/calls"
if [ -e "$CTL/fail" ]; then echo "stand-in: nft fails on command" >&2; exit 1; fi
case " $* " in *" -f "*) script=$(cat);; *) script="";; esac
if [ -e "$CTL/match" ] && printf '%s\n' "$script" | grep -qF -f "$CTL/match"; then
    echo "/dev/stdin:1:1-9: Error: stand-in refuses a rule naming $(head -n1 "$CTL/match")" >&2
    exit 1
fi
if [ -e "$CTL/garbage" ]; then
    case " $* " in *" -j "*) echo '{"nftables": [{"counter": {"name": 12'; echo 'Segmentation fault?'; exit 0;; esac
    if [ -n "$script" ]; then printf '%s\n' "$script" | "$REAL" "$@"; else "$REAL" "$@"; fi
    rc=$?
    echo "@@@ junk ~~~ 0x1f"
    exit $rc
fi
if [ -n "$script" ]; then printf '%s\n' "$script" | exec "$REAL" "$@"; fi
exec "$REAL" "$@"
"""


class NftStandIn:
    """A directory holding the ``nft`` stand-in; ``env`` puts it first on PATH for a Director."""

    def __init__(self, root: str) -> None:
        import shutil

        self.dir = os.path.join(root, "nft-stand-in")
        os.makedirs(self.dir, exist_ok=True)
        real = shutil.which("nft")
        assert real, "nft is not installed"
        path = os.path.join(self.dir, "nft")
        with open(path, "w") as f:
            f.write(STAND_IN.replace("@CTL@", self.dir).replace("@REAL@", real))
        os.chmod(path, 0o755)
        self.env = {"PATH": self.dir + os.pathsep + os.environ.get("PATH", "")}

    def _set(self, name: str, text: str = "") -> None:
        for other in ("fail", "match", "garbage"):
            if other != name and os.path.exists(os.path.join(self.dir, other)):
                os.unlink(os.path.join(self.dir, other))
        if name:
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text + "\n" if text else "")

    def fail(self) -> None:
        self._set("fail")

    def refuse(self, text: str) -> None:
        self._set("match", text)

    def garbage(self) -> None:
        self._set("garbage")

    def works(self) -> None:
        self._set("")

    def calls(self, since: float = 0.0, until: float = 1e12, flag: str = "-f") -> int:
        """Runs since ``since`` (time.time()) whose arguments hold ``flag``."""
        try:
            with open(os.path.join(self.dir, "calls")) as f:
                rows = [line.split(" ", 1) for line in f.read().splitlines()]
        except FileNotFoundError:
            return 0
        return len([r for r in rows if since <= float(r[0]) <= until and flag in r[1].split()])


def service(name: str, vip: str, method: str, scheduler: str, servers: list, **extra) -> list[dict]:
    """Another Service + Backends pair (the pool and L2Advertisement come from ``resources``)."""
    docs = resources(method, scheduler, servers=servers, ports=((80, "TCP"),), **extra)[2:]
    for d in docs:
        d["metadata"]["name"] = name
    docs[0]["status"]["loadBalancer"]["ingress"] = [{"ip": vip}]
    return docs


def route_vip(seg, vip: str, director) -> None:
    """The client reaches ``vip`` on its wire through ``director`` (route and static neighbour)."""
    seg.run(seg.client.ns, f"ip route replace {vip}/32 dev eth0 src {CLIENT} && "
                           f"ip neigh replace {vip} lladdr {director.mac} dev eth0 nud permanent")


# A client that opens TCP connections to VIP:80 one after the other until STOPFILE exists, each
# with a 1 s timeout, and prints {"ok": n, "failed": n, "failures": [[t, why], ...], "by": {name: n}}.
LOOP_CODE = r"""
import json, os, socket, sys, time
vip, stop = sys.argv[1], sys.argv[2]
ok, failures, by = 0, [], {}
while not os.path.exists(stop):
    s = socket.socket()
    s.settimeout(1.0)
    try:
        s.connect((vip, 80))
        s.sendall(b"hi\n")
        name = s.recv(100).decode().split()[0]
        ok += 1
        by[name] = by.get(name, 0) + 1
    except (OSError, IndexError) as exc:
        failures.append([time.time(), type(exc).__name__])
    finally:
        s.close()
    time.sleep(0.01)
print(json.dumps({"ok": ok, "failed": len(failures), "failures": failures, "by": by}), flush=True)
"""


class ClientLoop:
    """LOOP_CODE in the client namespace; ``stop()`` returns its summary."""

    def __init__(self, seg, vip: str, root: str) -> None:
        self.seg = seg
        self.stopfile = os.path.join(root, f"stop-{vip}")
        self.proc = seg.popen(seg.client.ns, [sys.executable, "-u", "-c", LOOP_CODE, vip, self.stopfile])

    def stop(self) -> dict:
        with open(self.stopfile, "w"):
            pass
        out, _err = self.proc.communicate(timeout=15)
        return json.loads(out.strip().splitlines()[-1])
