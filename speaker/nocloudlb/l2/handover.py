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

Both maps carry per-element timeouts, so the kernel ends each forwarding on its own. A crash (old
owner dead) never installs any: there is nobody to forward to, and a RST is the quickest answer.
Everything lives in the table ``netdev nocloudlb_handover``, replaced at start, deleted at stop.
The ``nft`` command (package nftables) does the work; without it the speaker logs once and goes on.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import subprocess
import threading
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
        self._lock = threading.Lock()
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
                      f"  map prev4 {{ type ipv4_addr : ether_addr; flags timeout; }}\n"
                      f"  map prev6 {{ type ipv6_addr : ether_addr; flags timeout; }}\n"
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
        self._chains.clear()
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
        moves many VIPs at once); an IP forwarded before is replaced alone. Returns the IPs forwarded."""
        moves = {ip: (mac, ifs) for ip, (mac, ifs) in moves.items() if mac and ifs}
        if not self.available or not moves:
            return []
        secs = max(1, round(self.grace))

        def elements(ip: str, mac: str) -> str:
            return (f"add element netdev {TABLE} prev{_fam(ip)} {{ {ip} timeout {secs}s : {mac} }}\n"
                    f"add element netdev {TABLE} vips{_fam(ip)} {{ {ip} timeout {secs}s }}\n")

        def install() -> None:
            chains = "".join(self._chain(i) for i in sorted({i for _m, ifs in moves.values() for i in ifs}))
            if chains:
                self._run(chains)
            try:
                self._run("".join(elements(ip, mac) for ip, (mac, _ifs) in moves.items()))
            except RuntimeError:  # some were forwarded before (to another MAC): one by one
                for ip, (mac, _ifs) in moves.items():
                    self._drop(ip)
                    self._run(elements(ip, mac))

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
                    self.log.warning("handoverFailed", extra={"event": "handoverFailed", "ips": sorted(moves)[:20],
                                                              "error": str(exc2)})
                    return []
        self.log.info("handoverForwarding", extra={"event": "handoverForwarding", "seconds": secs,
                                                   "count": len(moves),
                                                   "to": {ip: mac for ip, (mac, _i) in list(moves.items())[:20]}})
        return sorted(moves)

    def stop_forwarding(self, ips: list[str]) -> None:
        """End the forwarding of ``ips`` now (this node no longer leads them): one nft call for all,
        or one by one when some have expired already (a batch fails on an absent element)."""
        if not self.available or not ips:
            return
        with self._lock:
            try:
                self._run("".join(f"delete element netdev {TABLE} {name}{_fam(ip)} {{ {ip} }}\n"
                                  for ip in ips for name in ("vips", "prev")))
            except (OSError, RuntimeError, subprocess.TimeoutExpired):
                for ip in ips:
                    self._drop(ip)

    def _drop(self, ip: str) -> None:
        """Delete ``ip`` from the set and the map; absent (or expired) is fine."""
        for name in (f"vips{_fam(ip)}", f"prev{_fam(ip)}"):
            try:
                self._run(f"delete element netdev {TABLE} {name} {{ {ip} }}\n")
            except (OSError, RuntimeError, subprocess.TimeoutExpired):
                pass  # not there

    def close(self) -> None:
        if not self.available:
            return
        self.available = False
        try:
            self._run(f"delete table netdev {TABLE}\n")
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            self.log.warning("handoverFailed", extra={"event": "handoverFailed", "error": str(exc)})
