"""Established connections across a director move, with and without conntrack state sync.

Built on dataplane_harness's segment (directors n1, n2 running DataplaneMode with the same
rules, real servers n3, n4, client 192.0.2.10). Added here:

- ``LOAD_CODE``: a load generator run in the client namespace. It holds N TCP connections
  through the VIP (default 50), each sending a line every 100 ms and reading the real server's
  answer, and opens new connections at 20/s; it reports per held connection whether it broke
  (reset, close, error) or stalled past 5 s, the longest wait for an answer, and how many new
  connections failed, as one JSON line.
- A floating address (``FLOAT``, 198.51.100.254) held by the director in charge and moved with
  it. NAT's real servers route through it (their default gateway) and full-NAT may use it as
  ``snatAddress``. The harness's own NAT preparation makes n1's own address the gateway, so
  after a move the servers' replies would go on to the old director: a lost director takes the
  replies of every NAT flow with it, whatever happens to the state. keepalived solves this the
  same way (a gateway VIP in the VRRP instance); the move re-points the servers' neighbour entry,
  which is what the new holder's gratuitous ARP does.
- ``Sync``: conntrackd in FTFW mode between n1 and n2 over a second veth pair (203.0.113.1/30 ~
  203.0.113.2/30), each daemon in the foreground under Popen (its PID held, its lock file and UNIX
  socket in a temporary directory). conntrackd 1.4.7 filters by protocol, address and TCP state
  only (no ct mark), so the data plane's flows are selected by ``Address Accept`` on the real
  servers' addresses: a DNAT-ed flow's reply source is its real server.
- ``move``: the director n1 fails (kill -9 of its data-plane process and of its conntrackd, then
  its IP forwarding off: a dead node forwards nothing, while a live kernel under a killed process
  would go on forwarding the replies addressed to n1 itself), then n2 takes over: with sync it
  first commits its external cache into the kernel table (``conntrackd -c``), then the floating
  address moves and the client's neighbour entry for the VIP is re-pointed to n2.

The harness drives bare data-plane processes, not speakers, so it does by hand what the speaker and
its role now do (docs/dataplane.md, "Connection sync"): run conntrackd (the role: its link,
addresses and filter) and commit the external cache before the new leader's gratuitous ARP (the
speaker's ``connectionSync``; tests/netns/test_connsync_speaker.py proves it with real speakers).
What no part of the project does yet: hold a floating gateway for NAT's real servers. Full-NAT needs
none when ``snatAddress`` is the VIP itself (the VIP moves with the speaker); the default masquerade
takes the director's own address, which the synced entries then keep: the replies go on to the dead
director, 50 of 50 stalled in benchmarks/conn_survival.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from dataplane_harness import VIP, Director, in_table, point_client, prepare, resources

FLOAT = "198.51.100.254"
SYNC_NET = ("203.0.113.1", "203.0.113.2")
SERVERS = ("198.51.100.13", "198.51.100.14")

# argv: VIP, held connections, seconds after all are up, new connections per second, stall limit (s).
# Prints "ready N" once the held connections are up (or failed), then one JSON line at the end.
LOAD_CODE = r"""
import json, socket, sys, threading, time
vip, n, seconds, rate, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
lock = threading.Lock()
held = []

def open_held():
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((vip, 80))
        s.sendall(b"HOLD\n")
        name = s.recv(100).decode().strip()
        if not name:
            raise ConnectionError("closed")
        return {"sock": s, "server": name, "maxStall": 0.0, "broken": None, "stalled": False, "answers": 0,
                "switched": False}
    except OSError as exc:
        s.close()
        return {"sock": None, "server": None, "maxStall": 0.0, "broken": "connect " + type(exc).__name__,
                "stalled": False, "answers": 0, "switched": False}

