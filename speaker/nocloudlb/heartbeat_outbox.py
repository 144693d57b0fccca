"""What this node says to each member in a round of heartbeats: its boot time and packet counter, the
meta it published (carried whole by the next META_REPEAT packets to each member after a change), the
members it misses and whether it suspects the recipient (heartbeat.py's module docstring: the wire)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from .heartbeat_rule import Peer
from .heartbeat_wire import Packet

META_REPEAT = 3


class Outbox:
    """The sender's side of the datagrams of node ``name``; the caller holds its lock around every call."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.boot = time.time_ns()
        self.seq = 0
        self.meta: dict[str, str] | None = None
        self.meta_seq = 0
        self.meta_left: dict[str, int] = {}  # peer -> packets that still carry the meta
        self.rounds = 0  # rounds of datagrams sent (a cut missing list rotates by it)

    def greet(self, peer: str) -> None:
        """A new live member: the meta (if any) goes to it too."""
        if self.meta is not None:
            self.meta_left[peer] = META_REPEAT

    def forget(self, peer: str) -> None:
        self.meta_left.pop(peer, None)

    def publish(self, meta: Mapping[str, str], peers: Mapping[str, Peer]) -> bool:
        """This node published ``meta``: True when it is new (then the next packets to ``peers`` carry it)."""
        if self.meta == dict(meta):
            return False
        self.meta = dict(meta)
        self.meta_seq += 1
        self.meta_left = dict.fromkeys(peers, META_REPEAT)
        return True

    def round(self, peers: Mapping[str, Peer], suspected: frozenset[str], missing: frozenset[str],
              heard: frozenset[str]) -> tuple[list[tuple[tuple[str, int], Packet, bool]], int]:
        """One packet per member of ``peers`` with its address and whether this node is deaf to it (not in
        ``heard``), and the round's number (the rotation of a cut missing list)."""
        out = []
        for name, p in peers.items():
            self.seq += 1
            meta = None
            if self.meta is not None and self.meta_left.get(name, 0) > 0:
                self.meta_left[name] -= 1
                meta = self.meta
            pkt = Packet(self.name, name, self.boot, self.seq, p.my_suspicions, self.meta_seq,
                         name in suspected, meta, tuple(sorted(missing - {name})))
            out.append((p.addr, pkt, name not in heard))
        self.rounds += 1
        return out, self.rounds
