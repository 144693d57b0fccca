"""What the BGP mode's threads share: one condition (``cond``) guarding the decision, the desired and
the applied FRR configs, the networks FRR has and the flags the threads read and set; the FRR lock
(one change at a time); and the arithmetic of network sets (per router and family)."""

from __future__ import annotations

import threading
from typing import Any

from nocloudlb.core.bgp import BgpDecision
from nocloudlb.core.schema import Config

from .render import Rendered, forwarding_needed, render

#: networks per router (vrf, asn) and family
Nets = dict[tuple[str, int], dict[str, list[str]]]


class BgpState:
    """The shared fields; every one read or written with ``cond`` held, unless its comment says otherwise."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.cond = threading.Condition()
        self.frr_lock = threading.Lock()  # one FRR change at a time (withdrawals, reloads)
        self.stop = False
        self.forwarding: tuple[bool, bool] | None = None
        self.decision = BgpDecision()
        self.config: Config | None = None
        self.desired: Rendered | None = None
        self.desired_at = 0.0
        self.applied: Rendered | None = None  # what FRR runs (last good)
        self.announced: Nets = {}  # networks FRR has now
        # ``announced`` is exactly bgpd's networks: set by a reload; cleared when a change failed part-way
        # (it then holds what bgpd may have), so that the next change reloads instead of a delta, which
        # would take a network counted but never sent as already there
        self.announced_sure = False
        self.withdrawn = False  # withdraw_all in force until the next apply
        self.flows_off = False  # the node label OFF_LABEL=off
        self.reload_error = ""
        self.changed_at = 0.0  # the last reload or withdrawal (the reconcile looks closely after it)
        self.disk: str | None = None  # what this mode last wrote to frr.conf (with ``frr_lock`` held)
        self.sessions: dict[str, dict[str, Any]] = {}
        self.healthy: bool | None = None  # bgpd answers (the watch thread's, read without the condition)

    def switches(self, parsed: Config) -> tuple[bool, bool]:
        """The forwarding lines to render: on where the node has it on or the data plane needs it."""
        live = self.forwarding or (True, True)
        need = forwarding_needed(parsed)
        return live[0] or need[0], live[1] or need[1]

    def render(self, decision: BgpDecision, config: Config) -> Rendered:
        """The FRR config of ``decision`` (forwarding switches: ``switches``)."""
        return render(self.node, decision, config, self.switches(config))

    def render_withdrawn(self, decision: BgpDecision, config: Config) -> Rendered:
        """``config`` rendered with the peers of ``decision`` and no route to any."""
        return self.render(BgpDecision(peers=decision.peers, routes={p.name: [] for p in decision.peers}), config)

    def pending(self) -> bool:
        """A desired config FRR does not run yet: not reloaded, or networks a withdrawal removed
        that it must announce again (the caller holds the condition)."""
        return self.desired is not None and (self.applied is None or self.desired.text != self.applied.text
                                             or has_any(minus(self.desired.networks, self.announced)))


def minus(a: Nets, b: Nets) -> Nets:
    """Networks of ``a`` that ``b`` does not have, per router and family."""
    out: Nets = {}
    for key, fams in a.items():
        other = b.get(key, {})
        out[key] = {}
        for fam, ps in fams.items():
            keep = set(other.get(fam, ()))  # once per family: linear in the number of prefixes
            out[key][fam] = [p for p in ps if p not in keep]
    return out


def union(a: Nets, b: Nets) -> Nets:
    """Networks of ``a`` or ``b``, per router and family, in their order (``a``'s first), each once."""
    out: Nets = {}
    seen: dict[tuple[tuple[str, int], str], set[str]] = {}
    for nets in (a, b):
        for key, fams in nets.items():
            for fam, ps in fams.items():
                have = out.setdefault(key, {}).setdefault(fam, [])
                known = seen.setdefault((key, fam), set())  # linear: 11,000 networks took 0.8 s as a list
                for p in ps:
                    if p not in known:
                        known.add(p)
                        have.append(p)
    return out


def has_any(nets: Nets) -> bool:
    return any(ps for fams in nets.values() for ps in fams.values())


def count(value: Any) -> int:
    """A count from FRR's JSON ("N/A" and the like: 0)."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
