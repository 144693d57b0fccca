"""The announcer's table of the addresses it was given: ip -> Vip, the ones under check (watched
by the responder process), the conflicts found, and which interface answers which address.

Part of the announcer (announcer.py), used with its lock held. Starting or stopping to answer an
address is told to the responder child at once and, for IPv6, joins or leaves its solicited-node
group (mcast.py).
"""

from __future__ import annotations

from typing import Any

from . import ndp
from .addresses import parse as parse_ip
from .links import Links
from .mcast import Groups
from .tables import Vip, Watched

Wanted = dict[str, tuple[str, ...]]  # ip -> interface names (() : every eligible one)


def parse_wanted(vips: dict[str, list[str]], known: dict[str, Vip]) -> tuple[Wanted, dict[str, tuple[bytes, int]]]:
    """``set_announced``'s argument checked: ip -> sorted interface names, and (packed, version) of each
    address not in ``known`` (its keys are canonical already: not parsed again, 10,000 VIPs).
    Raises ValueError naming the first invalid address or interface list."""
    wanted: dict[str, tuple[str, ...]] = {}
    parsed: dict[str, tuple[bytes, int]] = {}
    for ip, ifs in vips.items():
        if ip not in known:
            try:
                ip, packed, version = parse_ip(ip)
            except ValueError:
                raise ValueError(f"set_announced: {ip!r} is not an IP address") from None
            parsed[ip] = (packed, version)
        if isinstance(ifs, list) and not ifs:  # the usual case (every eligible interface): nothing to check
            wanted[ip] = ()
            continue
        if isinstance(ifs, str) or not all(isinstance(i, str) and i for i in ifs):
            raise ValueError(f"set_announced: interfaces of {ip} must be a list of names, got {ifs!r}")
        wanted[ip] = tuple(sorted(set(ifs))) if ifs else ()
    return wanted, parsed


class VipTable:
    """``vips`` (ip -> Vip), ``checking`` (packed ip -> Vip under check), ``conflicts`` (ip -> record)."""

    def __init__(self, links: Links, groups: Groups, resp: Any, vips: dict[str, Vip]) -> None:
        self.links = links
        self.groups = groups
        self.resp = resp  # the responder client: told every change of what is answered or watched
        self.vips = vips  # shared with ``links`` (the interfaces the addresses name are opened, reported on)
        self.checking: dict[bytes, Vip] = Watched(self._watch_changed)
        self.conflicts: dict[str, dict] = {}
        self.gen = 0

    def _watch_changed(self, packed: bytes, added: bool) -> None:
        self.resp.send(f"{'W' if added else 'U'} {packed.hex()}")

    def add(self, ip: str, packed: bytes, version: int, wanted: tuple[str, ...]) -> Vip:
        """A new address (its own generation: timers and frames of an earlier one are void)."""
        self.gen += 1
        vip = Vip(ip, packed, version, wanted, self.gen)
        self.vips[ip] = vip
        vip.ifaces = set(self.links.resolve(vip))
        return vip

    def current(self, ip: str, gen: int) -> Vip | None:
        vip = self.vips.get(ip)
        return vip if vip is not None and vip.gen == gen else None

    def start_answering(self, vip: Vip, name: str) -> None:
        iface = self.links.ifaces.get(name)
        if iface is None:
            return
        if vip.version == 6:
            self.groups.join(iface, ndp.solicited_node(vip.packed))
        iface.answer.add(vip.packed)
        self.resp.send(f"A {name} {vip.packed.hex()}")

    def stop_answering(self, vip: Vip, name: str) -> None:
        iface = self.links.ifaces.get(name)
        if iface is None:
            return
        iface.answer.discard(vip.packed)
        self.resp.send(f"D {name} {vip.packed.hex()}")
        if vip.version == 6:
            self.groups.leave(iface, ndp.solicited_node(vip.packed))

    def withdraw(self, ip: str) -> None:
        vip = self.vips.pop(ip)
        self.checking.pop(vip.packed, None)
        if vip.state == "announcing":
            for name in vip.ifaces:
                self.stop_answering(vip, name)
        self.conflicts.pop(ip, None)

    def states(self) -> dict[str, str]:
        return {ip: v.state for ip, v in self.vips.items()}

    def unanswered(self) -> set[str]:
        return {ip for ip, v in self.vips.items() if v.state == "announcing" and not v.ifaces}

    def conflict_list(self) -> list[dict]:
        return [dict(c) for c in self.conflicts.values()]
