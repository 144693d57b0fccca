"""One member as membership hands it out (MemberView), and the gossip address it is reached at."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

import kinship


@dataclass(frozen=True)
class MemberView:
    name: str
    addr: str
    state: str  # alive | suspect | dead | left
    meta: Mapping[str, str]
    epoch: int = 0


def member_view(m: kinship.Member) -> MemberView:
    return MemberView(m.name, m.addr, m.state.name.lower(), dict(m.meta), m.epoch)


def split_addr(addr: str) -> tuple[str, int]:
    """``(host, port)`` of a gossip address "ip:port" or "[ip6]:port"; ValueError for a bad port."""
    host, dummy, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def tcp_reachable(addr: str, timeout: float = 0.5) -> bool:
    try:
        host, port = split_addr(addr)
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False
