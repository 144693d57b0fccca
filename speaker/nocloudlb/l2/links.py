"""The interfaces the announcer uses: what the last netlink scan found, which of them are
eligible, one raw AF_PACKET socket per interface in use (opened and closed as interfaces come and
go), and the report of the interfaces it was asked for but cannot announce on.

Part of the announcer (announcer.py), called with its lock held. The announcer re-applies its
VIPs' interfaces after a scan that changed something (``scan`` returns True then).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from . import arp
from .bpf import ARP_NDP_PROGRAM, DROP_ALL, open_packet_socket
from .interfaces import EXCLUDED, Interface, interfaces, unusable
from .poller import Poller
from .tables import Iface, Vip


class Links:
    """``ifaces`` (name -> Iface, the sockets in use), ``info``/``others``/``eligible`` (the last scan),
    ``watched``/``unusable`` (the interface report)."""

    def __init__(self, log: logging.Logger, metrics: Any, poller: Poller, resp: Any, vips: dict[str, Vip], *,
                 rescan_interval: float, burst: int, fallback: Callable[[], bool]) -> None:
        self.log = log
        self.metrics = metrics
        self.poller = poller
        self.resp = resp  # the responder client: told of each socket opened or closed
        self.vips = vips  # the announcer's addresses: the interfaces they name are opened and reported on
        self.rescan_interval = rescan_interval
        self.burst = burst
        self.fallback = fallback  # the announcer answers itself (no responder child has the state)
        # queued frames of a closed interface will never leave (set by the announcer: a probe must not stall)
        self.on_close: Callable[[Iface, float], None] = lambda iface, now: None
        self.ifaces: dict[str, Iface] = {}
        self.eligible: list[str] = []
        self.info: dict[str, Interface] = {}
        self.others: dict[str, str] = {}  # links that are not Ethernet: name -> why (interfaces())
        # interface names to report on (the L2Advertisements selecting this node), and whether one of them asks
        # for every eligible interface (watch_interfaces); what is wrong with them: name -> report entry
        self.watched: tuple[frozenset[str], bool] = (frozenset(), False)
        self.unusable: dict[str, dict] = {}
        self.next_rescan = 0.0
        self.rescan_now = False  # a send or receive failed: scan at the next loop pass

    def resolve(self, vip: Vip) -> list[str]:
        """The interfaces ``vip`` is announced on now."""
        if not vip.wanted:
            return list(self.eligible)
        return [n for n in vip.wanted if n in self.info and self.info[n].announceable]  # edges (issue 8 defect 3)

    def scan(self) -> bool:
        """Re-read interfaces; open/close sockets. True when something changed (the VIPs' interfaces are
        then resolved again by the caller)."""
        others: dict[str, str] = {}
        try:
            info = interfaces(with_addresses=False, others=others)
        except Exception as exc:  # noqa: BLE001 - netlink hiccup: keep the current view
            self.log.warning("interfaceScanFailed", extra={"event": "interfaceScanFailed", "error": str(exc)})
            return False
        before = (self.info, self.eligible, {n: (i.index, i.mac) for n, i in self.ifaces.items()})
        self.info, self.others = info, others
        # edges (issue 8 defect 3): announceable = up and not a bridge port/bond slave/tap/NOARP
        self.eligible = sorted(n for n, i in info.items() if i.announceable and not EXCLUDED.match(n))
        self.report()  # issue 20 part 6: say what is wrong with the interfaces asked for
        needed = set(self.eligible)
        for vip in self.vips.values():
            needed.update(n for n in vip.wanted if n in info and info[n].announceable)
        for name in list(self.ifaces):
            cur = self.ifaces[name]
            i = info.get(name)
            if name not in needed or i is None or i.index != cur.index or arp.mac_bytes(i.mac) != cur.mac:
                self.close(name)
        for name in sorted(needed - set(self.ifaces)):
            self.open(info[name])
        self.next_rescan = time.monotonic() + self.rescan_interval
        # nothing changed: no pass over every VIP (a cost at 10,000 VIPs every rescan_interval)
        return before != (info, self.eligible, {n: (i.index, i.mac) for n, i in self.ifaces.items()})

    def open(self, info: Interface) -> None:
        try:
            sock = open_packet_socket(info.name, ARP_NDP_PROGRAM if self.fallback() else DROP_ALL)
        except OSError as exc:
            self.log.warning("interfaceOpenFailed",
                             extra={"event": "interfaceOpenFailed", "iface": info.name, "error": str(exc)})
            return
        iface = Iface(info.name, info.index, arp.mac_bytes(info.mac), sock,
                      tokens=float(self.burst), refilled=time.monotonic())
        self.ifaces[info.name] = iface
        self.poller.register(sock, iface)
        self.resp.send(f"I {info.name} {info.index} {iface.mac.hex()}")
        self.log.info("interfaceAdded", extra={"event": "interfaceAdded", "iface": info.name})

    def close(self, name: str) -> None:
        iface = self.ifaces.pop(name)
        self.poller.unregister(iface.sock)
        iface.answer.clear()
        now = time.monotonic()
        iface.urgent.clear()  # joins and takeover frames: the socket that would send them is gone
        self.on_close(iface, now)  # probes that will never leave: do not stall the check
        iface.queue.clear()
        iface.sock.close()
        self.resp.send(f"C {name}")
        for m in iface.mcast:
            m.close()  # leaves its groups
        self.log.info("interfaceRemoved", extra={"event": "interfaceRemoved", "iface": name})

    def send(self, iface: Iface, frame: bytes) -> bool:
        try:
            iface.sock.send(frame)
            return True
        except OSError as exc:
            self.log.warning("sendFailed", extra={"event": "sendFailed", "iface": iface.name, "error": str(exc)})
            self.rescan_now = True
            return False

    def macs(self) -> dict[str, str]:
        return {n: arp.mac_str(i.mac) for n, i in self.ifaces.items()}

    def own_mac(self, mac: bytes) -> bool:
        """``mac`` is one of this node's interfaces in use."""
        return any(mac == i.mac for i in self.ifaces.values())

    # -- the interface report -------------------------------------------------------------
    def watch(self, names: frozenset[str], all_eligible: bool) -> None:
        watched = (names, all_eligible)
        if watched != self.watched:
            self.watched = watched
            self.report()

    def report_view(self) -> dict:
        return {"watched": sorted(self.watched[0]), "allEligible": self.watched[1],
                "eligible": list(self.eligible),
                "unusable": [dict(v) for _n, v in sorted(self.unusable.items())]}

    def report(self) -> None:
        """Work out ``unusable`` from the last scan; log and count each change."""
        names = set(self.watched[0])
        for vip in self.vips.values():
            names.update(vip.wanted)
        found: dict[str, tuple[str, str]] = {}
        for name in names:
            reason, detail = unusable(name, self.info, self.others)
            if reason:
                found[name] = (reason, detail)
        if self.watched[1] and not self.eligible:
            found["*"] = ("noEligible", "no interface of this node may announce: "
                          + (", ".join(f"{n} ({unusable(n, self.info, self.others)[0] or 'excluded by name'})"
                                       for n in sorted(self.info)) or "it has no Ethernet interface"))
        gauge = self.metrics.interface_unusable
        for name in [n for n in self.unusable if found.get(n, ("",))[0] != self.unusable[n]["reason"]]:
            old = self.unusable.pop(name)
            try:
                gauge.remove(name, old["reason"])
            except KeyError:
                pass
            if name not in found:
                self.log.info("interfaceUsable", extra={"event": "interfaceUsable", "iface": name,
                                                        "was": old["reason"]})
        for name, (reason, detail) in sorted(found.items()):
            if name in self.unusable:
                continue
            self.unusable[name] = {"iface": name, "reason": reason, "detail": detail,
                                   "since": datetime.now(UTC).isoformat(timespec="seconds")}
            gauge.labels(name, reason).set(1)
            self.log.warning("interfaceUnusable", extra={
                "event": "interfaceUnusable", "iface": name, "reason": reason,
                "detail": detail if reason == "noCarrier" else f"{detail}: nothing is announced on it"})
