"""Layer-2 mode: the speaker's decision for ARP/NDP, carried out (see nocloudlb.modes).

``apply(me, nodes, parsed)``, with ``nodes`` the published view of the cluster:

1. for every VIP (each service's ``status.loadBalancer.ingress``), ``layer2_decision`` (pure, in
   the core), gated by the speaker (``notReady`` before the first join, ``joinRefused`` when peers
   refuse our gossip);
2. withdraw first: VIPs this node no longer leads stop being answered at once
   (``L2Announcer.set_announced``), except those a live member takes in a planned move: they are
   handed off, answered until that member announces them (handoff.py: make before break); the end
   of their handover forwarding is queued for the forwarder's worker (nft never runs on this thread);
3. ``delivery.sync_lo_vips`` with every VIP this node may serve (its L2Advertisements select it),
   then announce: a VIP is announced only once it is on ``lo`` (if adding it fails, it is not
   announced); a VIP taken over from a live member (a planned move) is announced once its
   handover forwarding is in place (or after ``HANDOVER_WAIT`` s); the VIPs gained go to the
   ``before_gain`` hook first (the data plane's connection sync, dataplane/connsync.py, commits
   the synced conntrack state there, before the first gratuitous ARP/NA);
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

The parts, each in its own module; ``L2Mode`` composes them and runs the steps above in order:
plan.py (step 1: the election's answer as rows and what to announce), forwarding.py (handover
forwarding of planned moves), handoff.py (what the side giving a VIP up answers until the taker
announces), arpguard.py (fail closed on wrong ARP sysctls), macmeta.py (the
MACs published and the members'), offwire.py (the VIPs led but not answered: checked when
taken), rows.py (the rows and the L2 layer's overlay), rowlog.py (the
log of changes), heal.py (what a heal re-announces), lohold.py (the VIPs held on lo).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from prometheus_client import Counter

from nocloudlb.core.election import NodeView
from nocloudlb.core.quorum import REASON_YIELDED_ON_WIRE

from .. import logs
from .arpguard import ArpGuard
from .disagree import WireRule
from .forwarding import Forwarding
from .handoff import HANDOFF_MAX, handoffs
from .heal import heal_picks
from .lohold import LoHold
from .macmeta import MacMeta
from .offwire import OffWire
from .plan import Planner
from .rowlog import RowLog
from .rows import PENDING, L2View, VipRow, read_l2_view, seen_key, with_l2

__all__ = ["L2Mode", "L2View", "VipRow", "member_ip", "neighbour_table", "seen_key", "with_l2"]

log = logging.getLogger("nocloudlb.speaker")

REANNOUNCED = Counter("nocloudlb_speaker_reannounced",
                      "Times this node re-announced the VIPs it leads after the cluster healed", ["reason"])


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


class L2Mode:
    """See the module docstring. ``gate()`` -> "" or the reason this node may not announce at all;
    ``member_macs()`` -> member name -> the MACs it published (this node excluded);
    ``led_off_wire(member, ip)`` -> that member said it leads ``ip`` without answering it (plan.py)."""

    name = "l2"

    def __init__(self, announcer: Any, delivery: Any, state_dir: str, *,
                 gate: Callable[[], str] = lambda: "",
                 member_macs: Callable[[], dict[str, tuple[bytes, ...]]] = dict,
                 led_off_wire: Callable[[str, str], bool] = lambda member, ip: False,
                 handover: Any = None, post: Callable[[], None] = lambda: None,
                 other_lo: Callable[[], set[str]] = set,
                 suspecters: Callable[[], frozenset[str]] = frozenset,
                 quorum: Callable[[], bool] = lambda: True,
                 before_gain: Callable[[list[str]], None] = lambda ips: None) -> None:
        self.announcer = announcer
        self.delivery = delivery
        self.state_dir = state_dir
        self.gate = gate
        self.member_macs = member_macs
        self.post = post
        # the parts read these hooks at call time, as the mode did (a test may set them after construction)
        self._lock = threading.Lock()
        self._fwd = Forwarding(self._lock, handover, self._member_macs, self._post)
        self.other_lo = other_lo  # VIPs other modes serve (BGP): held on lo here as well, never announced
        self.suspecters = suspecters  # members that suspect this node (heartbeat.py): it yields them their part
        self.quorum = quorum  # connected to a majority (nocloudlb.core.quorum): may take VIPs it does not hold
        # called with the VIPs about to be announced that were not, before set_announced queues their first
        # gratuitous ARP/NA (the data plane's connection sync commits the synced state there); bounded by
        # its caller, and a failure in it never stops the takeover
        self.before_gain = before_gain
        self._macs = MacMeta(self._member_macs)
        self.off_wire = OffWire(led_off_wire)  # VIPs their leader did not answer: checked when taken (offwire.py)
        self.wire = WireRule(self._macs.member_of, post)  # take only with quorum; the wire as the last word
        self._yielded: set[str] = set()  # VIPs this node gave up to a member suspecting it, not yet taken back
        self.me = ""
        self._rows: list[VipRow] = []
        self._rowlog = RowLog()
        self._lo = LoHold()  # the VIPs held on lo
        self._announced: dict[str, list[str]] = {}  # what set_announced was last given
        self._leaders: dict[str, str] = {}
        self._candidates: dict[str, list[str]] = {}  # ip -> candidates (this node's last decision)
        self._busy = False
        # the ARP sysctls are wrong and cannot be set back: the kernel would answer for every IPv4
        # VIP on lo, so this node holds none there, announces none and publishes itself excluded
        self._arp = ArpGuard(self._post)
        self._planner = Planner(self.off_wire.must_check)
        self._applied: tuple | None = None  # the inputs of the last full apply (work only on change)
        self.applies = 0  # full applies (the election run), for tests and the scale benchmark
        self.last_apply_ms = 0.0  # how long the last one took
        # (wall time it ended, ms, ms of this thread's CPU: the rest is waiting for the GIL or a core) of the
        # last 16
        self.recent_applies: list[tuple[float, float, float]] = []

    def _member_macs(self) -> dict[str, tuple[bytes, ...]]:
        return self.member_macs()

    def _post(self) -> None:
        self.post()

    @property
    def handover(self) -> Any:
        """The HandoverForwarder (handover.py), or None: no forwarding of planned moves."""
        return self._fwd.handover

    @handover.setter
    def handover(self, forwarder: Any) -> None:
        self._fwd.handover = forwarder

    @property
    def arp_unsafe(self) -> bool:
        """The ARP sysctls are wrong and cannot be set back (arpguard.py): this node fails closed."""
        return self._arp.unsafe

    # -- Mode ------------------------------------------------------------------------------
    def start(self) -> None:
        self.announcer.start()
        if self.handover is not None:
            self.handover.start()

    def apply(self, me: str, nodes: list[NodeView], parsed: Any) -> None:
        self.me = me
        gate = self.gate()
        self._arp.check(self.delivery)  # every apply, the quiet ones too: re-set, or fail closed (arp_unsafe)
        # work only on change: the same view, config, gate, lo set, suspecters and sysctl state as the
        # last full apply, nothing waiting or under check, lo in sync: nothing else to do
        other = frozenset(self.other_lo())
        suspecters = self.suspecters()
        quorum = self.quorum()
        key = (me, tuple((n.name, n.state, tuple(sorted(n.labels.items())), n.healthy) for n in nodes),
               id(parsed), gate, other, suspecters, self.arp_unsafe, quorum)
        if key == self._applied and not self._fwd.waiting and not self._busy and self._lo.wanted is not None \
                and not self.wire.pending():
            return
        self._applied = None
        self.applies += 1
        started, cpu_started = time.monotonic(), time.thread_time()
        self._watch_interfaces(me, nodes, parsed)
        states = {n.name: n.state for n in nodes}
        plan = self._planner.plan(me, nodes, parsed, states, gate, suspecters, self._announced, self._lo.on_lo,
                                  self._leaders, self._yielded)
        rows, skip = plan.rows, plan.skip
        final = {ip: v or [] for ip, v in plan.announce.items()}
        if self.arp_unsafe:  # fail closed: no IPv4 VIP announced (nor on lo, below) while the kernel may answer
            final = {ip: ifs for ip, ifs in final.items() if ":" in ip}
            plan.demote(lambda r: ":" not in r.ip, lambda r: "arpSysctlUnsafe")

        # when nodes disagree (l2/disagree.py): nothing new without quorum; what the wire made it yield
        def handed_over() -> set[str]:  # asked for only while settling (a pass over every VIP)
            return {ip for ip in final if ip not in self._announced
                    and (self._leaders.get(ip) in (None, me) or states.get(self._leaders[ip]) == "alive")}

        held_back = self.wire.hold_back(me, quorum, final, self._announced, plan.candidates,
                                        {r.ip: r.leader for r in rows if r.announcing and r.leader}, handed_over)
        if held_back:
            final = {ip: ifs for ip, ifs in final.items() if ip not in held_back}
            plan.demote(lambda r: r.ip in held_back, lambda r: held_back[r.ip])

        # 1. withdraw first: stop answering for what this node no longer leads, before anything slow
        kept = {ip: ifs for ip, ifs in self._announced.items() if ip in final}
        if len(kept) != len(self._announced):
            handing = {}
            if not self.arp_unsafe:
                handing = handoffs((ip for ip in self._announced if ip not in final), rows, me, states,
                                   self._member_macs(), quorum)
            if handing:
                self.announcer.set_announced(kept, hand_off=handing, hand_off_seconds=HANDOFF_MAX)
            else:
                self.announcer.set_announced(kept)
            self._announced = kept
        self._fwd.drop_lost(final, {r.ip: r.leader for r in rows}, states)

        # 2. every VIP this node may serve on lo, before any of them is announced; the ARP sysctls
        # that keep the kernel from answering for them are checked (and re-set) every time
        lo = plan.lo
        lo |= other
        if self.arp_unsafe:
            lo = {ip for ip in lo if ":" in ip}
        self._lo.sync(lo, self.delivery, self.state_dir)
        held = {ip: ifs for ip, ifs in final.items() if ip in self._lo.on_lo}
        if not self._lo.on_lo.issuperset(final):
            plan.demote(lambda r: r.ip not in self._lo.on_lo, lambda r: "notOnLo")

        # 3. planned moves: forwarding first (in the forwarder's worker), then announce
        now = time.monotonic()
        if self.handover is not None and plan.handed:
            self._fwd.plan({ip: n for ip, n in plan.handed.items() if ip in held}, held, now, self.announcer,
                           plan.handed_wait)
        self._fwd.release(held, skip, now)
        if held != self._announced:
            if set(held) - set(self._announced) and hasattr(self.announcer, "reannounce"):
                # gaining: re-read the interfaces first (reannounce of nothing), so a link that just came
                # back (a cut-off node taking back, or the next node after its own link flapped) is
                # announced on at once, not at the announcer's next periodic rescan
                self.announcer.reannounce([])
            gained = sorted(set(held) - set(self._announced))
            if gained:
                try:
                    self.before_gain(gained)
                except Exception as exc:  # noqa: BLE001 - the takeover goes on without what the hook does
                    logs.event(log, "beforeGainFailed", f"{type(exc).__name__}: {exc}"[:300], logging.ERROR)
            # taken from a member seen alive (a drain, an undrain, a preemption): it answers them until it hears
            # this node announce, so they are answered only once announced (lifecycle.py); a takeover from a
            # dead or unreachable member is answered at once (nobody else answers it)
            taken = {ip for ip in gained if self._leaders.get(ip) not in (None, me)
                     and states.get(self._leaders[ip]) == "alive"}
            self.announcer.set_announced(held, skip_check=skip & set(held), take=taken)
            self._announced = held
        leaders = {r.ip: r.leader for r in rows if r.leader}
        for ip, leader in leaders.items():  # not announced yet (waiting, not on lo): still gained from before
            if leader == me and ip not in self._announced and self._leaders.get(ip) not in (None, me):
                leaders[ip] = self._leaders[ip]
        self._leaders = leaders
        self._candidates = plan.candidates
        self._yielded = {r.ip for r in rows if r.reason in ("suspectedByPeer", REASON_YIELDED_ON_WIRE)} | {
            r.ip for r in rows if r.ip in self._yielded and r.reason == "" and r.ip not in self._announced}
        # log what changed: rows decided differently, and the rows this node wins (the L2 layer's
        # state shows in them); the others are as they were logged before
        l2 = self.l2_view()
        self.off_wire.note(l2.conflicts)
        watch = {id(r): r for r in plan.changed}
        watch.update((id(r), r) for r in rows if r.announcing)
        seen = [(r, seen_key(r, l2)) for r in watch.values()]
        # busy: a won VIP the announcer has not taken yet (RFC 5227 check, or not yet picked up): decide
        # again soon even with nothing else changed, so its serviceAnnounced is logged when it is answered
        self._busy = bool(self._fwd.waiting) or bool(self.wire.yielded) or self.wire.settling() \
            or bool(self._planner.group_failing) or any(k in PENDING for _r, k in seen)
        self._rowlog.log_seen(seen, me, present={(r.service, r.ip) for r in rows})
        self._planner.commit(plan)
        with self._lock:
            self._rows = rows
        self.last_apply_ms = round((time.monotonic() - started) * 1000, 1)
        self.recent_applies = [*self.recent_applies[-15:], (round(time.time(), 3), self.last_apply_ms,
                                                            round((time.thread_time() - cpu_started) * 1000, 1))]
        self._applied = key if self._lo.wanted is not None else None

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

    def withdraw_all(self) -> None:
        self._applied = None  # the next apply runs in full
        self.announcer.set_announced({})
        self.announcer.end_handoffs()  # fail closed: nothing answered, hand-offs included
        self._announced = {}
        self._fwd.withdraw_all()
        with self._lock:
            self._rows = [replace(r, announcing=False, reason="withdrawn") if r.announcing else r
                          for r in self._rows]
        self._rowlog.log_changes(self._rows, self.me, reason="withdrawn")

    def status(self) -> dict:
        rows, l2 = self.rows()
        fwd = self._fwd.in_place()
        return {"vips": [r.view() for r in rows],
                "conflicts": sorted(l2.conflicts.values(), key=lambda c: c["ip"]),
                "announced": sorted(self._announced) if len(self._announced) <= 1000 else len(self._announced),
                "forwarding": fwd,
                "handingOff": self.announcer.handing_off(),  # answered until the taker announces
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
        self._rowlog.shutdown()

    # -- optional hooks ----------------------------------------------------------------------
    def busy(self) -> bool:
        return self._busy

    def meta(self) -> dict[str, Any]:
        """The MACs this node answers from, published so peers know its answers (and forward to it);
        ``offWire``: VIPs it leads but does not answer (under the RFC 5227 check or in conflict; a member
        taking one checks it first, plan.py), at most one more than travel (metadata.MAX_OFF_WIRE);
        ``exclude`` while the node cannot serve safely (see arpguard.py)."""
        meta = self._macs.publish(self.announcer, self._announced)
        off_wire = self.off_wire.publish(self.announcer)
        if off_wire is not None:
            meta["offWire"] = off_wire
        if self.arp_unsafe:
            meta["exclude"] = True
        return meta

    def on_heal(self, heals: list[tuple[str, str]]) -> list[str]:
        """Re-announce what may have moved behind this node's back (module docstring). Returns the IPs."""
        led = sorted(ip for ip, leader in self._leaders.items() if leader == self.me and ip in self._announced)
        if not led:
            return []
        want, reasons = heal_picks(heals, led, self._candidates)
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

    def is_peer_mac(self, mac: bytes) -> bool:
        """A MAC another member published (answers from it are a handover, not a conflict)."""
        return self._macs.is_peer_mac(mac)

    # -- reading -----------------------------------------------------------------------------
    def l2_view(self) -> L2View:
        """The announcer's per-VIP state and conflicts, read now (it changes them on its own thread)."""
        return read_l2_view(self.announcer)

    def rows(self) -> tuple[list[VipRow], L2View]:
        """Every VIP row with the L2 layer's live state overlaid, and that state."""
        with self._lock:
            rows = list(self._rows)
        l2 = self.l2_view()
        return with_l2(rows, l2), l2
