"""Network-namespace test harness: one Ethernet segment with N hosts and a client.

Layout of a segment made by :func:`make_segment` (every name starts with a
per-segment unique prefix such as ``nl2-3fa9c1``, so parallel runs never collide)::

    <prefix>-br      namespace holding bridge ``br0`` and the host side of every veth
    <prefix>-n1..nN  host namespaces, each with ``eth0`` (veth into br0) and ``lo`` up,
                     198.51.100.(10+i)/24 and 2001:db8:1::(10+i)/64 (nodad)
    <prefix>-c       client namespace, ``eth0`` with 198.51.100.2/24, 2001:db8:1::2/64

Only documentation addresses are used and nothing is routed out of the segment.
``Segment.close()`` kills every process started with ``popen`` (by PID, its own
process group), then deletes every namespace it made; deleting a namespace
removes its veth ends and the bridge with it. It is safe to call twice.

Requires root (``ip netns``), iproute2. No pytest dependency, so benchmarks and
scripts can use it too (``with make_segment("bench") as seg: ...``).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

IPV4_NET = "198.51.100"
IPV6_NET = "2001:db8:1::"
CLIENT_SUFFIX = 2
HOST_SUFFIX_BASE = 10  # host i (1-based) gets .10+i, i.e. n1 = 198.51.100.11

Cmd = str | Sequence[str]


class NetnsError(RuntimeError):
    """A namespace command failed; the message names the namespace, command and stderr."""


def _argv(cmd: Cmd) -> list[str]:
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    return [str(c) for c in cmd]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)!s} failed (rc={proc.returncode}): {proc.stderr.strip()}")
    return proc


@dataclass
class Host:
    """One namespace on the segment."""

    ns: str
    iface: str
    ipv4: str
    ipv6: str
    mac: str = ""


@dataclass
class Segment:
    """A bridge segment with hosts and a client; see the module docstring."""

    prefix: str
    bridge_ns: str
    hosts: list[Host]
    client: Host
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)
    _namespaces: list[str] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)
    _ports: int = field(default=0, repr=False)

    # -- running things -------------------------------------------------------------
    def run(
        self,
        ns: str,
        cmd: Cmd,
        check: bool = True,
        timeout: float = 60,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` (argv list, or a string for ``sh -c``) inside namespace ``ns``; wait for it."""
        argv = ["ip", "netns", "exec", ns, *_argv(cmd)]
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, input=input, env=_merge_env(env), check=False
        )
        if check and proc.returncode != 0:
            raise NetnsError(
                f"in {ns}: {shlex.join(_argv(cmd))} failed (rc={proc.returncode})\n"
                f"stdout: {proc.stdout.strip()}\nstderr: {proc.stderr.strip()}"
            )
        return proc

    def popen(self, ns: str, cmd: Cmd, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """Start ``cmd`` inside ``ns`` in its own process group; killed by PID at ``close()``.

        Extra keyword arguments go to ``subprocess.Popen`` (default: stdout/stderr piped, text mode).
        """
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("text", True)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *_argv(cmd)], start_new_session=True, env=_merge_env(env), **kwargs
        )
        self._procs.append(proc)
        return proc

    def python(self, ns: str, code: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run Python ``code`` with this interpreter inside ``ns`` (repository packages importable)."""
        return self.run(ns, [sys.executable, "-c", code], check=check, timeout=timeout)

    def python_json(self, ns: str, code: str, timeout: float = 60):
        """Run ``code`` in ``ns``; it must print one JSON document as its last stdout line. Returns it."""
        out = self.python(ns, code, timeout=timeout).stdout.strip().splitlines()
        if not out:
            raise NetnsError(f"in {ns}: python printed nothing")
        return json.loads(out[-1])

    def popen_python(self, ns: str, code: str, **kwargs) -> subprocess.Popen:
        """Start Python ``code`` inside ``ns`` (unbuffered); killed at ``close()``."""
        return self.popen(ns, [sys.executable, "-u", "-c", code], **kwargs)

    @staticmethod
    def kill(proc: subprocess.Popen, sig: int = signal.SIGTERM, wait: float = 5.0) -> None:
        """Signal the process group of ``proc`` (a process we started), escalate to SIGKILL after ``wait``."""
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=wait)

    def add_link(self, ns: str, ifname: str, up: bool = True) -> str:
        """Another veth from ``ns`` into the bridge, named ``ifname`` inside ``ns`` (no address). Returns its MAC."""
        self._ports += 1
        port = f"x{self._ports}"
        _ip("-n", self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", ifname, "netns", ns)
        _ip("-n", self.bridge_ns, "link", "set", port, "master", "br0", "up")
        if up:
            self.run(ns, ["ip", "link", "set", ifname, "up"])
        return self.mac(ns, ifname)

    def attach(self, name: str, addrs: Sequence[str], mac: str | None = None) -> Host:
        """Another host ``<prefix>-<name>`` with ``eth0`` into the bridge, the given addresses (IPv6
        without DAD) and, if given, that MAC; for tests that want their own addresses and MACs.
        It is added to ``hosts``, or becomes the client when ``name`` is ``c``."""
        ns = f"{self.prefix}-{name}"
        _add_ns(self, ns)
        self._ports += 1
        port = f"x{self._ports}"
        _ip("-n", self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", self.bridge_ns, "link", "set", port, "master", "br0", "up")
        script = ["ip link set lo up"] + ([f"ip link set eth0 address {mac}"] if mac else [])
        script += [f"ip addr add {a} dev eth0" + (" nodad" if ":" in a else "") for a in addrs]
        self.run(ns, " && ".join([*script, "ip link set eth0 up"]))
        v4 = next((a.split("/")[0] for a in addrs if ":" not in a), "")
        v6 = next((a.split("/")[0] for a in addrs if ":" in a), "")
        host = Host(ns=ns, iface="eth0", ipv4=v4, ipv6=v6, mac=self.mac(ns))
        if name == "c":
            self.client = host
        else:
            self.hosts.append(host)
        _wait_carrier(self)
        return host

    # -- facts ----------------------------------------------------------------------
    def mac(self, ns: str, iface: str = "eth0") -> str:
        """MAC address of ``iface`` in ``ns`` (lowercase, colon separated)."""
        out = self.run(ns, ["ip", "-j", "link", "show", "dev", iface]).stdout
        return json.loads(out)[0]["address"]

    def host(self, name: str) -> Host:
        """Host by namespace name or short name (``n1``, ``c``)."""
        for h in [*self.hosts, self.client]:
            if h.ns == name or h.ns == f"{self.prefix}-{name}":
                return h
        raise KeyError(f"no host {name!r} in segment {self.prefix}")

    @property
    def namespaces(self) -> list[str]:
        return list(self._namespaces)

    # -- teardown -------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in reversed(self._procs):
            try:
                self.kill(proc, signal.SIGTERM, wait=3.0)
            except Exception:  # noqa: BLE001 - teardown must go on
                pass
            for stream in (proc.stdout, proc.stderr, proc.stdin):
                if stream is not None:
                    try:
                        stream.close()
                    except Exception:  # noqa: BLE001
                        pass
        for ns in reversed(self._namespaces):
            _ip("netns", "del", ns, check=False)

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _merge_env(env: dict[str, str] | None) -> dict[str, str]:
    merged = dict(os.environ)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # Make the repository's tests/ helpers importable from python run inside a namespace.
    merged["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.join(repo, "tests", "netns"),
                                                       merged.get("PYTHONPATH", "")] if p)
    if env:
        merged.update(env)
    return merged


def unique_prefix(prefix: str) -> str:
    """``prefix`` plus a random suffix, e.g. ``nl2-3fa9c1``."""
    prefix = prefix.rstrip("-")
    if not prefix or len(prefix) > 20 or "/" in prefix or " " in prefix:
        raise ValueError(f"netns prefix must be 1-20 characters without '/' or spaces, got {prefix!r}")
    return f"{prefix}-{secrets.token_hex(3)}"


def make_segment(prefix: str = "nl2", hosts: int = 3, client: bool = True) -> Segment:
    """Build a segment (see module docstring). On any failure everything made so far is removed.

    ``hosts=0, client=False`` gives a bare bridge to which ``Segment.attach`` adds hosts."""
    if not 0 <= hosts <= 80:
        raise ValueError(f"hosts must be between 0 and 80, got {hosts}")
    full = unique_prefix(prefix)
    seg = Segment(prefix=full, bridge_ns=f"{full}-br", hosts=[], client=Host("", "eth0", "", ""))
    try:
        _add_ns(seg, seg.bridge_ns)
        seg.run(seg.bridge_ns, "ip link set lo up && ip link add br0 type bridge && ip link set br0 up"
                " && sysctl -qw net.ipv6.conf.br0.disable_ipv6=1")
        members: list[tuple[str, int, str]] = [(f"{full}-n{i}", HOST_SUFFIX_BASE + i, f"p{i}")
                                               for i in range(1, hosts + 1)]
        if client:
            members.append((f"{full}-c", CLIENT_SUFFIX, "pc"))
        for ns, suffix, port in members:
            _add_ns(seg, ns)
            _ip("-n", seg.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", seg.bridge_ns, "link", "set", port, "master", "br0", "up")
            ipv4, ipv6 = f"{IPV4_NET}.{suffix}", f"{IPV6_NET}{suffix}"
            seg.run(ns, f"ip link set lo up && ip addr add {ipv4}/24 dev eth0"
                        f" && ip addr add {ipv6}/64 dev eth0 nodad && ip link set eth0 up")
            host = Host(ns=ns, iface="eth0", ipv4=ipv4, ipv6=ipv6, mac=seg.mac(ns))
            if ns.endswith("-c"):
                seg.client = host
            else:
                seg.hosts.append(host)
        _wait_carrier(seg)
    except BaseException:
        seg.close()
        raise
    return seg


def _add_ns(seg: Segment, ns: str) -> None:
    _ip("netns", "add", ns)
    seg._namespaces.append(ns)


def _wait_carrier(seg: Segment, timeout: float = 5.0) -> None:
    """Wait until every eth0 has carrier (veth up on both ends) and the bridge ports forward."""
    deadline = time.monotonic() + timeout
    nss = [h.ns for h in seg.hosts] + ([seg.client.ns] if seg.client.ns else [])
    while True:
        pending = [ns for ns in nss if "LOWER_UP" not in seg.run(ns, ["ip", "link", "show", "eth0"]).stdout]
        br = json.loads(seg.run(seg.bridge_ns, ["ip", "-j", "-d", "link", "show", "master", "br0"]).stdout)
        not_fwd = [p["ifname"] for p in br if p.get("linkinfo", {}).get("info_slave_data", {}).get("state")
                   not in (None, "forwarding")]
        if not pending and not not_fwd:
            return
        if time.monotonic() > deadline:
            raise NetnsError(f"segment {seg.prefix}: no carrier on {pending} / ports not forwarding {not_fwd}")
        time.sleep(0.05)


class L2Agent:
    """``python -m nocloudlb.l2 serve`` running in a namespace, driven over stdin/stdout JSON lines."""

    def __init__(self, seg: Segment, ns: str, node: str = "n1", member_macs: Sequence[str] = (), **options) -> None:
        self.seg, self.ns = seg, ns
        members = [a for m in member_macs for a in ("--member-mac", m)]
        self.proc = seg.popen(ns, [sys.executable, "-u", "-m", "nocloudlb.l2", "serve", "--node", node,
                                   "--options", json.dumps(options), *members], stdin=subprocess.PIPE)
        first = self._read(timeout=20)
        if not first.get("ready"):
            raise NetnsError(f"l2 agent in {ns} did not start: {first}")

    def _read(self, timeout: float = 20) -> dict:
        import select

        assert self.proc.stdout is not None and self.proc.stderr is not None
        ready, _wr, _ex = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise NetnsError(f"l2 agent in {self.ns}: no answer within {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            raise NetnsError(f"l2 agent in {self.ns} exited (rc={self.proc.poll()}): {err}")
        return json.loads(line)

    def call(self, **req) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        out = self._read()
        if not out.get("ok"):
            raise NetnsError(f"l2 agent in {self.ns}: {req} -> {out}")
        return out

    def set(self, vips: dict[str, list[str]], skip_check: Sequence[str] = (),
            hand_off: dict[str, list[str]] | None = None, hand_off_seconds: float = 2.5,
            take: Sequence[str] = ()) -> None:
        self.call(cmd="set", vips=vips, skip_check=list(skip_check), hand_off=hand_off or {},
                  hand_off_seconds=hand_off_seconds, take=list(take))

    def stats(self) -> dict:
        return self.call(cmd="stats")["stats"]

    def conflicts(self) -> list[dict]:
        return self.call(cmd="conflicts")["conflicts"]

    def wait_state(self, ip: str, state: str, timeout: float = 5.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            st = self.stats()
            if st["vips"].get(ip, {}).get("state") == state:
                return st
            if time.monotonic() > deadline:
                raise NetnsError(f"l2 agent in {self.ns}: {ip} not {state} after {timeout}s: {st['vips'].get(ip)}")
            time.sleep(0.05)

    def stop(self) -> str:
        """Quit; returns what it logged on stderr."""
        if self.proc.poll() is None:
            try:
                self.call(cmd="quit")
                self.proc.wait(timeout=10)
            except (NetnsError, OSError, subprocess.TimeoutExpired):
                Segment.kill(self.proc)
        return self.proc.stderr.read() if self.proc.stderr else ""


def leftover_namespaces(prefix: str) -> list[str]:
    """Namespaces whose name starts with ``prefix-`` (to clean up after a crashed run by hand)."""
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix.rstrip("-") + "-")]


if __name__ == "__main__":  # pragma: no cover - manual smoke check
    with make_segment("nl2smoke", hosts=int(sys.argv[1]) if len(sys.argv) > 1 else 2) as s:
        print(s)
        print(s.run(s.client.ns, f"ping -c1 -W1 {s.hosts[0].ipv4}").stdout)
