"""The announcer's records: one ``Iface`` per interface in use (its raw socket, the addresses it
answers, its multicast groups, its transmit queues and token bucket) and one ``Vip`` per address
given to ``set_announced`` (its place in the check/announce lifecycle). ``Watched`` is the table of
addresses under check, which tells the responder process what to watch as it changes.

Plain data: the parts of the announcer (announcer.py) share these records under its lock.
"""

from __future__ import annotations

import socket
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field


class Watched(dict):
    """Addresses under check (packed ip -> Vip) that tells the responder which addresses to watch."""

    def __init__(self, changed: Callable[[bytes, bool], None]) -> None:
        super().__init__()
        self._changed = changed

    def __setitem__(self, key: bytes, value: Vip) -> None:
        if key not in self:
            self._changed(key, True)
        super().__setitem__(key, value)

    def pop(self, key, *default):
        if key in self:
            self._changed(key, False)
        return super().pop(key, *default)


@dataclass
class Iface:
    name: str
    index: int
    mac: bytes
    sock: socket.socket
    mcast: list[socket.socket] = field(default_factory=list)  # AF_INET6 sockets holding IPV6_JOIN_GROUPs
    holder: dict = field(default_factory=dict)  # group -> socket that joined it (None: PACKET_MR_MULTICAST)
    answer: set[bytes] = field(default_factory=set)  # packed IPs answered on this interface
    groups: Counter = field(default_factory=Counter)  # solicited-node group -> number of VIPs
    queue: deque = field(default_factory=deque)  # (ip, gen, frame, kind, series); "mcast": frame is a group
    urgent: deque = field(default_factory=deque)  # the same, sent before ``queue``: takeovers' first round, joins
    dropped: int = 0  # gratuitous frames dropped: superseded, or the queue was full
    tokens: float = 0.0
    refilled: float = 0.0
    sent: Counter = field(default_factory=Counter)  # kind -> frames


@dataclass
class Vip:
    ip: str
    packed: bytes
    version: int
    wanted: tuple[str, ...]
    gen: int
    state: str = "checking"  # checking | announcing | conflict
    ifaces: set[str] = field(default_factory=set)
    conflict: dict | None = None
    probe_no: int = 0
    probes_pending: int = 0
    check_started: float = 0.0
    member_answered: bool = False  # a member's MAC answered a probe of this check round
    claimed: tuple[bytes, float] | None = None  # the last other MAC seen announcing it while announced here, when
    series: int = 0  # the gratuitous schedule in force; a re-announcement starts a new one
    taking: set[str] = field(default_factory=set)  # interfaces where it is taken in a planned move and not answered
    # yet: its announcement leaves first, from the responder child (``T``), then it is answered (lifecycle.py)
