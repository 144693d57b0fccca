"""The announcer's table of the addresses it was given: ip -> Vip, the ones under check (watched
by the responder process), the conflicts found, and which interface answers which address.

Part of the announcer (announcer.py), used with its lock held. Starting or stopping to answer an
address is told to the responder child at once and, for IPv6, joins or leaves its solicited-node
group (mcast.py).

Hand-offs: an address leaving the set in a planned move (``hand_off``) is not withdrawn at once: it is
still answered (never announced again) until another MAC announces it (the member taking it, or
whoever took it if that member died meanwhile), seen by the responder child (which stops answering
on that very frame, ``H``) or by the announcer in the child's place, or until its deadline. It is
then withdrawn as any other address.
Given again meanwhile, it is answered on as before (``resume``): no check; the announcer starts its
gratuitous frames again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from . import ndp
from .addresses import parse as parse_ip
from .links import Links
from .mcast import Groups
from .tables import Vip, Watched

Wanted = dict[str, tuple[str, ...]]  # ip -> interface names (() : every eligible one)


@dataclass
class Handoff:
    vip: Vip
    macs: frozenset[bytes]  # the taker's MACs (any other MAC's announcement ends the hand-off too)
    since: float
    until: float


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
        self.handing: dict[str, Handoff] = {}  # ip -> its hand-off in progress (not in ``vips``)
        self.handing_packed: dict[bytes, str] = {}
        self.handoffs_ended: list[tuple[str, str, float]] = []  # (ip, how, seconds): for the announcer to log

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

    def start_answering(self, vip: Vip, name: str, announce: list[bytes] | None = None) -> None:
        """Answer ``vip`` on ``name``; ``announce``: send these frames first, then answer (the child's ``T``)."""
        iface = self.links.ifaces.get(name)
        if iface is None:
            return
        if vip.version == 6:
            self.groups.join(iface, ndp.solicited_node(vip.packed))
        iface.answer.add(vip.packed)
        if announce:
            self.resp.send(f"T {name} {vip.packed.hex()} {' '.join(f.hex() for f in announce)}")
        else:
            self.resp.send(f"A {name} {vip.packed.hex()}")

    def take(self, vip: Vip, iface: Any, frames: list[bytes]) -> bool:
        """Announce ``vip`` on ``iface`` with ``frames``, then answer it: the responder child does both, in that
        order (``T``, responder.py); while no child runs (this thread answers in its place) the frames are sent
        here first. False when a frame could not be sent here."""
        if self.resp.proc is not None:
            self.start_answering(vip, iface.name, announce=frames)
            return True
        sent = [self.links.send(iface, f) for f in frames]  # every frame, even after a failed one
        self.start_answering(vip, iface.name)
        return all(sent)

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

    def hand_off(self, ip: str, macs: frozenset[bytes], seconds: float) -> None:
        """Leave the set, but answer ``ip`` until another MAC announces it (or ``seconds`` pass); ``macs``: the
        taker's. An address not being answered (under check, in conflict, no interface), or one that the
        taker announced already (seen before this node heard of the move), is withdrawn at once."""
        vip = self.vips.get(ip)
        now = time.monotonic()
        # the taker announced it already (seen before this node heard of the move): nothing to wait for
        seen = vip.claimed if vip is not None else None
        early = seen is not None and seen[0] in macs and now - seen[1] < seconds
        if vip is None or vip.state != "announcing" or not vip.ifaces or not macs or early:
            if vip is not None:
                self.withdraw(ip)
            return
        self.vips.pop(ip)
        self.conflicts.pop(ip, None)
        self.handing[ip] = Handoff(vip, macs, now, now + seconds)
        self.handing_packed[vip.packed] = ip
        for name in vip.ifaces:
            if name in self.links.ifaces:
                self.resp.send(f"H {name} {vip.packed.hex()}")

    def resume(self, ip: str) -> Vip | None:
        """``ip`` is given again while being handed off: answered as before (the child told so), or None."""
        h = self.handing.pop(ip, None)
        if h is None:
            return None
        self.handing_packed.pop(h.vip.packed, None)
        h.vip.claimed = None
        self.vips[ip] = h.vip
        for name in h.vip.ifaces:
            if name in self.links.ifaces:
                self.resp.send(f"A {name} {h.vip.packed.hex()}")
        return h.vip

    def end_handoff(self, ip: str, how: str) -> None:
        h = self.handing.pop(ip, None)
        if h is None:
            return
        self.handing_packed.pop(h.vip.packed, None)
        for name in h.vip.ifaces:
            self.stop_answering(h.vip, name)
        self.handoffs_ended.append((ip, how, time.monotonic() - h.since))

    def claimed(self, ip: str, packed: bytes, mac: bytes) -> bool:
        """Another MAC announced ``ip``: True when that ends its hand-off (then it is no contest). Otherwise
        noted on the address, so that a hand-off asked for later to that MAC ends at once (``hand_off``)."""
        handing = self.handing_packed.get(packed)
        if handing is None:
            vip = self.vips.get(ip)
            if vip is not None:
                vip.claimed = (mac, time.monotonic())
            return False
        self.end_handoff(handing, "announced" if mac in self.handing[handing].macs else "otherAnnounced")
        return True

    def handoff_due(self) -> float | None:
        return min((h.until for h in self.handing.values()), default=None)

    def expire_handoffs(self, now: float) -> None:
        for ip in [ip for ip, h in self.handing.items() if now >= h.until]:
            self.end_handoff(ip, "timeout")

    def end_handoffs(self) -> None:
        for ip in list(self.handing):
            self.end_handoff(ip, "withdrawn")

    def states(self) -> dict[str, str]:
        return {ip: v.state for ip, v in self.vips.items()}

    def unanswered(self) -> set[str]:
        return {ip for ip, v in self.vips.items() if v.state == "announcing" and not v.ifaces}

    def conflict_list(self) -> list[dict]:
        return [dict(c) for c in self.conflicts.values()]
