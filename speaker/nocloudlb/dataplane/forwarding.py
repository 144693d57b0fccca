"""IP forwarding for NAT and full-NAT: on while a rule of that family needs it, whoever turns it off.

NAT and full-NAT route the packets they rewrite, so ``net.ipv4.ip_forward`` (IPv4 rules) and
``net.ipv6.conf.all.forwarding`` (IPv6 rules) must be 1. Something else may write them (FRR's
``no ip forwarding`` in a reloaded frr.conf, an operator, a sysctl.d file at a restart of
systemd-sysctl): ``check`` reads them and writes 1 back when it finds 0; the data plane calls it
every second and at every apply. The first write is logged ``forwardingEnabled``; a later one,
after forwarding was seen on, ``forwardingReasserted`` (a warning) and counted.

IPv6: a host that forwards ignores router advertisements on interfaces with ``accept_ra=1``, and
turning forwarding on purges the default routes learned from them (the kernel keeps only those
learned on interfaces with ``accept_ra=2``). So, before it writes the forwarding switch, and at
every sweep, every interface (and ``default``, for interfaces made later) with ``accept_ra=1`` is
set to 2: a node that takes its default route from RA keeps it and goes on accepting RAs.
Interfaces with ``accept_ra=0`` are left alone.
"""

from __future__ import annotations

import logging
import os
import threading

from ..logs import event

SWITCH = {4: "ipv4/ip_forward", 6: "ipv6/conf/all/forwarding"}


class Forwarding:
    def __init__(self, log: logging.Logger, root: str = "/proc/sys/net") -> None:
        self.log = log
        self.root = root
        self.need: set[int] = set()  # IP versions the programmed rules need forwarded
        self._lock = threading.Lock()
        self._seen_on: set[int] = set()
        self.enabled = {4: 0, 6: 0}  # writes of 1, the first one included
        self.reasserted = {4: 0, 6: 0}  # writes of 1 after it was seen on (someone turned it off)
        self.accept_ra_fixed = 0  # interfaces moved from accept_ra 1 to 2
        self.error = ""

    def check(self, sweep: bool = False) -> None:
        """Turn forwarding on where needed and off-found; ``sweep``: also fix accept_ra now."""
        with self._lock:
            need = sorted(self.need)
            for v in need:
                self._one(v, sweep)

    def status(self) -> dict:
        with self._lock:
            out: dict = {str(v): {"needed": v in self.need, "on": self._on(v), "enabled": self.enabled[v],
                                  "reasserted": self.reasserted[v]} for v in (4, 6)}
            out["acceptRaFixed"] = self.accept_ra_fixed
            if self.error:
                out["error"] = self.error
            return out

    # -- internals --------------------------------------------------------------------------
    def _one(self, v: int, sweep: bool) -> None:
        path = SWITCH[v]
        try:
            on = self._read(path) == "1"
            if on and not sweep:
                self._seen_on.add(v)
                return
            if v == 6:
                self._keep_ra()  # before the switch: turning it on purges RA routes of accept_ra=1 links
            if on:
                self._seen_on.add(v)
                return
            self._write(path, "1")
        except OSError as exc:
            if self.error != str(exc):
                event(self.log, "dataplaneFailed", f"cannot enable forwarding (net/{path}): {exc}", logging.ERROR,
                      ipVersion=v)
            self.error = str(exc)
            return
        self.error = ""
        if v in self._seen_on:
            self.reasserted[v] += 1
            event(self.log, "forwardingReasserted", f"net/{path} was 0 (turned off by someone else): set to 1 "
                  "again for NAT/full-NAT", logging.WARNING, ipVersion=v, times=self.reasserted[v])
        else:
            event(self.log, "forwardingEnabled", f"net/{path} = 1 for NAT/full-NAT", ipVersion=v)
        self.enabled[v] += 1
        self._seen_on.add(v)

    def _keep_ra(self) -> None:
        base = os.path.join(self.root, "ipv6", "conf")
        fixed = []
        for name in sorted(os.listdir(base)):
            if name == "all":
                continue
            rel = f"ipv6/conf/{name}/accept_ra"
            try:
                if self._read(rel) == "1":
                    self._write(rel, "2")
                    fixed.append(name)
            except FileNotFoundError:
                continue  # the interface went away meanwhile
        if fixed:
            self.accept_ra_fixed += len(fixed)
            event(self.log, "acceptRaKept", "accept_ra 1 -> 2: these interfaces keep accepting router "
                  "advertisements (and the default route learned from them) with IPv6 forwarding on",
                  interfaces=",".join(fixed))

    def _on(self, v: int) -> bool | None:
        try:
            return self._read(SWITCH[v]) == "1"
        except OSError:
            return None

    def _read(self, rel: str) -> str:
        with open(os.path.join(self.root, rel), encoding="ascii") as f:
            return f.read().strip()

    def _write(self, rel: str, value: str) -> None:
        with open(os.path.join(self.root, rel), "w", encoding="ascii") as f:
            f.write(value + "\n")
