# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# Apache License 2.0 (see LICENSE)
"""Layer-2 leader election: MetalLB's hash order, as one pure function.

Every speaker computes the same answer from the same view of the cluster:
the candidates for a VIP are sorted by ``sha256(node + "#" + ip)`` compared
bytewise, and the first one announces. No votes, no shared store.
"""

from __future__ import annotations

import hashlib


def election_key(node: str, ip: str) -> bytes:
    """The sort key of ``node`` for ``ip``: sha256 of ``node#ip``."""
    return hashlib.sha256((node + "#" + ip).encode("utf-8")).digest()


def election_order(nodes, ip: str) -> list:
    """All ``nodes`` ordered for ``ip``; the first one is the leader."""
    return sorted(nodes, key=lambda node: election_key(node, ip))


def leader(nodes, ip: str):
    """The node that announces ``ip`` among ``nodes``, or None when there is none."""
    order = election_order(nodes, ip)
    return order[0] if order else None
