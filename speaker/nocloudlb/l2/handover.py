"""Handover forwarding: no reset for TCP connections in flight when a VIP moves on purpose.

When a VIP moves while its old owner stays up and this node saw it lead (a drain, an undrain,
so also each node of a rolling restart), the client's ARP/NDP entry flips to the new owner's MAC
at the first gratuitous announcement. A connection the client opened to the old owner just before
is still in flight; its next packets now reach the new owner, which has no socket for it and
answers with a RST.

For ``grace`` seconds after such a move the new owner passes those packets on to the old owner, at
layer 2, from an nftables ``netdev`` ingress hook on the announcing interface::

    TCP to the VIP with SYN and no ACK   -> remember (VIP, client, port): a connection started here
    TCP of a connection started here     -> accept (served here)
    any other TCP to the VIP             -> ether saddr = ours, ether daddr = old owner's MAC,
                                            out of the same interface (the old owner serves it)

The set ``vips4``/``vips6`` carries per-element timeouts (the kernel ends each forwarding on its
own); the MAC map ``prev4``/``prev6`` has none, so this module always knows what it holds. A takeover
from a member only suspected by the heartbeats (heartbeat.py) installs them too, so a false suspicion
resets nothing; one from a member gossip declared dead installs none: a RST is the quickest answer.
Everything lives in the table ``netdev nocloudlb_handover``, replaced at start, deleted at stop.
The ``nft`` command (package nftables) does the work; without it the speaker logs once and goes on.

Off the decision path. ``forward_async`` and ``stop_async`` queue the work for one worker thread,
so an ``nft`` process never delays the thread that decides who answers ARP (withdrawals go first,
then forwarding ends in the background). Every end is one ``nft`` call whatever the kernel expired
meanwhile: a set element is deleted as "add, then delete" (no error when it expired), a map element
is one this module added and tracked. Expired forwardings are forgotten (``expire``) and their map
entries cleaned in the same batched way.
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

TABLE = "nocloudlb_handover"


def _fam(ip: str) -> str:
    """The suffix of the set and map that hold ``ip``: 4 or 6."""
    return "4" if ipaddress.ip_address(ip).version == 4 else "6"


def _mac(iface: str) -> str:
    return Path(f"/sys/class/net/{iface}/address").read_text().strip()


def _ifindex(iface: str) -> int:
    return int(Path(f"/sys/class/net/{iface}/ifindex").read_text())


class HandoverForwarder:
    """Keeps the ``netdev nocloudlb_handover`` table; see the module docstring."""

    def __init__(self, log: logging.Logger, grace: float, nft: str | None = None) -> None:
        self.log = log
        self.grace = grace
        self.nft = nft or shutil.which("nft") or ""
        self._chains: set[str] = set()
        self._lock = threading.RLock()
        self._installed: dict[str, tuple[str, float]] = {}  # ip -> (old owner's MAC, monotonic end)
        self._jobs: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._wlock = threading.Lock()
        self.available = False

    def _run(self, script: str) -> str:
        proc = subprocess.run([self.nft, "-f", "-"], input=script, capture_output=True, text=True, timeout=10,
                              check=False)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip() or f"nft exited with {proc.returncode}")
        return proc.stdout

    def start(self) -> bool:
        """(Re)create the table; False, logged once, when nft is missing or refuses."""
        if not self.nft:
            missing = "the nft command (package nftables) is missing"
            self.log.warning("handoverUnavailable", extra={"event": "handoverUnavailable", "error": missing})
            return False
        secs = max(1, round(self.grace))
        try:
            # add-then-delete: an old table (a crashed run) goes, a missing one is no error
            self._run(f"add table netdev {TABLE}\ndelete table netdev {TABLE}\n"
                      f"table netdev {TABLE} {{\n"
                      f"  map prev4 {{ type ipv4_addr : ether_addr; }}\n"
                      f"  map prev6 {{ type ipv6_addr : ether_addr; }}\n"
                      f"  set vips4 {{ type ipv4_addr; flags timeout; }}\n"
                      f"  set vips6 {{ type ipv6_addr; flags timeout; }}\n"
                      f"  set here4 {{ type ipv4_addr . ipv4_addr . inet_service; flags dynamic, timeout; "
                      f"timeout {secs + 30}s; }}\n"
                      f"  set here6 {{ type ipv6_addr . ipv6_addr . inet_service; flags dynamic, timeout; "
                      f"timeout {secs + 30}s; }}\n"
                      f"}}\n")
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            self.log.warning("handoverUnavailable", extra={"event": "handoverUnavailable", "error": str(exc)})
            return False
        with self._lock:
            self._chains.clear()
            self._installed.clear()
        self.available = True
        return True

    def _chain(self, iface: str) -> str:
        """The ingress chain of ``iface``, made on first use (named by ifindex: any interface name fits)."""
        name = f"in{_ifindex(iface)}"
        if name in self._chains:
            return ""
        mac = _mac(iface)
        self._chains.add(name)
        rules = []
        for l3, proto, fam in (("ip", "ip protocol tcp", "4"), ("ip6", "ip6 nexthdr tcp", "6")):
            vips, here, prev = f"vips{fam}", f"here{fam}", f"prev{fam}"
            flow = f"{l3} daddr . {l3} saddr . tcp sport"
            rules += [
                f"add rule netdev {TABLE} {name} {proto} {l3} daddr @{vips} tcp flags & (syn | ack) == syn "
                f"add @{here} {{ {flow} }} accept",
                f"add rule netdev {TABLE} {name} {proto} {flow} @{here} accept",
                f"add rule netdev {TABLE} {name} {proto} {l3} daddr @{vips} ether saddr set {mac} "
                f"ether daddr set {l3} daddr map @{prev} fwd to \"{iface}\"",
            ]
        return (f"add chain netdev {TABLE} {name} {{ type filter hook ingress device \"{iface}\" priority -500; "
                f"policy accept; }}\n" + "\n".join(rules) + "\n")

    def forward(self, moves: dict[str, tuple[str, list[str]]]) -> list[str]:
        """For each ``ip -> (old owner's MAC, interfaces)``: pass TCP packets to ``ip`` arriving on those
        interfaces that are not ours to that MAC for ``grace`` s. One nft call for all of them (a drain
        moves many VIPs at once); an IP forwarded before is replaced. Returns the IPs forwarded."""
        moves = {ip: (mac, ifs) for ip, (mac, ifs) in moves.items() if mac and ifs}
        if not self.available or not moves:
            return []
        secs = max(1, round(self.grace))

        def install() -> None:
            chains = "".join(self._chain(i) for i in sorted({i for _m, ifs in moves.values() for i in ifs}))
            if chains:
                self._run(chains)
            script = self._end_script([ip for ip in moves if ip in self._installed])
            for ip, (mac, _ifs) in moves.items():
                script += (f"add element netdev {TABLE} prev{_fam(ip)} {{ {ip} : {mac} }}\n"
                           f"add element netdev {TABLE} vips{_fam(ip)} {{ {ip} timeout {secs}s }}\n")
            self._run(script)

        with self._lock:
            try:
                install()
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
                # the table may be gone (`nft flush ruleset`, a restarted nftables.service): make it again
                self.log.warning("handoverFailed", extra={"event": "handoverFailed", "ips": sorted(moves)[:20],
                                                          "error": str(exc), "retry": True})
                try:
                    if not self.start():
                        return []
                    install()
                except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc2:
                    self._chains.clear()  # re-made on the next try
                    self._installed.clear()
                    self.log.warning("handoverFailed", extra={"event": "handoverFailed", "ips": sorted(moves)[:20],
                                                              "error": str(exc2)})
                    return []
            until = time.monotonic() + secs
            for ip, (mac, _ifs) in moves.items():
                self._installed[ip] = (mac, until)
        self.log.info("handoverForwarding", extra={"event": "handoverForwarding", "seconds": secs,
                                                   "count": len(moves),
                                                   "to": {ip: mac for ip, (mac, _i) in list(moves.items())[:20]}})
        return sorted(moves)

    def _end_script(self, ips: list[str]) -> str:
        """nft commands that end the forwarding of ``ips`` (all in ``_installed``), expired or not."""
        out = ""
        for ip in ips:
            fam = _fam(ip)
            mac = self._installed[ip][0]
            out += (f"add element netdev {TABLE} vips{fam} {{ {ip} timeout 1s }}\n"
                    f"delete element netdev {TABLE} vips{fam} {{ {ip} }}\n"
                    f"add element netdev {TABLE} prev{fam} {{ {ip} : {mac} }}\n"
                    f"delete element netdev {TABLE} prev{fam} {{ {ip} }}\n")
        return out

    def stop_forwarding(self, ips: list[str]) -> None:
        """End the forwarding of ``ips`` now (this node no longer leads them): one nft call for all of
        them, whether the kernel expired some already or not; IPs never forwarded cost nothing."""
        with self._lock:
            mine = [ip for ip in dict.fromkeys(ips) if ip in self._installed]
            if not self.available or not mine:
                return
            try:
                self._run(self._end_script(mine))
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
                # the table went away (flushed): nothing is forwarded any more; it is made again on use
                self.log.warning("handoverFailed", extra={"event": "handoverFailed", "ips": mine[:20],
                                                          "error": str(exc)})
            for ip in mine:
                self._installed.pop(ip, None)

    def expire(self, now: float | None = None) -> list[str]:
        """Forget the forwardings the kernel has ended (their time is up), cleaning their map entries in
        one nft call. Returns the IPs forgotten."""
        now = time.monotonic() if now is None else now
        with self._lock:
            done = sorted(ip for ip, (_mac, until) in self._installed.items() if until + 1.0 <= now)
        if done:
            self.stop_forwarding(done)
        return done

    def forwarded(self) -> list[str]:
        """The IPs whose forwarding this module installed and has not ended or forgotten."""
        with self._lock:
            return sorted(self._installed)

    # -- the worker: nft off the decision thread ------------------------------------------
    def forward_async(self, moves: dict[str, tuple[str, list[str]]],
                      done: Callable[[list[str]], None] | None = None) -> None:
        """``forward`` in the worker thread; ``done(ips forwarded)`` is called after it ran (or failed)."""
        self._submit(("forward", moves, done))

    def stop_async(self, ips: list[str]) -> None:
        """``stop_forwarding`` in the worker thread (the caller has withdrawn those VIPs already)."""
        if ips:
            self._submit(("stop", list(ips), None))

    def _submit(self, job: tuple) -> None:
        with self._wlock:  # never the nft lock: the worker may hold it for a slow nft call
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="l2-handover", daemon=True)
                self._worker.start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=1.0)
            except queue.Empty:
                job = ("expire", None, None)
            if job[0] == "quit":
                return
            try:
                if job[0] == "forward":
                    ips = self.forward(job[1])
                    if job[2] is not None:
                        job[2](ips)
                elif job[0] == "stop":
                    self.stop_forwarding(job[1])
                else:
                    self.expire()
            except Exception as exc:  # noqa: BLE001 - the worker outlives any one job
                self.log.warning("handoverFailed", extra={"event": "handoverFailed", "error": str(exc)})
                if job[0] == "forward" and job[2] is not None:
                    job[2]([])

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until the jobs queued so far ran (tests, close). False on timeout."""
        ev = threading.Event()
        self._submit(("forward", {}, lambda _ips: ev.set()))
        return ev.wait(timeout)

    def close(self) -> None:
        worker = self._worker
        if worker is not None and worker.is_alive():
            self._jobs.put(("quit", None, None))
            worker.join(timeout=5)
        if not self.available:
            return
        self.available = False
        self._installed.clear()
        try:
            self._run(f"delete table netdev {TABLE}\n")
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            self.log.warning("handoverFailed", extra={"event": "handoverFailed", "error": str(exc)})
