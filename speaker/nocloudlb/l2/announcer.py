"""L2Announcer: answers ARP/NDP for the VIPs this node leads and announces them when gained.

One event-loop thread owns the raw sockets (one AF_PACKET socket per interface, used to
send), a timer heap and per-interface transmit queues; answering is done by a child process:

- answer: the responder process (responder.py, ``python -m nocloudlb.l2.responder``) holds its
  own sockets and answers ARP requests and NS whose target is announced on that interface, at
  once (never paced), told by deltas (vips.py, ``start_answering``/``stop_answering``). It reports the
  frames the conflict check watches (the addresses in ``VipTable.checking``): answers from other MACs
  for an address under check are conflicts.
- supervise: the child is pinged every second; when it exits or hangs it is restarted at once
  and, until the new one has the whole state, this thread answers itself (its sockets switch
  from the send-only filter to the ARP/NDP one): the node never leads a VIP that nothing
  answers. ``stats()["responder"]`` and ``nocloudlb_layer2_responder_up`` show it.
- timers: the conflict check (probes, then a decision) and the gratuitous ARP/NA rounds.
- transmit: probes and gratuitous frames go through a per-interface token bucket, so a
  takeover of thousands of VIPs is spread out instead of burst onto the segment. Two queues
  share the bucket: the first round of a VIP just gained (a takeover) and the multicast joins
  that let it be answered go first (``urgent``); later rounds, re-announcements and probes wait
  behind them, so a re-announcement backlog never delays a takeover.

Lifecycle of an address given to ``set_announced``::

    new ip ──► checking (RFC 5227 style: ``check_probes`` ARP probes / DAD NS,
      │                  ``check_interval`` apart, then listen ``check_wait``)
      │           ├─ another MAC answered ─► conflict (logged, counted, in conflicts();
      │           │                            re-checked every ``conflict_retry`` s, never fought)
      │           ├─ a member's MAC answered ─► probe again, until a probe meets silence
      │           │                             or ``member_wait`` s from the check's start
      │           └─ silence ─► announcing
      └─ ip in skip_check ─────────────────► announcing
    announcing: answer requests; gratuitous ARP (request + reply form) / unsolicited NA with
                the override flag now, then ``garp_rounds - 1`` more rounds ``garp_interval`` apart
    ip no longer given ─► forgotten at once (no more answers, queued gratuitous frames dropped)
    ip no longer given, in hand_off ─► handing off: answered (no more gratuitous frames) until another
                MAC announces it (a planned move: make before break; the taker's MACs given beside it) or
                ``hand_off_seconds`` pass; given again meanwhile, it is answered on as before and announced again
    reannounce(ips): an announcing ip starts its gratuitous schedule again from round 0 (no check)

Why ``skip_check``: the check exists for addresses nobody in the cluster announced
before (first start, a VIP added to the config). When the daemon hands over an address
from another member (the old leader died, was drained, left, or a restarted node preempts
it), checking would either cost failover time (dead owner: nobody answers, ~0.3 s lost)
or find the old leader still answering during a graceful handover and wrongly call it a
conflict. The daemon knows which case it is in, so it passes those addresses in
``skip_check``.

Why a member's answer is waited out: the check also runs when this node takes an address back from
a member that holds it now (a restarted node preempting the member that took over, or a VIP taken
back after a false suspicion). That member stops answering once it hears this node again, at about
the moment this node decides; announcing at once would let both answer for a few milliseconds. So
the check repeats its last probe while a member (``is_peer_mac``) answers, and announces at the
first silence: the member hands over first, then this node takes. The member serves meanwhile, so
nothing is lost. After ``member_wait`` seconds it announces anyway (a member that does not hear this
node keeps answering; the daemon's wire rule, l2/disagree.py, decides which of the two yields).

The lease (lease.py). Answers and gratuitous frames happen only while the lease the daemon renews
(``renew_lease``, a plain store into a shared memory page, from any thread) has not run out: the
responder child reads the same page before each answer, this thread checks it before answering in
the child's place (``ResponderSupervisor.fallback``) and before sending a gratuitous frame (those wait in their
queue, in order, until the next renewal, or are dropped when their VIP is withdrawn meanwhile;
probes and multicast joins are not held). So a frozen daemon's node stops answering within one
lease, while its peers take its VIPs. Start-up: constructed with ``lease=None`` (tools and tests
that drive the announcer directly) the lease is open (no deadline) until the first ``renew_lease``,
which makes it binding; with ``lease=S`` it is granted for S seconds at ``start()``. The daemon
renews it before its first reconcile, so it binds before any VIP is answered, and on every pass of
its decision loop after that (while it waits, at least every third of the lease). Thaw: the daemon
does not renew at once after a freeze longer than the lease (its peers took the VIPs meanwhile); it
waits for its heartbeat thread to read what arrived during the freeze, reconciles, then renews (see
``lease.Renewal`` and ``Speaker._next_event``). ``lease_status()`` (also
``stats()["responder"]["lease"]``) and ``nocloudlb_layer2_lease_expired_total`` /
``nocloudlb_layer2_lease_remaining_seconds`` show it.

Why ``reannounce``: the announcer only announces on a *change* of its own view. When the
cluster heals (a frozen leader thaws, a leader's link comes back, a partition merges), the
election gives a VIP back to a node that, in its own view, never lost it, while the client's
neighbour cache still points at the interim owner. The daemon then calls ``reannounce`` with
the addresses it leads, and the full schedule (paced as usual) moves the clients back.

The parts, each in its own module; ``L2Announcer`` composes them and keeps the public,
thread-safe methods: loop.py (the event loop thread: it only schedules), poller.py (the
selector), tables.py (the records), links.py (interfaces and their sockets, the interface
report), vips.py (the addresses given, what is answered where), lifecycle.py (the timers: check,
gratuitous rounds, re-check), pacing.py (the token buckets), mcast.py (solicited-node groups),
answering.py (frames: answers in the child's place, conflicts, contests), supervisor.py (the
responder child), leasegate.py (the lease). Every part is used with the announcer's one lock
held, on its event loop thread or a caller's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import REGISTRY, CollectorRegistry

from .addresses import canonical_ips
from .answering import Answerer
from .leasegate import LeaseGate
from .lifecycle import Lifecycle
from .links import Links
from .loop import EventLoop
from .mcast import Groups
from .metrics import l2_metrics
from .pacing import Pacer
from .poller import Poller
from .responder import ResponderClient
from .supervisor import ResponderSupervisor
from .tables import Vip
from .vips import VipTable, parse_wanted


class L2Announcer:
    """Layer-2 announcer; see the module docstring. Thread-safe public methods."""

    def __init__(
        self,
        node_name: str,
        logger: logging.Logger,
        *,
        check_probes: int = 2,
        check_interval: float = 0.1,
        check_wait: float = 0.2,
        garp_rounds: int = 5,
        garp_interval: float = 1.1,
        rate: float = 5000.0,
        burst: int = 200,
        rescan_interval: float = 5.0,
        conflict_retry: float = 30.0,
        member_wait: float = 2.0,
        max_queue: int = 65536,
        registry: CollectorRegistry | None = REGISTRY,
        is_peer_mac: Callable[[bytes], bool] | None = None,
        responder_argv: list[str] | None = None,
        lease: float | None = None,
    ) -> None:
        for name, value, low in [("check_probes", check_probes, 0), ("garp_rounds", garp_rounds, 1),
                                 ("rate", rate, 1), ("burst", burst, 1), ("check_interval", check_interval, 0),
                                 ("check_wait", check_wait, 0), ("garp_interval", garp_interval, 0.01),
                                 ("member_wait", member_wait, 0),
                                 ("rescan_interval", rescan_interval, 0.1)]:
            if value < low:
                raise ValueError(f"L2Announcer: {name} must be >= {low}, got {value!r}")
        if lease is not None and not lease > 0:
            raise ValueError(f"L2Announcer: lease must be > 0 seconds (or None: open until renewed), got {lease!r}")
        self.node_name = node_name
        self.log = logger
        self.metrics = l2_metrics(registry)
        self._lock = threading.RLock()
        self._counts: dict[str, Counter] = {"requests_received": Counter(), "responses_sent": Counter(),
                                            "gratuitous_sent": Counter(), "reannounced": Counter()}
        self._poller = Poller()
        # the answering lease (see the module docstring): granted at start() when ``lease`` is given
        self._lease = LeaseGate(logger, self.metrics, lease)
        # the responder process (see the module docstring)
        self._resp = ResponderClient(logger, responder_argv, lease_fd=self._lease.fd)
        vips: dict[str, Vip] = {}  # ip -> Vip: the table's, and the interfaces' (the names VIPs ask for)
        self._links = Links(logger, self.metrics, self._poller, self._resp, vips, rescan_interval=rescan_interval,
                            burst=burst, fallback=lambda: self._responder.fallback)
        self._groups = Groups(logger)
        self._table = VipTable(self._links, self._groups, self._resp, vips)
        self._lifecycle = Lifecycle(logger, self.metrics, self._table, self._links, check_probes=check_probes,
                                    check_interval=check_interval, check_wait=check_wait, garp_rounds=garp_rounds,
                                    garp_interval=garp_interval, conflict_retry=conflict_retry,
                                    member_wait=member_wait, max_queue=max(16, int(max_queue)))
        self._links.on_close = self._lifecycle.queue_lost
        self._pacer = Pacer(self.metrics, self._links, self._table, self._lifecycle, self._groups, self._lease,
                            self._counts, rate=float(rate), burst=burst)
        self._answerer = Answerer(logger, self.metrics, self._lock, self._links, self._table, self._lease,
                                  self._counts, fallback=lambda: self._responder.fallback, is_peer_mac=is_peer_mac)
        self._responder = ResponderSupervisor(logger, self.metrics, self._resp, self._poller, self._links,
                                              self._table, self._lease, self._counts, self._answerer.on_frame)
        self._loop = EventLoop(f"l2-{node_name}", logger, self._lock, self._poller, self._resp, self._links,
                               self._lifecycle, self._pacer, self._answerer, self._responder)

    # the daemon's hooks and counters, kept by the part that uses them
    @property
    def is_peer_mac(self) -> Callable[[bytes], bool] | None:
        """A cluster member answering during a handover is not a conflict: the daemon says who is one."""
        return self._answerer.is_peer_mac

    @property
    def on_contest(self) -> Callable[[str, bytes], None] | None:
        """Another MAC announcing an address this node answers: given to the daemon's wire rule
        (l2/disagree.py) as (ip, mac); set by the daemon after construction."""
        return self._answerer.on_contest

    @on_contest.setter
    def on_contest(self, hook: Callable[[str, bytes], None] | None) -> None:
        self._answerer.on_contest = hook

    @property
    def claims_seen(self) -> int:
        return self._answerer.claims_seen

    @property
    def member_waits(self) -> int:
        return self._lifecycle.member_waits

    # -- public API ----------------------------------------------------------------------
    def start(self) -> None:
        """Open sockets on the interfaces in use and start the event loop thread."""
        with self._lock:
            if self._loop.thread is not None:
                return
            self._poller.open()
            self._lease.start()
            self._loop.rescan()
            self._responder.spawn(time.monotonic())
            self._loop.start()

    def stop(self) -> None:
        """Stop answering and announcing; close every socket. Safe to call twice."""
        if not self._loop.stop():
            return
        with self._lock:
            self._responder.stop()
            for name in list(self._links.ifaces):
                self._links.close(name)
            self._poller.close()
            self._loop.thread = None

    def set_announced(self, vips: dict[str, list[str]], skip_check: Iterable[str] = (),
                      hand_off: Mapping[str, Iterable[bytes]] | None = None, hand_off_seconds: float = 2.5,
                      take: Iterable[str] = ()) -> None:
        """Make ``vips`` (ip -> interfaces, [] = every eligible one) the announced set.

        Addresses not in ``vips`` are withdrawn at once, except those in ``hand_off`` (ip -> the MACs of
        the member taking it): each is still answered until another MAC announces it, at most
        ``hand_off_seconds`` (hand-offs already running go on; ``end_handoffs`` ends them all). New ones
        are checked for conflicts first unless listed in ``skip_check`` (see the module docstring). New ones in
        ``take`` and ``skip_check`` are taken from a member that answers them until it hears this node: each is
        answered only once its first announcement has left (lifecycle.py).
        Raises ValueError naming the first invalid address or interface list.
        """
        wanted, parsed = parse_wanted(vips, self._table.vips)
        # an entry that is a key of ``wanted`` is canonical already: not parsed again
        skip = _canonical_set(skip_check, wanted, "set_announced: skip_check entry")
        taken = _canonical_set(take, wanted, "set_announced: take entry")
        with self._lock:
            named = {n for ifs in wanted.values() for n in ifs}
            if self._loop.thread is not None and any(n not in self._links.ifaces for n in named):
                self._loop.rescan()  # an interface named for the first time (or just created)
            for ip in [ip for ip in self._table.vips if ip not in wanted]:
                macs = frozenset(hand_off.get(ip, ())) if hand_off else frozenset()
                if macs:
                    self._table.hand_off(ip, macs, hand_off_seconds)
                else:
                    self._table.withdraw(ip)
            now = time.monotonic()
            for ip, want_ifs in wanted.items():
                vip = self._table.vips.get(ip)
                if vip is None and self._table.handing:
                    vip = self._table.resume(ip)
                    if vip is not None:  # taken back while being handed off: answered as before, announced
                        # again at once (a client may have followed the taker, if its announcement went unseen)
                        self._lifecycle.start_series(vip, now, urgent=True)
                if vip is None:
                    vip = self._table.add(ip, *parsed[ip], want_ifs)
                    if ip in skip or self._lifecycle.check_probes == 0:
                        self._lifecycle.announce(vip, now, urgent=True, take=ip in taken and ip in skip)
                    else:
                        self._lifecycle.begin_check(vip, now)
                elif vip.wanted != want_ifs:
                    vip.wanted = want_ifs
                    self._lifecycle.apply_ifaces(vip, set(self._links.resolve(vip)), now)
        self._loop.wake()

    def end_handoffs(self) -> None:
        """Stop answering every address being handed off, now (the daemon fails closed, or stops)."""
        with self._lock:
            self._table.end_handoffs()
            self._lifecycle.log_handoffs()
        self._loop.wake()

    def handing_off(self) -> dict[str, float]:
        """Addresses being handed off: ip -> seconds since the hand-off began."""
        now = time.monotonic()
        with self._lock:
            return {ip: round(now - h.since, 3) for ip, h in self._table.handing.items()}

    def reannounce(self, ips: Iterable[str]) -> list[str]:
        """Send the gratuitous ARP / unsolicited NA schedule again for those of ``ips`` being announced.

        No conflict check (the address is ours already). Interfaces are re-read first, so a link
        that just came back is announced on at once. Each one restarts from round 0 on every
        interface it is announced on, replacing its schedule in progress (so a burst of calls does
        not multiply the frames); frames go through the per-interface pacing as usual. Addresses
        not announced here (unknown, under check, in conflict) are skipped. Returns the addresses
        re-announced, normalised. Raises ValueError naming an entry that is not an IP address.
        """
        wanted = canonical_ips(ips, "reannounce:")
        done: list[str] = []
        with self._lock:
            if self._loop.thread is not None:
                self._loop.rescan()  # a link that just came back (the usual reason to re-announce) is used at once
            now = time.monotonic()
            for ip in dict.fromkeys(wanted):
                vip = self._table.vips.get(ip)
                if vip is None or vip.state != "announcing":
                    continue
                self._lifecycle.start_series(vip, now)
                self._counts["reannounced"][ip] += 1
                done.append(ip)
        if done:
            self._loop.wake()
        return done

    def renew_lease(self, seconds: float, start_ns: int | None = None) -> int:
        """Answer for ``seconds`` more, counted from ``start_ns`` (CLOCK_MONOTONIC ns, default now).

        Thread-safe and cheap (one store into the shared page, no lock, no system call) except when
        the lease had run out: then the event loop is woken, for the gratuitous frames held meanwhile.
        Returns how many addresses were given to ``set_announced`` (0: the lease covers nothing now).
        """
        if self._lease.renew(seconds, start_ns):
            self._loop.wake()
        return len(self._table.vips)

    def lease_status(self) -> dict:
        """``remainingMs`` (None: no deadline yet) and ``refused``: requests not answered for want of a lease."""
        return self._lease.status()

    def watch_interfaces(self, names: Iterable[str], all_eligible: bool) -> None:
        """Report on these interfaces (those the L2Advertisements selecting this node name) whether this node
        leads a VIP or not, and, with ``all_eligible``, on there being no eligible interface at all: see
        ``interface_report``. The names of the VIPs given to ``set_announced`` are reported on as well."""
        with self._lock:
            self._links.watch(frozenset(names), bool(all_eligible))

    def interface_report(self) -> dict:
        """What the status shows: the interfaces watched, the eligible ones, and each one this node cannot
        announce on (or only warns about) with its reason: ``unusable`` [{iface, reason, detail, since}]."""
        with self._lock:
            return self._links.report_view()

    def unanswered(self) -> set[str]:
        """Addresses in the announcing state with no interface to announce on (every interface they may use
        is missing, down or enslaved): the decision path shows them as not announced (noUsableInterface)."""
        with self._lock:
            return self._table.unanswered()

    def off_wire(self, limit: int) -> list[str]:
        """At most ``limit`` addresses given that are not answered: under the RFC 5227 check or in conflict
        (published to peers, metadata ``x``: one taking them from this node checks them first)."""
        with self._lock:
            out = list(self._table.conflicts)[:limit]
            for vip in self._table.checking.values():
                if len(out) >= limit:
                    break
                if vip.ip not in self._table.conflicts:
                    out.append(vip.ip)
            return out

    def conflicts(self) -> list[dict]:
        """Addresses not announced because another MAC answered for them: ip, mac, iface, at (ISO 8601)."""
        with self._lock:
            return self._table.conflict_list()

    def macs(self) -> dict[str, str]:
        """Interface -> the MAC it announces from (cheap: no per-VIP work)."""
        with self._lock:
            return self._links.macs()

    def vip_states(self) -> tuple[dict[str, str], list[dict]]:
        """ip -> state of every address given, and the conflicts: what the decision path reads after each
        change (cheap next to ``stats()``, which copies every counter and interface list)."""
        with self._lock:
            return self._table.states(), self._table.conflict_list()

    def stats(self) -> dict:
        """Interfaces, per-VIP state and the counters (also exported to Prometheus)."""
        with self._lock:
            vips, ifaces = self._table.vips, self._links.ifaces
            return {
                "interfaces": sorted(ifaces),
                "vips": {ip: {"state": v.state, "interfaces": sorted(v.ifaces)} for ip, v in vips.items()},
                "announced": {ip: sorted(v.ifaces) for ip, v in vips.items() if v.state == "announcing"},
                "conflicts": len(self._table.conflicts),
                "handing_off": sorted(self._table.handing),
                "member_waits": self._lifecycle.member_waits,
                "taken": self._pacer.takes, "takes_late": self._lifecycle.takes_late,
                "requests_received": dict(self._counts["requests_received"]),
                "responses_sent": dict(self._counts["responses_sent"]),
                "gratuitous_sent": dict(self._counts["gratuitous_sent"]),
                "reannounced": dict(self._counts["reannounced"]),
                "queued": {n: len(i.queue) + len(i.urgent) for n, i in ifaces.items()},
                "queued_urgent": {n: len(i.urgent) for n, i in ifaces.items()},
                "frames_sent": {n: dict(i.sent) for n, i in ifaces.items()},
                "frames_dropped": {n: i.dropped for n, i in ifaces.items()},
                "macs": self._links.macs(),
                "responder": self._responder.status(),
            }

    def responder_status(self) -> dict:
        """The responder process: up (has the whole state), pid, restarts, recent exits, and whether
        the announcer answers in its place meanwhile (``answeringInDaemon``); its frame counters."""
        with self._lock:
            return self._responder.status()


def _canonical_set(entries: Iterable[str], wanted: Mapping[str, object], what: str) -> set[str]:
    """``entries`` in canonical form; a key of ``wanted`` is canonical already (not parsed again: 10,000 VIPs).
    ValueError says ``what`` then the first entry that is not an IP address."""
    given = list(entries)
    out = {ip for ip in given if ip in wanted}
    out.update(canonical_ips([ip for ip in given if ip not in wanted], what))
    return out
