"""Compare what bgpd advertises to each neighbour with the decision, and repair a difference.

bgpd can hold a route toward a neighbour that its config no longer has (FRR 8.4 lost a withdrawal
made in a session's first second, docs/bgp.md), so telling bgpd is not proof that the router
heard it. ``Reconciler.check`` asks bgpd per neighbour and family for what it has advertised
(its Adj-RIB-Out, ``show bgp ... neighbors X advertised-routes json``), compares it with the
prefixes the decision gives that neighbour and, when a difference is seen in ``confirm``
consecutive checks (so a change still on its way is never "repaired"), repairs it, one step
further each time the same difference is still there:

1. prefixes advertised that the router's config does not hold: ``network P`` and ``no network P``
   in one vty session, which makes bgpd process P again and send the withdrawal; anything else
   (a prefix missing, or one the route-map should filter): ``clear bgp ... soft out``;
2. ``clear bgp ... soft out`` (bgpd sends the neighbour its whole Adj-RIB-Out again);
3. ``clear bgp ADDR``: the session is reset, the router drops every route of this node and learns
   the right ones again. At most once per ``hard_every`` seconds per neighbour; soft otherwise.

The comparison (``diff``) and the schedule are pure; talking to bgpd is the ``ask`` and ``act``
callables the mode gives (bgp/mode.py), so the steps are table-tested without FRR.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PeerView:
    """One neighbour and family as the decision sees it."""

    name: str
    address: str  # or the interface, for an unnumbered peer
    vrf: str
    asn: int  # this node's ASN for the peer (the ``router bgp`` it is under)
    family: str  # "ipv4" | "ipv6"
    want: frozenset[str]  # what the decision gives this neighbour
    networks: frozenset[str] = frozenset()  # the router's ``network`` lines of this family
    # False in a session's first seconds: bgpd holds its first UPDATEs (its coalesce time, 1 s and
    # more) so a missing prefix is not yet a difference; an extra one always is
    missing_counts: bool = True

    @property
    def key(self) -> tuple[str, str]:
        return self.name, self.family


@dataclass(frozen=True)
class Diff:
    missing: frozenset[str] = frozenset()  # decided, not advertised
    extra: frozenset[str] = frozenset()  # advertised, not decided

    def __bool__(self) -> bool:
        return bool(self.missing or self.extra)

    def as_dict(self) -> dict[str, list[str]]:
        return {"missing": sorted(self.missing), "extra": sorted(self.extra)}


def advertised_command(view: PeerView) -> str:
    vrf = f" vrf {view.vrf}" if view.vrf else ""
    return f"show bgp{vrf} {view.family} unicast neighbors {view.address} advertised-routes json"


def advertised_prefixes(answer: Any) -> set[str]:
    """The prefixes of an ``advertised-routes json`` answer (FRR: ``advertisedRoutes`` keyed by prefix)."""
    if not isinstance(answer, dict):
        return set()
    routes = answer.get("advertisedRoutes")
    return {str(p) for p in routes} if isinstance(routes, dict) else set()


def diff(want: frozenset[str] | set[str], have: set[str]) -> Diff:
    return Diff(missing=frozenset(set(want) - have), extra=frozenset(have - set(want)))


@dataclass
class _Track:
    seen: int = 0  # consecutive checks that found the same kind of difference
    level: int = 0  # the last repair step taken for it
    last_hard: float = -1e9


@dataclass
class Reconciler:
    ask: Callable[[PeerView], set[str]]  # what bgpd advertises (FrrError when it cannot tell)
    act: Callable[[PeerView, int, Diff], None]  # repair at a step (1-3)
    confirm: int = 2
    hard_every: float = 30.0
    clock: Callable[[], float] = time.monotonic
    repairs: dict[str, int] = field(default_factory=dict)  # peer name -> repairs made
    last: dict[str, Any] = field(default_factory=dict)  # the last repair, for status
    _tracks: dict[tuple[str, str], _Track] = field(default_factory=dict)

    def step(self, track: _Track) -> int:
        """The next repair step for a difference that persists (3 only once per ``hard_every``)."""
        level = min(3, track.level + 1)
        if level == 3 and self.clock() - track.last_hard < self.hard_every:
            return 2
        return level

    def check(self, views: list[PeerView]) -> list[tuple[PeerView, int, Diff]]:
        """One round over ``views``; returns the repairs made (view, step, difference)."""
        done = []
        for view in views:
            track = self._tracks.setdefault(view.key, _Track())
            found = diff(view.want, self.ask(view))
            if not view.missing_counts:
                found = Diff(extra=found.extra)
            if not found:
                self._tracks[view.key] = _Track(last_hard=track.last_hard)
                continue
            track.seen += 1
            if track.seen < self.confirm:
                continue
            level = self.step(track)
            self.act(view, level, found)
            track.level, track.seen = level, 0
            if level == 3:
                track.last_hard = self.clock()
            self.repairs[view.name] = self.repairs.get(view.name, 0) + 1
            self.last = {"peer": view.name, "family": view.family, "step": level, **found.as_dict()}
            done.append((view, level, found))
        for key in set(self._tracks) - {v.key for v in views}:
            del self._tracks[key]
        return done

    def status(self) -> dict[str, Any]:
        return {"repairs": dict(self.repairs), "last": dict(self.last)}
