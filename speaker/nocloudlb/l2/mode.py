"""Layer-2 mode: the speaker's decision for ARP/NDP, carried out (see nocloudlb.modes).

``apply(me, nodes, parsed)``, with ``nodes`` the published view of the cluster:

1. for every VIP (each service's ``status.loadBalancer.ingress``), ``layer2_decision`` (pure, in
   the core), gated by the speaker (``notReady`` before the first join, ``joinRefused`` when peers
   refuse our gossip);
2. withdraw first: VIPs this node no longer leads stop being answered at once
   (``L2Announcer.set_announced``); the end of their handover forwarding is queued for the
   forwarder's worker (nft never runs on this thread);
3. ``delivery.sync_lo_vips`` with every VIP this node may serve (its L2Advertisements select it),
   then announce: a VIP is announced only once it is on ``lo`` (if adding it fails, it is not
   announced); a VIP taken over from a live member (a planned move) is announced once its
   handover forwarding is in place (or after ``HANDOVER_WAIT`` s);
4. overlay what the L2 layer really does with each VIP it was given (``checking`` during the
   RFC 5227 check, ``announcing``, ``conflict``), and log ``serviceAnnounced`` /
   ``serviceWithdrawn`` on every change.

Heartbeats (speaker/nocloudlb/heartbeat.py): a member the daemon's heartbeats suspect comes in
the view as ``unreachable`` (not eligible); a VIP taken from it gets handover forwarding toward it
like a planned move, waiting at most ``SUSPECT_WAIT`` for it. When members suspect this node
(``suspecters()``), it gives up (reason ``suspectedByPeer``) each VIP whose next node is one of
them, and takes it back, without forwarding, once they hear it again.

The RFC 5227 check is skipped for a VIP gained from a member this node saw lead it (failover,
drain, leave); answers from members' MACs (each member publishes the MACs of the interfaces it
announces on) are a handover, never a conflict.

Heals (``on_heal``): re-announce only what may have moved behind this node's back: after this
node was doubted (``refuted``), paused (``resumed``) or back in the majority after it kept its
VIPs without quorum (``quorumGained``), every VIP it leads; after a peer came back
(``memberJoined``), the VIPs it leads for which that peer is a candidate; a refuted suspicion of a
peer (``memberRecovered``) moved nothing and re-announces nothing.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import Counter

from nocloudlb.core.election import NodeView
from nocloudlb.core.quorum import REASON_YIELDED_ON_WIRE

from .. import logs
from ..metadata import MAX_MACS
from .disagree import WireRule
from .election import Election, VipClass

log = logging.getLogger("nocloudlb.speaker")

REANNOUNCED = Counter("nocloudlb_speaker_reannounced",
                      "Times this node re-announced the VIPs it leads after the cluster healed", ["reason"])

GROUP_ERRORS = Counter("nocloudlb_layer2_group_errors", "Groups of VIPs whose part of a layer-2 apply failed")
GROUP_FAIL_BOUND = 3.0  # seconds a failing group of VIPs keeps what it announced before it is withdrawn
HANDOVER_WAIT = 2.0  # seconds a planned move waits for its forwarding before it is announced anyway
SUSPECT_WAIT = 0.05  # the same for a takeover from a member only suspected (heartbeats stopped): speed first


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


_PENDING = ((False, "conflictCheck"), (False, "l2Pending"))


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


def neighbour_table(ips: set[str]) -> dict[str, str]:
    """``ip -> MAC`` (lowercase, colons) from the kernel's neighbour table (ARP and NDP), for ``ips``."""
    if not ips:
        return {}
    from pyroute2 import IPRoute  # noqa: PLC0415

    out: dict[str, str] = {}
    with IPRoute() as ipr:
        for family in (socket.AF_INET, socket.AF_INET6):
            for n in ipr.get_neighbours(family=family):
                dst, lladdr = n.get("NDA_DST"), n.get("NDA_LLADDR")
                if dst and lladdr and lladdr != "00:00:00:00:00:00":
                    ip = str(ipaddress.ip_address(dst))
                    if ip in ips:
                        out[ip] = lladdr.lower()
    return out


