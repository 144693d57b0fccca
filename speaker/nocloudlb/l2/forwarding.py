"""The layer-2 mode's handover bookkeeping: a VIP taken from a live (or only suspected) member is
announced once its in-flight connections are forwarded toward that member's published MAC
(handover.py, in the forwarder's worker), or after HANDOVER_WAIT s (SUSPECT_WAIT for a member only
suspected); the forwardings this node no longer needs are ended.

Part of the layer-2 mode (mode.py), used on its decision thread; ``forwarding``, ``wanted`` and
``ready`` are shared with the forwarder's worker under the mode's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

HANDOVER_WAIT = 2.0  # seconds a planned move waits for its forwarding before it is announced anyway
SUSPECT_WAIT = 0.05  # the same for a takeover from a member only suspected (heartbeats stopped): speed first


def _mac_text(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


class Forwarding:
    """Planned moves waiting for their forwarding, and the forwardings in place."""

    def __init__(self, lock: threading.Lock, handover: Any, member_macs: Callable[[], dict[str, tuple[bytes, ...]]],
                 post: Callable[[], None]) -> None:
        self.lock = lock  # the mode's: ``forwarding``, ``wanted`` and ``ready`` change on the worker too
        self.handover = handover
        self.member_macs = member_macs
        self.post = post
        self.to: dict[str, str] = {}  # ip -> the member its handover forwarding goes to
        self.suspect: set[str] = set()  # ... when that member was only suspected (heartbeats)
        self.wanted: set[str] = set()  # forwardings asked for and not lost since (under lock)
        self.waiting: dict[str, float] = {}  # planned moves waiting for their forwarding: ip -> deadline
        self.ready: set[str] = set()  # planned moves whose forwarding ran
        self.forwarding: set[str] = set()

    def drop_lost(self, final: dict[str, list[str]], new_leader: dict[str, str | None],
                  states: dict[str, str]) -> None:
        """End the forwardings of VIPs this node no longer announces (``final``), and stop waiting for them."""
        with self.lock:
            lost = [ip for ip in self.forwarding if ip not in final]
            self.forwarding.difference_update(lost)
            self.wanted.intersection_update(final)
        # a VIP taken from a suspected member that goes back to it keeps the forwarding until its grace
        # ends (the kernel expires it): clients reach this node until that member's gratuitous ARP.
        # Only then: that member takes it back without forwarding of its own (a planned move back
        # forwards the other way, and two forwardings toward each other would bounce packets)
        lost = [ip for ip in lost if ip not in self.suspect or self.to.get(ip) != new_leader.get(ip)]
        # a member only suspected when this node took its VIPs and since confirmed gone (gossip: dead or
        # left): nothing answers there any more, so its forwarding ends and this node serves them itself
        with self.lock:
            gone = [ip for ip in self.forwarding if ip in self.suspect
                    and states.get(self.to.get(ip, "")) not in ("alive", "suspect", "unreachable")]
            self.forwarding.difference_update(gone)
            self.wanted.difference_update(gone)
        self.suspect.difference_update(gone)
        lost = sorted(set(lost) | set(gone))
        if lost and self.handover is not None:
            self.handover.stop_async(lost)
        for ip in [ip for ip in self.waiting if ip not in final]:
            self.waiting.pop(ip, None)
            self.ready.discard(ip)

    def release(self, held: dict[str, list[str]], skip: set[str], now: float) -> None:
        """Planned moves whose forwarding ran (or whose wait ended) are announced now, without the RFC 5227
        check (``skip``); the others are kept out of ``held`` a while longer."""
        for ip in list(self.waiting):
            if ip in self.ready or now >= self.waiting[ip]:
                self.waiting.pop(ip)
                self.ready.discard(ip)
                skip.add(ip)
        for ip in self.waiting:
            held.pop(ip, None)

    def plan(self, handed: dict[str, str], held: dict[str, list[str]], now: float, announcer: Any,
             waits: dict[str, float] | None = None) -> None:
        """Queue the forwarding of each planned move to its old owner's published MAC; the VIP waits."""
        macs = self.member_macs()
        all_ifaces = announcer.stats().get("interfaces", [])
        moves: dict[str, tuple[str, list[str]]] = {}
        for ip, node in handed.items():
            if ip in self.waiting:
                continue  # its forwarding is being set up already
            theirs = list(macs.get(node) or ())  # the first: a MAC it announces VIPs from
            if not theirs:
                continue  # nothing published: announce at once, no forwarding
            moves[ip] = (_mac_text(theirs[0]), held[ip] or all_ifaces)
            self.to[ip] = node
            if ip in (waits or {}):
                self.suspect.add(ip)
            else:
                self.suspect.discard(ip)
        if not moves:
            return
        for ip in moves:
            self.waiting[ip] = now + (waits or {}).get(ip, HANDOVER_WAIT)
        with self.lock:
            self.wanted.update(moves)
        shortest = min((waits or {}).get(ip, HANDOVER_WAIT) for ip in moves)
        if shortest < HANDOVER_WAIT:  # a suspected takeover: decide again right at its deadline, not a tick later
            timer = threading.Timer(shortest + 0.001, self.post)
            timer.daemon = True
            timer.start()

        wanted = sorted(moves)

        def done(ips: list[str]) -> None:
            with self.lock:
                # still led (announced, waiting, or announced without it after a short wait: a race with
                # the decision thread must not end a forwarding it still wants)
                keep = [ip for ip in ips if ip in self.wanted]
                self.forwarding.update(keep)
                self.ready.update(wanted)
            gone = sorted(set(ips) - set(keep))
            if gone:  # lost again while the forwarding was being set up
                self.handover.stop_async(gone)
            self.post()

        self.handover.forward_async(moves, done)

    def withdraw_all(self) -> None:
        self.waiting.clear()
        with self.lock:
            fwd = sorted(self.forwarding)
            self.forwarding.clear()
            self.wanted.clear()
        if self.handover is not None and fwd:
            self.handover.stop_async(fwd)

    def in_place(self) -> list[str]:
        """The VIPs forwarded now (for the status)."""
        with self.lock:
            return sorted(self.forwarding)
