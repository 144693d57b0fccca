"""The layer-2 mode's VIP rows (one per VIP of each service: who leads it and why, as the
election decided) and how the L2 layer's live state overlays them (``with_l2``, ``seen_key``):
a VIP this node won is shown announcing only once the announcer answers for it.

Plain data and pure functions, used by the mode (mode.py), its logging of changes (rowlog.py)
and the status (nocloudlb.status). ``read_l2_view`` reads the announcer's state now.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass
class VipRow:
    ip: str
    service: str
    pool: str
    leader: str | None
    announcing: bool  # the election's answer until ``with_l2`` overlays the L2 layer's
    reason: str
    interfaces: list[str]
    on_lo: bool
    l2_state: str = ""  # the announcer's state: "" (not given to it) | checking | announcing | conflict
    conflict: dict | None = None  # ip, mac, iface, at of the other MAC that answers for it

    def view(self) -> dict[str, Any]:
        return {"ip": self.ip, "service": self.service, "pool": self.pool, "leader": self.leader,
                "announcing": self.announcing, "reason": self.reason, "interfaces": self.interfaces,
                "onLo": self.on_lo, "l2State": self.l2_state, "conflict": self.conflict}


@dataclass
class L2View:
    """What the announcer does: ip -> state, and ip -> conflict record. ``known`` False: no stats."""

    states: dict[str, str]
    conflicts: dict[str, dict]
    known: bool = True
    # announcing with no interface to announce on (all it may use are missing, down, enslaved): issue 20 part 6
    nowhere: frozenset[str] | set[str] = frozenset()


def read_l2_view(announcer: Any) -> L2View:
    """The announcer's per-VIP state and conflicts, read now (it changes them on its own thread)."""
    try:
        if hasattr(announcer, "vip_states"):  # the L2Announcer: states only, no counters copied
            states, found = announcer.vip_states()
            nowhere = announcer.unanswered() if hasattr(announcer, "unanswered") else frozenset()
            return L2View(states, {c["ip"]: c for c in found}, nowhere=nowhere)
        vips = announcer.stats().get("vips", {})
        conflicts = {c["ip"]: c for c in announcer.conflicts()}
    except (AttributeError, KeyError, TypeError):  # an announcer without stats(): trust the election
        return L2View({}, {}, known=False)
    return L2View({ip: v.get("state", "") for ip, v in vips.items()}, conflicts)


def with_l2(rows: list[VipRow], l2: L2View) -> list[VipRow]:
    """Rows as the segment sees them: a VIP this node won is announcing only when the L2 layer says so.

    Won but still under the RFC 5227 check: reason ``conflictCheck``; another MAC answered (also
    while the announcer re-checks a conflicted address): reason ``ipConflict`` with the conflict.
    Won and taken, but with no interface to announce on (every one it may use is missing, down or
    enslaved): reason ``noUsableInterface``, not announcing (nothing goes out).
    """
    out = []
    for r in rows:
        state = l2.states.get(r.ip, "")
        conflict = l2.conflicts.get(r.ip)
        if not state and conflict is None and r.l2_state == "" and r.conflict is None and not r.announcing:
            out.append(r)  # nothing to overlay (most rows at size): no copy
        elif not r.announcing or not l2.known:
            out.append(replace(r, l2_state=state, conflict=conflict))
        elif state == "announcing" and r.ip in l2.nowhere:
            out.append(replace(r, announcing=False, reason="noUsableInterface", l2_state=state, conflict=None))
        elif state == "announcing":
            out.append(replace(r, l2_state=state, conflict=None))
        elif conflict is not None or state == "conflict":
            out.append(replace(r, announcing=False, reason="ipConflict", l2_state=state, conflict=conflict))
        elif state == "checking":
            out.append(replace(r, announcing=False, reason="conflictCheck", l2_state=state))
        else:  # not (yet) taken by the announcer
            out.append(replace(r, announcing=False, reason="l2Pending", l2_state=state))
    return out


PENDING = ((False, "conflictCheck"), (False, "l2Pending"))  # won, not yet answered: the mode decides again soon


def seen_key(r: VipRow, l2: L2View) -> tuple[bool, str]:
    """(announcing, reason) of ``r`` as ``with_l2`` would show it, without copying the row."""
    if not r.announcing or not l2.known:
        return r.announcing, r.reason
    state = l2.states.get(r.ip, "")
    if state == "announcing":
        return (False, "noUsableInterface") if r.ip in l2.nowhere else (True, r.reason)
    if r.ip in l2.conflicts or state == "conflict":
        return False, "ipConflict"
    return False, "conflictCheck" if state == "checking" else "l2Pending"