def member_ip(addr: str) -> str | None:
    """The IP of a member's gossip address "ip:port" or "[ip6]:port"; None for a host name."""
    try:
        return str(ipaddress.ip_address(addr.rpartition(":")[0].strip("[]")))
    except ValueError:
        return None


def _mac_text(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


class L2Mode:
    """See the module docstring. ``gate()`` -> "" or the reason this node may not announce at all;
    ``member_macs()`` -> member name -> the MACs it published (this node excluded)."""

    name = "l2"

    def __init__(self, announcer: Any, delivery: Any, state_dir: str, *,
                 gate: Callable[[], str] = lambda: "",
                 member_macs: Callable[[], dict[str, tuple[bytes, ...]]] = dict,
                 handover: Any = None, post: Callable[[], None] = lambda: None,
                 other_lo: Callable[[], set[str]] = set,
                 suspecters: Callable[[], frozenset[str]] = frozenset,
                 quorum: Callable[[], bool] = lambda: True) -> None:
        self.announcer = announcer
        self.delivery = delivery
        self.state_dir = state_dir
        self.gate = gate
        self.member_macs = member_macs
        self.handover = handover
        self.post = post
        self.other_lo = other_lo  # VIPs other modes serve (BGP): held on lo here as well, never announced
        self.suspecters = suspecters  # members that suspect this node (heartbeat.py): it yields them their part
        self.quorum = quorum  # connected to a majority (nocloudlb.core.quorum): may take VIPs it does not hold
        self.wire = WireRule(self._member_of, post)  # take only with quorum; the wire as the last word
        self._fwd_to: dict[str, str] = {}  # ip -> the member its handover forwarding goes to
        self._fwd_suspect: set[str] = set()  # ... when that member was only suspected (heartbeats)
        self._yielded: set[str] = set()  # VIPs this node gave up to a member suspecting it, not yet taken back
        self._fwd_wanted: set[str] = set()  # forwardings asked for and not lost since (under _lock)
        self.me = ""
        self._lock = threading.Lock()
        self._rows: list[VipRow] = []
        self._prev: dict[tuple[str, str], tuple[bool, str]] = {}
        self._lo: set[str] = set()  # VIPs confirmed on lo by the last successful sync
        self._lo_wanted: set[str] | None = None
        self._announced: dict[str, list[str]] = {}  # what set_announced was last given
        self._leaders: dict[str, str] = {}
        self._candidates: dict[str, list[str]] = {}  # ip -> candidates (this node's last decision)
        self._waiting: dict[str, float] = {}  # planned moves waiting for their forwarding: ip -> deadline
        self._ready: set[str] = set()  # planned moves whose forwarding ran
        self._forwarding: set[str] = set()
        self._busy = False
        # the ARP sysctls are wrong and cannot be set back: the kernel would answer for every IPv4
        # VIP on lo, so this node holds none there, announces none and publishes itself excluded
        self.arp_unsafe = False
        self._election = Election()
        self._applied: tuple | None = None  # the inputs of the last full apply (work only on change)
        # the last apply's rows, one per entry of the election's plan (``_rows_for``), reused by class
        self._rows_idx: list[VipRow] = []
        self._rows_for: Any = None
        self._stale: set[int] = set()  # rows the last apply changed in place (notOnLo...): built again
        self.applies = 0  # full applies (the election run), for tests and the scale benchmark
        self.last_apply_ms = 0.0  # how long the last one took
        # (wall time it ended, ms, ms of this thread's CPU: the rest is waiting for the GIL or a core) of the
        # last 16
        self.recent_applies: list[tuple[float, float, float]] = []
        self._group_failing: dict[str, float] = {}  # first VIP of a group whose apply fails -> since when
        self._group_logged = -1e9
        self._failed_now: set[str] = set()
        self._meta_key: tuple | None = None
        self._meta_used: set[str] = set()

    # -- Mode ------------------------------------------------------------------------------
    def start(self) -> None:
        self.announcer.start()
        if self.handover is not None:
            self.handover.start()

    def apply(self, me: str, nodes: list[NodeView], parsed: Any) -> None:
        self.me = me
        gate = self.gate()
        self._check_sysctls()  # every apply, the quiet ones too: re-set, or fail closed (arp_unsafe)
        # work only on change: the same view, config, gate, lo set, suspecters and sysctl state as the
        # last full apply, nothing waiting or under check, lo in sync: nothing else to do
        other = frozenset(self.other_lo())
        suspecters = self.suspecters()
        quorum = self.quorum()
        key = (me, tuple((n.name, n.state, tuple(sorted(n.labels.items())), n.healthy) for n in nodes),
               id(parsed), gate, other, suspecters, self.arp_unsafe, quorum)
        if key == self._applied and not self._waiting and not self._busy and self._lo_wanted is not None \
                and not self.wire.pending():
            return
        self._applied = None
        self.applies += 1
        started, cpu_started = time.monotonic(), time.thread_time()
        self._watch_interfaces(me, nodes, parsed)
        states = {n.name: n.state for n in nodes}
        skip: set[str] = set()
        handed: dict[str, str] = {}
        announce: dict[str, list[str] | None] = {}
        lo: set[str] = set()
        candidates: dict[str, list[str]] = {}
        handed_wait: dict[str, float] = {}
        announced_before = self._announced
        decisions = self._election.classes(me, nodes, parsed)
        entries = self._election.entries  # (re)planned for this config
        reuse = self._rows_for is entries
        rows: list[VipRow] = list(self._rows_idx) if reuse else [None] * len(entries)  # type: ignore[list-item]
        stale = self._stale if reuse else set()  # rows changed in place by the last apply: built again
        changed: list[VipRow] = []  # rows new or different from the last apply's
        decided_now: list[tuple[VipClass, tuple]] = []
        self._failed_now = set()
        for cls, leader, reason, g in decisions:
            try:  # one group of VIPs that fails never takes the others with it (_group_failed)
                if g is None:
                    decided: tuple = (None, reason)
                    if not reuse or cls.decided != decided:
                        for i in cls.idxs:
                            ip, svc = entries[i][0], entries[i][1]
                            rows[i] = VipRow(ip, svc.key, "", None, False, reason, [], False)
                            changed.append(rows[i])
                    decided_now.append((cls, decided))
                    continue
                if reason == "":
                    candidates.update(dict.fromkeys(cls.ips, g.candidates))
                    if suspecters:
                        # a member that stopped hearing this node takes what it would lead without it:
                        # yield that VIP (one owner); take it back when it hears this node again
                        nxt = self._election.class_runner_up(me, g, cls)
                        if nxt in suspecters:
                            leader, reason = nxt, "suspectedByPeer"
                if reason == "" and gate:
                    reason = gate
                if reason == "":
                    # only the VIPs this node did not announce before: gained from a member we saw lead it
                    # (failover, drain, leave): skip the RFC 5227 check, it would only cost failover time.
                    # Otherwise (first start, a new VIP, a restart that preempts) check: a member's MAC
                    # answering is one handing over, waited out until it is silent (is_peer_mac), any
                    # other MAC is a conflict and never fought.
                    for ip in cls.ipset.difference(announced_before):
                        before = self._leaders.get(ip)
                        if ip in self._yielded:
                            # taken back after a yield or a false suspicion: the member it went to answers
                            # until it hears this node again, at about the moment this node decides. The
                            # check waits for that member's silence (announcer: member_wait), so the two
                            # never answer at once; no forwarding: its connections never left this node
                            continue
                        if before and before != me:
                            skip.add(ip)
                            if states.get(before) == "alive":
                                handed[ip] = before  # a planned move: its in-flight connections go on there
                            elif states.get(before) == "unreachable":
                                # only suspected (heartbeats stopped, gossip not sure): forward toward it too,
                                # so a false suspicion resets nothing; wait less for the forwarding
                                handed[ip] = before
                                handed_wait[ip] = SUSPECT_WAIT
                ifaces = g.ifaces
                if g.mine:
                    lo.update(cls.ips)
                if reason == "":
                    if announce.keys().isdisjoint(cls.ipset):
                        announce.update(dict.fromkeys(cls.ips, ifaces))
                    else:  # a VIP shared with services of another kind: every interface either asks for
                        for ip in cls.ips:
                            prev = announce.get(ip)
                            if prev is None:
                                announce[ip] = ifaces
                            elif prev and ifaces:
                                announce[ip] = sorted(set(prev) | set(ifaces))
                            else:
                                announce[ip] = []
                decided = (leader, reason, ifaces, g.mine)
                if reuse and cls.decided == decided:
                    redo: Any = stale.intersection(cls.idxs) if stale else ()  # rows unchanged: reused, not built
                else:
                    redo = cls.idxs
                for i in redo:
                    ip, svc, pool = entries[i][0], entries[i][1], entries[i][2]
                    rows[i] = VipRow(ip, svc.key, pool or "", leader, reason == "", reason, ifaces, g.mine)
                    changed.append(rows[i])
                decided_now.append((cls, decided))
            except Exception as exc:  # noqa: BLE001 - the barrier of one group of VIPs
                self._group_failed(cls, entries, rows, changed, announce, lo, exc)
        self._group_failing = {k: v for k, v in self._group_failing.items() if k in self._failed_now}
        new_stale: set[int] = set()
        final = {ip: v or [] for ip, v in announce.items()}
        if self.arp_unsafe:  # fail closed: no IPv4 VIP announced (nor on lo, below) while the kernel may answer
            final = {ip: ifs for ip, ifs in final.items() if ":" in ip}
            for i, r in enumerate(rows):
                if r.announcing and ":" not in r.ip:
                    r.announcing, r.reason = False, "arpSysctlUnsafe"
                    new_stale.add(i)  # decided again next time (rows are reused only unchanged)
                    changed.append(r)

        # when nodes disagree (l2/disagree.py): nothing new without quorum; what the wire made it yield
        def handed_over() -> set[str]:  # asked for only while settling (a pass over every VIP)
            return {ip for ip in final if ip not in self._announced
                    and (self._leaders.get(ip) in (None, me) or states.get(self._leaders[ip]) == "alive")}

        held_back = self.wire.hold_back(me, quorum, final, self._announced, candidates,
                                        {r.ip: r.leader for r in rows if r.announcing and r.leader}, handed_over)
        if held_back:
            final = {ip: ifs for ip, ifs in final.items() if ip not in held_back}
            for i, r in enumerate(rows):
                if r.announcing and r.ip in held_back:
                    r.announcing, r.reason = False, held_back[r.ip]
                    new_stale.add(i)
                    changed.append(r)

        # 1. withdraw first: stop answering for what this node no longer leads, before anything slow
        kept = {ip: ifs for ip, ifs in self._announced.items() if ip in final}
        if len(kept) != len(self._announced):
            self.announcer.set_announced(kept)
            self._announced = kept
        new_leader = {r.ip: r.leader for r in rows}
        with self._lock:
            lost = [ip for ip in self._forwarding if ip not in final]
            self._forwarding.difference_update(lost)
            self._fwd_wanted.intersection_update(final)
        # a VIP taken from a suspected member that goes back to it keeps the forwarding until its grace
        # ends (the kernel expires it): clients reach this node until that member's gratuitous ARP.
        # Only then: that member takes it back without forwarding of its own (a planned move back
        # forwards the other way, and two forwardings toward each other would bounce packets)
        lost = [ip for ip in lost if ip not in self._fwd_suspect or self._fwd_to.get(ip) != new_leader.get(ip)]
        # a member only suspected when this node took its VIPs and since confirmed gone (gossip: dead or
        # left): nothing answers there any more, so its forwarding ends and this node serves them itself
        with self._lock:
            gone = [ip for ip in self._forwarding if ip in self._fwd_suspect
                    and states.get(self._fwd_to.get(ip, "")) not in ("alive", "suspect", "unreachable")]
            self._forwarding.difference_update(gone)
            self._fwd_wanted.difference_update(gone)
        self._fwd_suspect.difference_update(gone)
        lost = sorted(set(lost) | set(gone))
        if lost and self.handover is not None:
            self.handover.stop_async(lost)
        for ip in [ip for ip in self._waiting if ip not in final]:
            self._waiting.pop(ip, None)
            self._ready.discard(ip)

        # 2. every VIP this node may serve on lo, before any of them is announced; the ARP sysctls
        # that keep the kernel from answering for them are checked (and re-set) every time
        lo |= other
        if self.arp_unsafe:
            lo = {ip for ip in lo if ":" in ip}
        if lo != self._lo_wanted or not lo <= self._lo:
            try:
                self.delivery.sync_lo_vips(lo, state_file=os.path.join(self.state_dir, "lo-vips.json"))
                self._lo = set(lo)
                self._lo_wanted = set(lo)
            except Exception as exc:  # noqa: BLE001 - report; VIPs not on lo are not announced; retried
                logs.event(log, "loSyncFailed", str(exc)[:500], logging.ERROR)
                self._lo &= lo
                self._lo_wanted = None
        held = {ip: ifs for ip, ifs in final.items() if ip in self._lo}
        if not self._lo.issuperset(final):
            for i, r in enumerate(rows):
                if r.announcing and r.ip not in self._lo:
                    r.announcing, r.reason = False, "notOnLo"
                    new_stale.add(i)  # decided again next time (rows are reused only unchanged)
                    changed.append(r)

        # 3. planned moves: forwarding first (in the forwarder's worker), then announce
        now = time.monotonic()
        if self.handover is not None and handed:
            self._plan_handover({ip: n for ip, n in handed.items() if ip in held}, held, now, handed_wait)
        for ip in list(self._waiting):
            if ip in self._ready or now >= self._waiting[ip]:
                self._waiting.pop(ip)
                self._ready.discard(ip)
                skip.add(ip)
        for ip in self._waiting:
            held.pop(ip, None)
        if held != self._announced:
            if set(held) - set(self._announced) and hasattr(self.announcer, "reannounce"):
                # gaining: re-read the interfaces first (reannounce of nothing), so a link that just came
                # back (a cut-off node taking back, or the next node after its own link flapped) is
                # announced on at once, not at the announcer's next periodic rescan
                self.announcer.reannounce([])
            self.announcer.set_announced(held, skip_check=skip & set(held))
            self._announced = held
        leaders = {r.ip: r.leader for r in rows if r.leader}
        for ip, leader in leaders.items():  # not announced yet (waiting, not on lo): still gained from before
            if leader == me and ip not in self._announced and self._leaders.get(ip) not in (None, me):
                leaders[ip] = self._leaders[ip]
        self._leaders = leaders
        self._candidates = candidates
        self._yielded = {r.ip for r in rows if r.reason in ("suspectedByPeer", REASON_YIELDED_ON_WIRE)} | {
            r.ip for r in rows if r.ip in self._yielded and r.reason == "" and r.ip not in self._announced}
        # log what changed: rows decided differently, and the rows this node wins (the L2 layer's
        # state shows in them); the others are as they were logged before
        l2 = self.l2_view()
        watch = {id(r): r for r in changed}
        watch.update((id(r), r) for r in rows if r.announcing)
        seen = [(r, seen_key(r, l2)) for r in watch.values()]
        # busy: a won VIP the announcer has not taken yet (RFC 5227 check, or not yet picked up): decide
        # again soon even with nothing else changed, so its serviceAnnounced is logged when it is answered
        self._busy = bool(self._waiting) or bool(self.wire.yielded) or self.wire.settling() \
            or bool(self._group_failing) or any(k in _PENDING for _r, k in seen)
        self._log_seen(seen, me, present={(r.service, r.ip) for r in rows})
        self._rows_idx, self._rows_for, self._stale = rows, entries, new_stale
        for cls, decided in decided_now:
            cls.decided = decided
        with self._lock:
            self._rows = rows
        self.last_apply_ms = round((time.monotonic() - started) * 1000, 1)
        self.recent_applies = [*self.recent_applies[-15:], (round(time.time(), 3), self.last_apply_ms,
                                                            round((time.thread_time() - cpu_started) * 1000, 1))]
        self._applied = key if self._lo_wanted is not None else None

    def _watch_interfaces(self, me: str, nodes: list[NodeView], parsed: Any) -> None:
        """Tell the announcer which interfaces the L2Advertisements selecting this node name (issue 20 part 6):
        it reports the ones it cannot announce on (status, log, metric), whether this node leads a VIP or not."""
        watch = getattr(self.announcer, "watch_interfaces", None)
        if watch is None:
            return
        try:
            mine = next((n for n in nodes if n.name == me), None)
            labels = mine.labels if mine is not None else {}
            ads = [a for a in getattr(parsed, "l2_advertisements", []) if a.selects_node(labels)]
            watch(sorted({i for a in ads for i in a.interfaces}), any(not a.interfaces for a in ads))
        except Exception as exc:  # noqa: BLE001 - a report only: it never stops the decision
            logs.event(log, "interfaceWatchFailed", f"{type(exc).__name__}: {exc}"[:300], logging.ERROR)

    def _group_failed(self, cls: Any, entries: Any, rows: list, changed: list, announce: dict, lo: set,
                      exc: Exception) -> None:
        """One group of VIPs failed in ``apply``: keep what this node announced of it (its peers still elect
        it from an unchanged view) for GROUP_FAIL_BOUND s, then withdraw it; log and count; decide it again
        next time (``cls.decided`` cleared)."""
        now = time.monotonic()
        self._failed_now.add(cls.ips[0])
        first = self._group_failing.setdefault(cls.ips[0], now)
        keep = now - first < GROUP_FAIL_BOUND
        GROUP_ERRORS.inc()
        if now - self._group_logged >= 10.0:
            self._group_logged = now
            logs.event(log, "vipStepFailed", f"{type(exc).__name__}: {exc}"[:300], logging.ERROR,
                       ips=list(cls.ips)[:10], keeping=keep)
        cls.decided = None
        for i in cls.idxs:
            ip, svc, pool = entries[i][0], entries[i][1], entries[i][2]
            held = keep and ip in self._announced
            rows[i] = VipRow(ip, svc.key, pool or "", self.me if held else None, held,
                             "" if held else "stepFailed", list(self._announced.get(ip, [])), ip in self._lo)
            changed.append(rows[i])
            if held:
                announce[ip] = self._announced[ip]
                lo.add(ip)

    def _plan_handover(self, handed: dict[str, str], held: dict[str, list[str]], now: float,
                       waits: dict[str, float] | None = None) -> None:
        """Queue the forwarding of each planned move to its old owner's published MAC; the VIP waits."""
        macs = self.member_macs()
        all_ifaces = self.announcer.stats().get("interfaces", [])
        moves: dict[str, tuple[str, list[str]]] = {}
        for ip, node in handed.items():
            if ip in self._waiting:
                continue  # its forwarding is being set up already
            theirs = list(macs.get(node) or ())  # the first: a MAC it announces VIPs from
            if not theirs:
                continue  # nothing published: announce at once, no forwarding
            moves[ip] = (_mac_text(theirs[0]), held[ip] or all_ifaces)
            self._fwd_to[ip] = node
            if ip in (waits or {}):
                self._fwd_suspect.add(ip)
            else:
                self._fwd_suspect.discard(ip)
        if not moves:
            return
        for ip in moves:
            self._waiting[ip] = now + (waits or {}).get(ip, HANDOVER_WAIT)
        with self._lock:
            self._fwd_wanted.update(moves)
        shortest = min((waits or {}).get(ip, HANDOVER_WAIT) for ip in moves)
        if shortest < HANDOVER_WAIT:  # a suspected takeover: decide again right at its deadline, not a tick later
            timer = threading.Timer(shortest + 0.001, self.post)
            timer.daemon = True
            timer.start()

        wanted = sorted(moves)

        def done(ips: list[str]) -> None:
            with self._lock:
                # still led (announced, waiting, or announced without it after a short wait: a race with
                # the decision thread must not end a forwarding it still wants)
                keep = [ip for ip in ips if ip in self._fwd_wanted]
                self._forwarding.update(keep)
                self._ready.update(wanted)
            gone = sorted(set(ips) - set(keep))
            if gone:  # lost again while the forwarding was being set up
                self.handover.stop_async(gone)
            self.post()

        self.handover.forward_async(moves, done)

    def withdraw_all(self) -> None:
        self._applied = None  # the next apply runs in full
        self.announcer.set_announced({})
        self._announced = {}
        self._waiting.clear()
        with self._lock:
            fwd = sorted(self._forwarding)
            self._forwarding.clear()
            self._fwd_wanted.clear()
        if self.handover is not None and fwd:
            self.handover.stop_async(fwd)
        with self._lock:
            self._rows = [replace(r, announcing=False, reason="withdrawn") if r.announcing else r
                          for r in self._rows]
        self._log_changes(self._rows, self.me, reason="withdrawn")

    def status(self) -> dict:
        rows, l2 = self.rows()
        with self._lock:
            fwd = sorted(self._forwarding)
        return {"vips": [r.view() for r in rows],
                "conflicts": sorted(l2.conflicts.values(), key=lambda c: c["ip"]),
                "announced": sorted(self._announced) if len(self._announced) <= 1000 else len(self._announced),
                "forwarding": fwd,
                "responder": getattr(self.announcer, "responder_status", dict)(),  # answer: alarm when not up
                "interfaces": getattr(self.announcer, "interface_report", dict)(),  # issue 20 part 6
                "quorum": self.quorum(), "wire": self.wire.status(),
                "applies": self.applies, "lastApplyMs": self.last_apply_ms,
                "recentApplies": [list(a) for a in self.recent_applies]}

    def close(self) -> None:
        try:
            self.announcer.set_announced({})
            self.announcer.stop()
        finally:
            if self.handover is not None:
                self.handover.close()
        with logs.Batch(log) as out:
            for key, (announcing, _reason) in self._prev.items():
                if announcing:
                    out.event("serviceWithdrawn", service=key[0], ip=key[1], reason="shutdown")
        self._prev = {}

    # -- optional hooks ----------------------------------------------------------------------
    def busy(self) -> bool:
        return self._busy

    def _check_sysctls(self) -> None:
        """Check (and set back) the ARP sysctls; fail closed while one is wrong and cannot be set back."""
        if not hasattr(self.delivery, "verify_host"):
            return
        self.delivery.verify_host()
        unsafe = bool(getattr(self.delivery, "arp_unsafe", lambda: False)())
        if unsafe == self.arp_unsafe:
            return
        self.arp_unsafe = unsafe
        if unsafe:
            logs.event(log, "arpSysctlFailClosed", "ARP sysctls wrong and cannot be set back: the kernel would "
                       "answer for every IPv4 VIP on lo; withdrawing them from lo and from ARP, and publishing "
                       "this node as excluded so its peers take its VIPs", logging.ERROR,
                       error=str(self._sysctl_error())[:300])
        else:
            logs.event(log, "arpSysctlSafeAgain", "ARP sysctls set back: this node serves again")
        self.post()  # publish the change of exclusion and decide again

    def _sysctl_error(self) -> str:
        status: dict[str, Any] = getattr(self.delivery, "sysctl_status", dict)()
        return str(status.get("error", ""))

    def meta(self) -> dict[str, Any]:
        """The MACs this node answers from, published so peers know its answers (and forward to it);
        ``exclude`` while the node cannot serve safely (see ``_check_sysctls``)."""
        if self.arp_unsafe:
            return {**self._macs_meta(), "exclude": True}
        return self._macs_meta()

    def _macs_meta(self) -> dict[str, Any]:
        try:
            # cheap (every reconcile, 10,000 VIPs): the announcer's MACs, and the interfaces in use from
            # what it was given (all eligible ones when a VIP names none)
            macs_of = getattr(self.announcer, "macs", None)
            macs = macs_of() if macs_of is not None else self.announcer.stats().get("macs", {})
            key = (id(self._announced), tuple(sorted(macs.items())))
            if key != self._meta_key:
                used: set[str] = set()
                for ifs in self._announced.values():
                    used.update(ifs if ifs else macs)
                self._meta_key, self._meta_used = key, used
            used = self._meta_used
        except (AttributeError, KeyError, TypeError):
            return {}
        # at most MAX_MACS travel: the interfaces VIPs are announced on first
        names = sorted(macs, key=lambda n: (n not in used, n))
        out: list[bytes] = []
        for name in names:
            mac = bytes.fromhex(macs[name].replace(":", ""))
            if mac not in out:
                out.append(mac)
        return {"macs": out[:MAX_MACS]}

    def on_heal(self, heals: list[tuple[str, str]]) -> list[str]:
        """Re-announce what may have moved behind this node's back (module docstring). Returns the IPs."""
        led = sorted(ip for ip, leader in self._leaders.items() if leader == self.me and ip in self._announced)
        if not led:
            return []
        reasons: dict[str, set[str]] = {}
        want: set[str] = set()
        for reason, node in heals:
            if reason in ("refuted", "resumed", "quorumGained"):  # quorumGained: it kept them in a minority
                picked = set(led)
            elif reason == "memberJoined":
                picked = {ip for ip in led if node in self._candidates.get(ip, ())}
            else:
                picked = set()
            if picked:
                reasons.setdefault(reason, set()).add(node)
                want |= picked
        if not want:
            return []
        ips = self.announcer.reannounce(sorted(want))
        if ips:
            for reason in reasons:
                REANNOUNCED.labels(reason).inc()
            logs.event(log, "serviceReannounced", "the cluster healed: announcing again the VIPs this node leads "
                       "that may have moved", reasons=sorted(reasons), nodes=sorted(set().union(*reasons.values())),
                       count=len(ips), ips=ips[:50], node=self.me)
        return ips

    def _member_of(self, mac: bytes) -> str | None:
        """The member that published ``mac`` (None: not a member's)."""
        for name, macs in self.member_macs().items():
            if mac in macs:
                return name
        return None

    def is_peer_mac(self, mac: bytes) -> bool:
        """A MAC another member published (answers from it are a handover, not a conflict)."""
        return any(mac in macs for macs in self.member_macs().values())

    # -- reading -----------------------------------------------------------------------------
    def l2_view(self) -> L2View:
        """The announcer's per-VIP state and conflicts, read now (it changes them on its own thread)."""
        try:
            if hasattr(self.announcer, "vip_states"):  # the L2Announcer: states only, no counters copied
                states, found = self.announcer.vip_states()
                nowhere = self.announcer.unanswered() if hasattr(self.announcer, "unanswered") else frozenset()
                return L2View(states, {c["ip"]: c for c in found}, nowhere=nowhere)
            vips = self.announcer.stats().get("vips", {})
            conflicts = {c["ip"]: c for c in self.announcer.conflicts()}
        except (AttributeError, KeyError, TypeError):  # an announcer without stats(): trust the election
            return L2View({}, {}, known=False)
        return L2View({ip: v.get("state", "") for ip, v in vips.items()}, conflicts)

    def rows(self) -> tuple[list[VipRow], L2View]:
        """Every VIP row with the L2 layer's live state overlaid, and that state."""
        with self._lock:
            rows = list(self._rows)
        l2 = self.l2_view()
        return with_l2(rows, l2), l2

    def _log_changes(self, rows: list[VipRow], me: str, reason: str = "") -> None:
        self._log_seen([(r, (r.announcing, r.reason)) for r in rows], me, reason)

    def _log_seen(self, rows: list[tuple[VipRow, tuple[bool, str]]], me: str, reason: str = "",
                  present: set[tuple[str, str]] | None = None) -> None:
        """Log each row whose (announcing, reason) differs from the last logged. ``rows`` are all rows,
        or (``present`` given: the keys of all rows) only those that may have changed."""
        prev = self._prev
        seen: dict[tuple[str, str], tuple[bool, str]] = {} if present is None else \
            {k: v for k, v in prev.items() if k in present}
        with logs.Batch(log) as out:  # one VIP a line, each at its event time, written off this thread
            for r, now in rows:
                key = (r.service, r.ip)
                seen[key] = now
                before = prev.get(key)
                if before == now:
                    continue
                if now[0]:
                    out.event("serviceAnnounced", service=r.service, ip=r.ip, node=me, pool=r.pool,
                              protocol="layer2", interfaces=r.interfaces or "all eligible")
                elif before is None or before[0] or before[1] != now[1]:
                    withdrawn = bool(before and before[0])
                    out.event("serviceWithdrawn" if withdrawn else "serviceNotAnnounced",
                              level=logging.INFO if withdrawn else logging.DEBUG,
                              service=r.service, ip=r.ip, reason=now[1], leader=r.leader, node=me)
            for key, was in prev.items():
                if key not in seen and was[0]:
                    out.event("serviceWithdrawn", service=key[0], ip=key[1], reason=reason or "serviceDeleted",
                              node=me)
        self._prev = seen
