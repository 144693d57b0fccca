"""The layer-2 election at size: ``layer2_decision`` (nocloudlb.core.election) for every VIP of a config,
computed once per kind of service and view rather than once per VIP.

Each VIP's hash order of the known nodes (MetalLB's ``sha256(node#ip)`` sort) is kept between views:
a view change costs one pass over the classes of VIPs, no hashing. Up to ``INTERN_MAX`` known nodes,
VIPs with equal orders share one tuple and one class, and a new name sorts them again (cheap at that
size). Above it, nearly every VIP has an order of its own: each keeps a list and, beside it, the first
``PREFIX_BYTES`` of each node's key; a node never seen before is put into every list in place by
binary search over those prefixes (``insert``: one hash per VIP, where sorting again hashed every
node), and the classes are kept with their last decision, so the caller redoes only the VIPs whose
leader the new name changed. At 10,000 VIPs and 300 known nodes a new member costs about 40 ms where
sorting again took 2.6 s (``benchmarks/core_bench.py``, both side by side). Many new names at once
(the first view) are sorted in full.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nocloudlb.core.election import (
    NodeView,
    _applicable,
    base_reason,
    election_key,
    layer2_candidates,
    layer2_reason,
    preferred_scores,
)


def _ranked(names: tuple[str, ...], ip: str) -> tuple[list[str], dict[str, bytes]]:
    """``ip``'s hash order of ``names``, and each one's key."""
    keys = {n: election_key(n, ip) for n in names}
    return sorted(names, key=keys.__getitem__), keys


def _hash_order(names: tuple[str, ...], ip: str) -> tuple[str, ...]:
    return tuple(_ranked(names, ip)[0])


#: up to this many known nodes, equal orders are shared (interned, a class is the VIPs of one order) and a
#: new name sorts them again (cheap); above it each VIP keeps its own order and a new name is inserted
INTERN_MAX = 8

#: bytes of each node's key kept beside a VIP's order (as one unsigned int, array type "I": 4 bytes):
#: a new name is placed by binary search over them, hashing only itself (and the rare equal prefixes)
PREFIX_BYTES = 4


def hash_order(names: tuple[str, ...], ip: str) -> tuple[list[str], array]:
    """``ip``'s hash order of ``names`` and the first ``PREFIX_BYTES`` of each one's key, in that order."""
    order, keys = _ranked(names, ip)
    width = PREFIX_BYTES
    return order, array("I", [int.from_bytes(keys[n][:width], "big") for n in order])


def insert(order: list[str], prefixes: array, names: list[str], ip: str, encoded: dict[str, bytes]) -> None:
    """Put ``names`` (nodes not in ``order``, ``ip``'s hash order of some nodes) in their places, in place:
    ``order`` becomes ``_hash_order`` of all of them, and ``prefixes`` (``hash_order``'s) follows.
    ``encoded``: name -> its UTF-8 bytes, a cache shared across VIPs (``election_key`` hashes the UTF-8 of
    ``node#ip``: the same bytes). One hash per new name, plus one per node whose prefix equals its
    prefix (2**-32 per node); no allocation but the hash (a collection would walk every order)."""
    suffix = ("#" + ip).encode("utf-8")
    sha = hashlib.sha256

    def key(n: str) -> bytes:
        return sha(encoded[n] + suffix).digest()

    for name in names:
        full = key(name)
        x = int.from_bytes(full[:PREFIX_BYTES], "big")
        i = bisect_left(prefixes, x)
        j = bisect_right(prefixes, x, i)
        if i < j:  # equal prefixes: their full keys decide
            i = bisect_left(order, full, i, j, key=key)
        order.insert(i, name)
        prefixes.insert(i, x)


def _insert_cheaper(new: int, known: int) -> bool:
    """Inserting ``new`` names one by one into orders of ``known`` costs less than sorting them all again
    (each insertion hashes one name, then copies the order)."""
    return 0 < known and new <= max(4, known // 4)


def _best(candidates: list[str], scores: dict[str, int], ip: str) -> str:
    """The leader among ``candidates`` under preferredNodeSelectors ``scores`` (election_order's rule)."""
    def rank(n: str) -> tuple[int, bytes]:
        return -scores.get(n, 0), election_key(n, ip)
    return min(candidates, key=rank)


def _first(order: Sequence[str], cands: frozenset[str], scores: dict[str, int]) -> str | None:
    """The leader among ``cands`` for a VIP whose hash order of the known nodes is ``order``."""
    if not cands:
        return None
    if scores:
        top = max(scores.get(n, 0) for n in cands)
        return next((n for n in order if n in cands and scores.get(n, 0) == top), None)
    return next((n for n in order if n in cands), None)


@dataclass
class VipClass:
    """VIPs decided alike in every view (``Election.classes``): entries ``idxs`` (their ``ips``)."""

    gkey: tuple | None  # the group's key; None: VIPs in no pool
    order: Sequence[str]
    idxs: list[int]
    ips: list[str]
    ipset: frozenset[str] = frozenset()
    decided: tuple | None = None  # the last apply's decision for these VIPs (L2Mode)


@dataclass
class _Group:
    """What the election of every VIP of one kind of service shares, in one view: the services of a
    pool whose advertisements select them alike, under the same policy (Local: one service)."""

    applicable: list[Any]
    candidates: list[str]
    cand_set: frozenset[str]
    scores: dict[str, int]
    base_reason: str  # this node's reason when another node (or nobody) leads
    ifaces: list[str]
    mine: bool  # an advertisement of the pool selects this service and this node (the VIP goes on lo)


class Election:
    """``layer2_decision`` for every VIP of a config, computed once per kind of service and view rather
    than once per VIP, with each VIP's hash order of the known nodes kept between views (a view
    change costs one pass over the VIPs, no hashing; a node never seen before is inserted into them,
    or sorts them again up to ``INTERN_MAX`` nodes: see the module docstring).
    Equal to ``layer2_decision`` VIP by VIP (tests/unit/speaker/test_speaker_scale_l2.py)."""

    def __init__(self) -> None:
        self._parsed: Any = None
        # (ip, service, pool, ads, (pool, advertisements selecting the service, Local service key, service key))
        self.entries: list[tuple[str, Any, str | None, tuple, tuple]] = []
        self._known: tuple[str, ...] = ()
        self._order: dict[str, Sequence[str]] = {}  # ip -> its hash order of the known nodes
        self._prefixes: dict[str, array] = {}  # ip -> hash_order's key prefixes, beside self._order[ip]
        self._classes: list[VipClass] | None = None

    def _plan(self, parsed: Any) -> None:
        if parsed is self._parsed:
            return
        entries: list[tuple[str, Any, str | None, tuple, tuple]] = []
        ads_of: dict[str, tuple] = {}
        for svc in parsed.services:
            local = svc.key if svc.traffic_policy == "Local" else None
            for ip in svc.ingress_ips:
                pool = parsed.pool_for_ip(ip)
                if pool is None:
                    entries.append((ip, svc, None, (), ()))
                    continue
                if pool.name not in ads_of:
                    ads_of[pool.name] = tuple(parsed.l2_advertisements_for_pool(pool.name))
                ads = ads_of[pool.name]
                sel = tuple(id(a) for a in ads if a.selects_service(svc.labels))
                entries.append((ip, svc, pool.name, ads, (pool.name, sel, local, svc.key)))
        self.entries = entries
        self._parsed = parsed
        self._order = {}
        self._prefixes = {}
        self._known = ()
        self._classes = None

    def _orders(self, names: list[str]) -> dict[str, Sequence[str]]:
        new = sorted(set(names).difference(self._known))
        if not new and (self._order or not self.entries):
            return self._order
        known = tuple(sorted(set(names) | set(self._known)))
        orders: dict[str, Sequence[str]]
        if len(known) <= INTERN_MAX:  # few nodes: sorted again, one tuple per distinct order shared by its VIPs
            interned: dict[tuple[str, ...], tuple[str, ...]] = {}
            orders = {e[0]: interned.setdefault(o, o)
                      for e in self.entries if e[2] is not None for o in (_hash_order(known, e[0]),)}
            self._prefixes = {}
        elif self._prefixes and _insert_cheaper(len(new), len(self._known)):
            # N! orders: each VIP has its own list, changed in place (nothing allocated per VIP)
            encoded = {n: n.encode("utf-8") for n in known}
            try:
                for ip, order in self._order.items():
                    assert isinstance(order, list)
                    insert(order, self._prefixes[ip], new, ip, encoded)
            except BaseException:
                self._order, self._prefixes, self._classes = {}, {}, None  # half inserted: sorted again next time
                raise
            orders = self._order
        else:
            orders, self._prefixes = {}, {}
            for e in self.entries:
                if e[2] is not None:
                    orders[e[0]], self._prefixes[e[0]] = hash_order(known, e[0])
        keep = self._classes is not None and len(self._known) > INTERN_MAX and len(known) > INTERN_MAX
        self._order = orders
        self._known = known
        if keep:
            keep = self._reorder()
        if not keep:
            self._classes = None
        return self._order

    def _reorder(self) -> bool:
        """The classes kept, each given its VIP's new order (True), where no order was shared: each class is
        then one VIP's (or one address of services that share it). The classes' ``decided`` stay, so the
        caller rebuilds only the VIPs whose decision the new name changed. False: partition again."""
        assert self._classes is not None
        for cls in self._classes:
            if cls.gkey is not None:
                if len(cls.ipset) != 1:
                    return False
                cls.order = self._order[cls.ips[0]]
        return True

    def _partition(self) -> list[VipClass]:
        """The entries cut into classes: same kind of service (group) and same hash order of the known
        nodes. Every VIP of a class is decided alike in every view (see ``classes``)."""
        if self._classes is None:
            by_key: dict[tuple, VipClass] = {}
            for i, (ip, _svc, pool, _ads, gkey) in enumerate(self.entries):
                # by the order's identity: equal orders are one object (interned) wherever classes are few
                order = self._order[ip] if pool is not None else ()
                key = (gkey[:3], id(order)) if pool is not None else (None, 0)
                cls = by_key.get(key)
                if cls is None:
                    cls = by_key[key] = VipClass(key[0], order, [], [])
                cls.idxs.append(i)
                cls.ips.append(ip)
            for cls in by_key.values():
                cls.ipset = frozenset(cls.ips)
            self._classes = list(by_key.values())
        return self._classes

    def classes(self, me: str, nodes: list[NodeView], parsed: Any
                ) -> list[tuple[VipClass, str | None, str, _Group | None]]:
        """``decide`` by class: (class, leader, reason, group) for every class of VIPs. The work is per
        class, not per VIP: with S kinds of service and N known nodes there are at most S x N! classes
        (a handful at 10,000 VIPs on three nodes), so a view change costs no pass over the VIPs.

        Why a class decides alike: ``layer2_decision``'s leader is the candidate with the highest
        preferredNodeSelectors score, ties broken by the hash order of (node, VIP); every candidate
        is a known node, so that is the first candidate of the VIP's hash order of the known nodes
        among those with the highest score, the same for every VIP of the class. Equal to ``decide``
        VIP by VIP (tests/unit/speaker/test_speaker_scale_l2.py)."""
        self._plan(parsed)
        mine = next((n for n in nodes if n.name == me), None)
        my_labels = mine.labels if mine is not None else {}
        self._orders([n.name for n in nodes])
        groups: dict[tuple, _Group] = {}
        out: list[tuple[VipClass, str | None, str, _Group | None]] = []
        for cls in self._partition():
            if cls.gkey is None:
                out.append((cls, None, "notInAnyPool", None))
                continue
            g = groups.get(cls.gkey)
            if g is None:
                _ip, svc, _pool, ads, _k = self.entries[cls.idxs[0]]
                g = groups[cls.gkey] = self._group(svc, ads, nodes, mine, my_labels)
            winner = _first(cls.order, g.cand_set, g.scores)
            out.append((cls, winner, layer2_reason(winner, me, g.base_reason), g))
        return out

    @staticmethod
    def _group(svc: Any, ads: tuple, nodes: list[NodeView], mine: NodeView | None,
               my_labels: dict[str, str]) -> _Group:
        applicable = _applicable(list(ads), svc)
        cands = layer2_candidates(nodes, applicable, svc)
        base = base_reason(mine, applicable, svc)
        my_ads = [a for a in ads if a.selects_service(svc.labels) and a.selects_node(my_labels)]
        ifaces = [] if any(not a.interfaces for a in my_ads) else sorted(
            {i for a in my_ads for i in a.interfaces})
        return _Group(applicable, cands, frozenset(cands), preferred_scores(nodes, applicable), base, ifaces,
                      bool(my_ads))

    def class_runner_up(self, me: str, g: _Group, cls: VipClass) -> str | None:
        """``runner_up`` for every VIP of ``cls``."""
        return _first(cls.order, g.cand_set - {me}, g.scores)

    def decide(self, me: str, nodes: list[NodeView], parsed: Any
               ) -> list[tuple[str, str, str | None, str | None, str, _Group | None]]:
        """(ip, service key, pool, leader, reason, group) per VIP, reason as in ``layer2_decision``."""
        self._plan(parsed)
        mine = next((n for n in nodes if n.name == me), None)
        my_labels = mine.labels if mine is not None else {}
        order = self._orders([n.name for n in nodes])
        groups: dict[tuple, _Group] = {}
        out: list[tuple[str, str, str | None, str | None, str, _Group | None]] = []
        for ip, svc, pool, ads, gkey in self.entries:
            if pool is None:
                out.append((ip, svc.key, None, None, "notInAnyPool", None))
                continue
            g = groups.get(gkey[:3])
            if g is None:
                g = groups[gkey[:3]] = self._group(svc, ads, nodes, mine, my_labels)
            if not g.cand_set:
                winner = None
            elif g.scores:
                winner = _best(g.candidates, g.scores, ip)
            else:
                winner = next(n for n in order[ip] if n in g.cand_set)
            out.append((ip, gkey[3], pool, winner, layer2_reason(winner, me, g.base_reason), g))
        return out

    def runner_up(self, me: str, g: _Group, ip: str) -> str | None:
        """The leader of ``ip`` were ``me`` not a candidate (``layer2_decision`` over the other nodes)."""
        rest = [c for c in g.candidates if c != me]
        if not rest:
            return None
        if g.scores:
            return _best(rest, g.scores, ip)
        return next((n for n in self._order.get(ip, ()) if n in g.cand_set and n != me), None)