def run_held(c, end):
    s = c["sock"]
    s.settimeout(0.25)
    while time.monotonic() < end:
        tick = time.monotonic()
        try:
            s.sendall(b"more\n")
            sent = time.monotonic()
            data = b""
            while not data.endswith(b"\n"):
                try:
                    chunk = s.recv(100)
                except socket.timeout:
                    waited = time.monotonic() - sent
                    c["maxStall"] = max(c["maxStall"], waited)
                    if waited > limit:
                        c["stalled"] = True
                    if time.monotonic() >= end + limit:
                        return
                    continue
                if not chunk:
                    raise ConnectionError("closed")
                data += chunk
            c["maxStall"] = max(c["maxStall"], time.monotonic() - sent)
            c["answers"] += 1
            if data.decode().strip() != c["server"]:
                c["switched"] = True
        except OSError as exc:
            c["broken"] = type(exc).__name__
            return
        time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))

new = {"ok": 0, "failed": 0, "errors": {}}

def one_new():
    try:
        s = socket.create_connection((vip, 80), timeout=2)
        try:
            s.sendall(b"hi\n")
            if not s.recv(100):
                raise ConnectionError("closed")
        finally:
            s.close()
        with lock:
            new["ok"] += 1
    except OSError as exc:
        with lock:
            new["failed"] += 1
            new["errors"][type(exc).__name__] = new["errors"].get(type(exc).__name__, 0) + 1

for i in range(n):
    held.append(open_held())
print("ready", sum(1 for c in held if c["sock"] is not None), flush=True)
start = time.monotonic()
end = start + seconds
threads = [threading.Thread(target=run_held, args=(c, end)) for c in held if c["sock"] is not None]
for t in threads:
    t.start()
spawned = []
k = 0
while True:
    due = start + k / rate
    if due >= end:
        break
    time.sleep(max(0.0, due - time.monotonic()))
    t = threading.Thread(target=one_new)
    t.start()
    spawned.append(t)
    k += 1
for t in threads + spawned:
    t.join()
for c in held:
    if c["sock"] is not None:
        c["sock"].close()
stalls = sorted(c["maxStall"] for c in held if c["sock"] is not None)
print(json.dumps({
    "held": n,
    "established": len(stalls),
    "broken": sum(1 for c in held if c["broken"]),
    "stalled": sum(1 for c in held if c["stalled"] and not c["broken"]),
    "switched": sum(1 for c in held if c["switched"]),
    "why": {w: sum(1 for c in held if c["broken"] == w) for w in {c["broken"] for c in held if c["broken"]}},
    "stallP50": stalls[len(stalls) // 2] if stalls else None,
    "stallMax": stalls[-1] if stalls else None,
    "perConnection": [{"server": c["server"], "broken": c["broken"], "stalled": c["stalled"],
                       "maxStall": round(c["maxStall"], 3), "answers": c["answers"]} for c in held],
    "new": new,
}), flush=True)
"""


CONF = """Sync {{
    Mode FTFW {{
        DisableExternalCache off
        CommitTimeout 1800
        PurgeTimeout 5
    }}
    UDP {{
        IPv4_address {me}
        IPv4_Destination_Address {peer}
        Port 3780
        Interface sync0
        SndSocketBuffer 1249280
        RcvSocketBuffer 1249280
        Checksum on
    }}
}}
General {{
    HashSize 8192
    HashLimit 65536
    LogFile {log}
    Syslog off
    LockFile {lock}
    UNIX {{
        Path {sock}
    }}
    NetlinkBufferSize 2097152
    NetlinkBufferSizeMaxGrowth 8388608
    Filter From Userspace {{
        Protocol Accept {{
            TCP
            UDP
        }}
        Address Accept {{
{addresses}
        }}
    }}
}}
"""


class Sync:
    """conntrackd FTFW between the directors n1 and n2 over a dedicated veth pair ``sync0``."""

    def __init__(self, seg, root: str, servers: tuple[str, ...] = SERVERS) -> None:
        self.seg = seg
        self.root = tempfile.mkdtemp(prefix="ctd-", dir=root)
        n1, n2 = seg.hosts[0], seg.hosts[1]
        seg.run(n1.ns, f"ip link add sync0 type veth peer name sync0 netns {n2.ns}")
        self.procs: list[subprocess.Popen] = []
        self.confs: list[str] = []
        self.logs = []
        for i, (host, me, peer) in enumerate(((n1, SYNC_NET[0], SYNC_NET[1]), (n2, SYNC_NET[1], SYNC_NET[0]))):
            seg.run(host.ns, f"ip addr add {me}/30 dev sync0 && ip link set sync0 up")
            conf = os.path.join(self.root, f"d{i}.conf")
            with open(conf, "w") as f:
                f.write(CONF.format(me=me, peer=peer, log=os.path.join(self.root, f"d{i}.log"),
                                    lock=os.path.join(self.root, f"d{i}.lock"),
                                    sock=os.path.join(self.root, f"d{i}.ctl"),
                                    addresses="\n".join(f"            IPv4_address {a}" for a in servers)))
            self.confs.append(conf)
        for i, host in enumerate((n1, n2)):
            out = open(os.path.join(self.root, f"d{i}.out"), "w")  # noqa: SIM115 - closed in close()
            self.logs.append(out)
            self.procs.append(seg.popen(host.ns, ["conntrackd", "-C", self.confs[i]], stdout=out, stderr=out))
        end = time.monotonic() + 10
        while not all(os.path.exists(os.path.join(self.root, f"d{i}.ctl")) for i in range(2)):
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"conntrackd ended: {self.log()}")
            if time.monotonic() > end:
                raise RuntimeError(f"conntrackd not ready in 10 s: {self.log()}")
            time.sleep(0.05)
        self.started = time.monotonic()
        self.bytes0 = self.sync_bytes()

    def log(self) -> str:
        text = []
        for name in sorted(os.listdir(self.root)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.root, name)) as f:
                    text.append(f"{name}: {f.read()[-2000:]}")
        return "\n".join(text)

    def ctl(self, i: int, *args: str, timeout: float = 30) -> str:
        return self.seg.run(self.seg.hosts[i].ns, ["conntrackd", "-C", self.confs[i], *args], timeout=timeout).stdout

    def external(self, i: int) -> int:
        """Entries in director ``i``'s external cache (what the peer sent)."""
        return len([line for line in self.ctl(i, "-e").splitlines() if line.strip().startswith(("tcp", "udp"))])

    def commit(self, i: int) -> float:
        """Commit director ``i``'s external cache into its kernel table; seconds it took."""
        t0 = time.monotonic()
        self.ctl(i, "-c")
        return time.monotonic() - t0

    def sync_bytes(self) -> int:
        """Bytes sent plus received on n1's sync link."""
        out = self.seg.run(self.seg.hosts[0].ns, ["ip", "-j", "-s", "link", "show", "sync0"]).stdout
        st = json.loads(out)[0]["stats64"]
        return int(st["rx"]["bytes"]) + int(st["tx"]["bytes"])

    def cpu(self) -> float:
        """CPU seconds (user + system) of both daemons so far (a killed one counts what it had used)."""
        total = 0.0
        tick = os.sysconf("SC_CLK_TCK")
        for i, p in enumerate(self.procs):
            if p.poll() is None:
                with open(f"/proc/{p.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                self.last_cpu[i] = (int(fields[11]) + int(fields[12])) / tick
            total += self.last_cpu.get(i, 0.0)
        return total

    last_cpu: dict[int, float]

    def kill(self, i: int) -> None:
        self.cpu()
        self.seg.kill(self.procs[i], sig=signal.SIGKILL)

    def close(self) -> None:
        for p in self.procs:
            self.seg.kill(p)
        for f in self.logs:
            f.close()


@dataclass
class Lab:
    """The segment prepared for one method, both directors programmed, n1 in charge."""

    seg: object
    method: str
    d1: Director
    d2: Director
    sync: Sync | None = None
    timings: dict = field(default_factory=dict)


def build(seg, root: str, method: str, scheduler: str, snat: str | None = "float", sync: bool = False) -> Lab:
    """``method`` nat | fullnat | dr with ``scheduler``; full-NAT's source is FLOAT (``snat="float"``)
    or the director's own address (``snat=None``, masquerade)."""
    prepare(seg, "dr" if method == "dr" else "fullnat")  # fullnat: the servers' routing untouched
    n1, n2 = seg.hosts[0], seg.hosts[1]
    if method != "dr":
        seg.run(n1.ns, f"ip addr add {FLOAT}/24 dev eth0")
        for s in seg.hosts[2:4]:
            if method == "nat":
                seg.run(s.ns, f"ip route add default via {FLOAT}")
            seg.run(s.ns, f"ip neigh replace {FLOAT} lladdr {n1.mac} dev eth0 nud reachable")
    extra = {"snatAddress": FLOAT} if method == "fullnat" and snat == "float" else {}
    docs = resources(method, scheduler, ports=((80, "TCP"),), **extra)
    d1, d2 = Director(seg, n1), Director(seg, n2)
    for d in (d1, d2):
        d.apply(docs)
        d.wait_programmed(lambda st: len(in_table(st)) == 2)
    lab = Lab(seg, method, d1, d2)
    if sync:
        lab.sync = Sync(seg, root)
        lab.sync.last_cpu = {}
    point_client(seg, n1)
    return lab


def move(lab: Lab) -> dict:
    """n1 fails (kill -9 of its data-plane process and its conntrackd), n2 takes over."""
    seg = lab.seg
    n1, n2 = seg.hosts[0], seg.hosts[1]
    out: dict = {}
    if lab.sync is not None:
        out["externalBefore"] = lab.sync.external(1)
        lab.sync.kill(0)
    seg.kill(lab.d1.proc, sig=signal.SIGKILL)
    # the node is gone: its kernel forwards nothing more (kill -9 alone would leave n1's tables and
    # conntrack forwarding whatever still reaches it, which hides a source address that does not move)
    seg.run(n1.ns, "sysctl -qw net.ipv4.ip_forward=0")
    if lab.sync is not None:  # the state first, then the traffic
        out["commitSeconds"] = round(lab.sync.commit(1), 3)
    if lab.method != "dr":
        seg.run(n1.ns, f"ip addr del {FLOAT}/24 dev eth0")
        seg.run(n2.ns, f"ip addr add {FLOAT}/24 dev eth0")
        for s in seg.hosts[2:4]:  # the gratuitous ARP of the new holder
            seg.run(s.ns, f"ip neigh replace {FLOAT} lladdr {n2.mac} dev eth0 nud reachable")
    point_client(seg, n2)
    return out


def run_case(seg, root: str, method: str, scheduler: str, sync: bool, snat: str | None = "float",
             conns: int = 50, seconds: float = 8.0, move_after: float = 3.0, rate: float = 20.0) -> dict:
    """One measured move: the load for ``seconds``, the move ``move_after`` s into it. Returns the
    load generator's JSON plus the move's details, sync bytes/s and conntrackd CPU seconds."""
    lab = build(seg, root, method, scheduler, snat=snat, sync=sync)
    load = seg.popen(seg.client.ns, [sys.executable, "-u", "-c", LOAD_CODE, VIP, str(conns), str(seconds),
                                     str(rate), "5"], stdin=subprocess.DEVNULL)
    assert load.stdout is not None
    ready = load.stdout.readline().split()
    assert ready and ready[0] == "ready", (ready, load.stderr.read() if load.stderr else "")
    time.sleep(move_after)
    moved = move(lab)
    out, err = load.communicate(timeout=seconds + 30)
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err}
    result.update(method=method, scheduler=scheduler, sync=sync, snat=snat if method == "fullnat" else None,
                  move=moved)
    if lab.sync is not None:
        elapsed = time.monotonic() - lab.sync.started
        result["syncBytesPerSecond"] = round((lab.sync.sync_bytes() - lab.sync.bytes0) / elapsed)
        result["conntrackdCpuSeconds"] = round(lab.sync.cpu(), 3)
        result["kernelEntriesN2"] = len([line for line in seg.run(
            seg.hosts[1].ns, ["conntrack", "-L"]).stdout.splitlines() if "dport=80" in line])
        lab.sync.close()
    lab.d2.close()
    return result
