"""L2Announcer: answers ARP/NDP for the VIPs this node leads and announces them when gained.

One event-loop thread owns the raw sockets (one AF_PACKET socket per interface, used to
send), a timer heap and per-interface transmit queues; answering is done by a child process:

- answer: the responder process (responder.py, ``python -m nocloudlb.l2.responder``) holds its
  own sockets and answers ARP requests and NS whose target is announced on that interface, at
  once (never paced), told by deltas (``_start_answering``/``_stop_answering``). It reports the
  frames the conflict check watches (the addresses in ``_checking``): answers from other MACs
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
the child's place (``_resp_fallback``) and before sending a gratuitous frame (those wait in their
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
"""

from __future__ import annotations

import errno
import heapq
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import REGISTRY, CollectorRegistry

from . import arp, ndp
from .addresses import canonical_ips
from .addresses import parse as parse_ip
from .bpf import ARP_NDP_PROGRAM, DROP_ALL, attach_filter, open_packet_socket, set_link_multicast
from .interfaces import EXCLUDED, Interface, interfaces, unusable
from .lease import Lease
from .metrics import l2_metrics
from .responder import ResponderClient

RESPONDER_PING = 0.5  # seconds between pings of the responder child
RESPONDER_TIMEOUT = 2.0  # a ping unanswered this long: the child is hung, replace it
RESPONDER_START = 20.0  # a child not ready this long after its start: replace it
_RESPONDER = object()  # selector key data of the child's stdout
LEASE_LOG_EVERY = 10.0  # seconds between leaseExpired lines (the counter counts every refusal)

# Tokens a multicast join or leave takes from the pacing bucket (a gratuitous frame takes 1). The kernel
# does not send a report per join: it puts one 20-byte record per changed group into MLDv2 state-change
# reports of up to ~70 records each, sent twice (robustness), so 1/32 of a frame a join. At one token a
# join, a takeover of 3,300 IPv6 VIPs spent 0.66 s of tokens on joins before its first NA.
MCAST_COST = 1.0 / 32
IPV6_JOIN_GROUP = getattr(socket, "IPV6_JOIN_GROUP", 20)
IPV6_LEAVE_GROUP = getattr(socket, "IPV6_LEAVE_GROUP", 21)


class _Watched(dict):
    """``_checking`` (packed ip -> _Vip) that tells the responder which addresses to watch."""

    def __init__(self, changed: Callable[[bytes, bool], None]) -> None:
        super().__init__()
        self._changed = changed

    def __setitem__(self, key: bytes, value: _Vip) -> None:
        if key not in self:
            self._changed(key, True)
        super().__setitem__(key, value)

    def pop(self, key, *default):
        if key in self:
            self._changed(key, False)
        return super().pop(key, *default)


@dataclass
class _Iface:
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
class _Vip:
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
    series: int = 0  # the gratuitous schedule in force; a re-announcement starts a new one


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
        # A cluster member answering during a handover is not a conflict: the daemon says who is one.
        self.is_peer_mac = is_peer_mac
        # Another MAC announcing (gratuitous ARP, unsolicited NA) an address this node answers: given to the
        # daemon's wire rule (l2/disagree.py) as (ip, mac); set by the daemon after construction.
        self.on_contest: Callable[[str, bytes], None] | None = None
        self.claims_seen = 0
        self.check_probes = check_probes
        self.check_interval = check_interval
        self.check_wait = check_wait
        self.garp_rounds = garp_rounds
        self.garp_interval = garp_interval
        self.rate = float(rate)
        self.burst = burst
        self.rescan_interval = rescan_interval
        self.conflict_retry = conflict_retry
        self.member_wait = member_wait
        self.member_waits = 0  # probes repeated because a member still answered (stats()["member_waits"])
        self.max_queue = max(16, int(max_queue))
        self.metrics = l2_metrics(registry)

        self._lock = threading.RLock()
        self._vips: dict[str, _Vip] = {}
        self._checking: dict[bytes, _Vip] = _Watched(self._watch_changed)
        self._ifaces: dict[str, _Iface] = {}
        self._eligible: list[str] = []
        self._info: dict[str, Interface] = {}
        self._others: dict[str, str] = {}  # links that are not Ethernet: name -> why (interfaces())
        # interface names to report on (the L2Advertisements selecting this node), and whether one of them asks
        # for every eligible interface (watch_interfaces); what is wrong with them: name -> report entry
        self._watched: tuple[frozenset[str], bool] = (frozenset(), False)
        self._unusable: dict[str, dict] = {}
        self._heap: list[tuple[float, int, str, str, int, tuple]] = []
        self._seq = 0
        self._gen = 0
        self._conflicts: dict[str, dict] = {}
        self._counts: dict[str, Counter] = {"requests_received": Counter(), "responses_sent": Counter(),
                                            "gratuitous_sent": Counter(), "reannounced": Counter()}
        self._sel: selectors.DefaultSelector | None = None
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._next_rescan = 0.0
        self._rescan_now = False
        # the answering lease (see the module docstring): granted at start() when ``lease`` is given
        self._lease = Lease.create()
        self._lease_grant = lease
        self._lease_refused = 0  # requests refused because the lease had run out (child and this thread)
        self._lease_logged = -1e9  # when leaseExpired was logged last (at most every LEASE_LOG_EVERY s)
        self.metrics.lease_remaining.set_function(self._lease_remaining)
        # the responder process (see the module docstring)
        self._resp = ResponderClient(logger, responder_argv, lease_fd=self._lease.fd)
        self._resp_up = False
        self._resp_fallback = True  # this thread answers until a child has the whole state
        self._resp_restarts = 0
        self._resp_quick = 0
        self._resp_exits: deque = deque(maxlen=5)
        self._resp_next_spawn = 0.0
        self._resp_seq = 0
        self._resp_synced_at = 0  # ping sequence that marks the end of a replay
        self._resp_ping: tuple[int, float] | None = None  # (sequence, sent at) of the ping in flight
        self._resp_pong = 0.0  # when the last one was answered
        self._resp_last_pass = 0.0
        self._resp_stats: dict = {}

    # -- public API ----------------------------------------------------------------------
    def start(self) -> None:
        """Open sockets on the interfaces in use and start the event loop thread."""
        with self._lock:
            if self._thread is not None:
                return
            self._sel = selectors.DefaultSelector()
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._sel.register(self._wake_r, selectors.EVENT_READ, None)
            self._stopping.clear()
            if self._lease_grant is not None:
                self._lease.renew(self._lease_grant)
            self._rescan()
            self._spawn_responder(time.monotonic())
            self._thread = threading.Thread(target=self._run, name=f"l2-{self.node_name}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop answering and announcing; close every socket. Safe to call twice."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        self._wake()
        thread.join(timeout=10)
        with self._lock:
            self._resp.kill()
            self._resp_up = False
            self.metrics.responder_up.set(0)
            for name in list(self._ifaces):
                self._close_iface(name)
            if self._sel is not None:
                self._sel.close()
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1
            self._sel = None
            self._thread = None

    def set_announced(self, vips: dict[str, list[str]], skip_check: Iterable[str] = ()) -> None:
        """Make ``vips`` (ip -> interfaces, [] = every eligible one) the announced set.

        Addresses not in ``vips`` are withdrawn at once. New ones are checked for
        conflicts first unless listed in ``skip_check`` (see the module docstring).
        Raises ValueError naming the first invalid address or interface list.
        """
        wanted: dict[str, tuple[str, ...]] = {}
        known = self._vips  # its keys are canonical already: not parsed again (10,000 VIPs)
        parsed: dict[str, tuple[bytes, int]] = {}
        for ip, ifs in vips.items():
            if ip not in known:
                try:
                    ip, packed, version = parse_ip(ip)
                except ValueError:
                    raise ValueError(f"set_announced: {ip!r} is not an IP address") from None
                parsed[ip] = (packed, version)
            if isinstance(ifs, list) and not ifs:  # the usual case (every eligible interface): nothing to check
                wanted[ip] = ()
                continue
            if isinstance(ifs, str) or not all(isinstance(i, str) and i for i in ifs):
                raise ValueError(f"set_announced: interfaces of {ip} must be a list of names, got {ifs!r}")
            wanted[ip] = tuple(sorted(set(ifs))) if ifs else ()
        # an entry that is a key of ``wanted`` is canonical already: not parsed again
        skips = list(skip_check)
        skip = {ip for ip in skips if ip in wanted}
        skip.update(canonical_ips([ip for ip in skips if ip not in wanted], "set_announced: skip_check entry"))
        with self._lock:
            named = {n for ifs in wanted.values() for n in ifs}
            if self._thread is not None and any(n not in self._ifaces for n in named):
                self._rescan()  # an interface named for the first time (or just created)
            for ip in [ip for ip in self._vips if ip not in wanted]:
                self._withdraw(ip)
            now = time.monotonic()
            for ip, want_ifs in wanted.items():
                vip = self._vips.get(ip)
                if vip is None:
                    self._gen += 1
                    packed, version = parsed[ip]
                    vip = _Vip(ip, packed, version, want_ifs, self._gen)
                    self._vips[ip] = vip
                    vip.ifaces = set(self._resolve(vip))
                    if ip in skip or self.check_probes == 0:
                        self._announce(vip, now, urgent=True)
                    else:
                        self._begin_check(vip, now)
                elif vip.wanted != want_ifs:
                    vip.wanted = want_ifs
                    self._apply_ifaces(vip, set(self._resolve(vip)), now)
        self._wake()

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
            if self._thread is not None:
                self._rescan()  # a link that just came back (the usual reason to re-announce) is used at once
            now = time.monotonic()
            for ip in dict.fromkeys(wanted):
                vip = self._vips.get(ip)
                if vip is None or vip.state != "announcing":
                    continue
                self._start_series(vip, now)
                self._counts["reannounced"][ip] += 1
                done.append(ip)
        if done:
            self._wake()
        return done

    def renew_lease(self, seconds: float, start_ns: int | None = None) -> int:
        """Answer for ``seconds`` more, counted from ``start_ns`` (CLOCK_MONOTONIC ns, default now).

        Thread-safe and cheap (one store into the shared page, no lock, no system call) except when
        the lease had run out: then the event loop is woken, for the gratuitous frames held meanwhile.
        Returns how many addresses were given to ``set_announced`` (0: the lease covers nothing now).
        """
        expired = not self._lease.valid()
        self._lease.renew(seconds, start_ns)
        if expired and self._lease.valid():
            self._wake()
        return len(self._vips)

    def lease_status(self) -> dict:
        """``remainingMs`` (None: no deadline yet) and ``refused``: requests not answered for want of a lease."""
        left = self._lease.remaining()
        return {"remainingMs": None if left is None else round(left * 1000, 1), "refused": self._lease_refused}

    def _lease_remaining(self) -> float:
        left = self._lease.remaining()
        return float("inf") if left is None else left

    def _lease_refuse(self, ip: str, count: int = 1) -> None:
        """``count`` requests for ``ip`` refused for want of a lease: counted, logged (every LEASE_LOG_EVERY s)."""
        self._lease_refused += count
        self.metrics.lease_expired.inc(count)
        now = time.monotonic()
        if now - self._lease_logged >= LEASE_LOG_EVERY:  # the child's late reports of one lapse: one line
            self._lease_logged = now
            self.log.warning("leaseExpired", extra={
                "event": "leaseExpired", "ip": ip, "refused": self._lease_refused,
                "reason": "not answering: the daemon did not renew the layer-2 lease in time (frozen or stalled)"})

    def watch_interfaces(self, names: Iterable[str], all_eligible: bool) -> None:
        """Report on these interfaces (those the L2Advertisements selecting this node name) whether this node
        leads a VIP or not, and, with ``all_eligible``, on there being no eligible interface at all: see
        ``interface_report``. The names of the VIPs given to ``set_announced`` are reported on as well."""
        watched = (frozenset(names), bool(all_eligible))
        with self._lock:
            if watched != self._watched:
                self._watched = watched
                self._report_interfaces()

    def interface_report(self) -> dict:
        """What the status shows: the interfaces watched, the eligible ones, and each one this node cannot
        announce on (or only warns about) with its reason: ``unusable`` [{iface, reason, detail, since}]."""
        with self._lock:
            return {"watched": sorted(self._watched[0]), "allEligible": self._watched[1],
                    "eligible": list(self._eligible),
                    "unusable": [dict(v) for _n, v in sorted(self._unusable.items())]}

    def unanswered(self) -> set[str]:
        """Addresses in the announcing state with no interface to announce on (every interface they may use
        is missing, down or enslaved): the decision path shows them as not announced (noUsableInterface)."""
        with self._lock:
            return {ip for ip, v in self._vips.items() if v.state == "announcing" and not v.ifaces}

    def _report_interfaces(self) -> None:
        """Work out ``_unusable`` from the last scan (lock held); log and count each change."""
        names = set(self._watched[0])
        for vip in self._vips.values():
            names.update(vip.wanted)
        found: dict[str, tuple[str, str]] = {}
        for name in names:
            reason, detail = unusable(name, self._info, self._others)
            if reason:
                found[name] = (reason, detail)
        if self._watched[1] and not self._eligible:
            found["*"] = ("noEligible", "no interface of this node may announce: "
                          + (", ".join(f"{n} ({unusable(n, self._info, self._others)[0] or 'excluded by name'})"
                                       for n in sorted(self._info)) or "it has no Ethernet interface"))
        gauge = self.metrics.interface_unusable
        for name in [n for n in self._unusable if found.get(n, ("",))[0] != self._unusable[n]["reason"]]:
            old = self._unusable.pop(name)
            try:
                gauge.remove(name, old["reason"])
            except KeyError:
                pass
            if name not in found:
                self.log.info("interfaceUsable", extra={"event": "interfaceUsable", "iface": name,
                                                        "was": old["reason"]})
        for name, (reason, detail) in sorted(found.items()):
            if name in self._unusable:
                continue
            self._unusable[name] = {"iface": name, "reason": reason, "detail": detail,
                                    "since": datetime.now(UTC).isoformat(timespec="seconds")}
            gauge.labels(name, reason).set(1)
            self.log.warning("interfaceUnusable", extra={
                "event": "interfaceUnusable", "iface": name, "reason": reason,
                "detail": detail if reason == "noCarrier" else f"{detail}: nothing is announced on it"})

    def conflicts(self) -> list[dict]:
        """Addresses not announced because another MAC answered for them: ip, mac, iface, at (ISO 8601)."""
        with self._lock:
            return [dict(c) for c in self._conflicts.values()]

    def macs(self) -> dict[str, str]:
        """Interface -> the MAC it announces from (cheap: no per-VIP work)."""
        with self._lock:
            return {n: arp.mac_str(i.mac) for n, i in self._ifaces.items()}

    def vip_states(self) -> tuple[dict[str, str], list[dict]]:
        """ip -> state of every address given, and the conflicts: what the decision path reads after each
        change (cheap next to ``stats()``, which copies every counter and interface list)."""
        with self._lock:
            return {ip: v.state for ip, v in self._vips.items()}, [dict(c) for c in self._conflicts.values()]

    def stats(self) -> dict:
        """Interfaces, per-VIP state and the counters (also exported to Prometheus)."""
        with self._lock:
            return {
                "interfaces": sorted(self._ifaces),
                "vips": {ip: {"state": v.state, "interfaces": sorted(v.ifaces)} for ip, v in self._vips.items()},
                "announced": {ip: sorted(v.ifaces) for ip, v in self._vips.items() if v.state == "announcing"},
                "conflicts": len(self._conflicts),
                "member_waits": self.member_waits,
                "requests_received": dict(self._counts["requests_received"]),
                "responses_sent": dict(self._counts["responses_sent"]),
                "gratuitous_sent": dict(self._counts["gratuitous_sent"]),
                "reannounced": dict(self._counts["reannounced"]),
                "queued": {n: len(i.queue) + len(i.urgent) for n, i in self._ifaces.items()},
                "queued_urgent": {n: len(i.urgent) for n, i in self._ifaces.items()},
                "frames_sent": {n: dict(i.sent) for n, i in self._ifaces.items()},
                "frames_dropped": {n: i.dropped for n, i in self._ifaces.items()},
                "macs": {n: arp.mac_str(i.mac) for n, i in self._ifaces.items()},
                "responder": self._responder_status(),
            }

    def responder_status(self) -> dict:
        """The responder process: up (has the whole state), pid, restarts, recent exits, and whether
        the announcer answers in its place meanwhile (``answeringInDaemon``); its frame counters."""
        with self._lock:
            return self._responder_status()

    def _responder_status(self) -> dict:
        return {"up": self._resp_up, "pid": self._resp.pid, "restarts": self._resp_restarts,
                "answeringInDaemon": self._resp_fallback, "exits": list(self._resp_exits),
                "lease": self.lease_status(),
                **{k: v for k, v in self._resp_stats.items() if k != "pid"}}

    # -- state changes (called with the lock held) ----------------------------------------
    def _resolve(self, vip: _Vip) -> list[str]:
        if not vip.wanted:
            return list(self._eligible)
        return [n for n in vip.wanted if n in self._info and self._info[n].announceable]  # edges (issue 8 defect 3)

    def _schedule(self, due: float, action: str, vip: _Vip, arg: tuple = ()) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, action, vip.ip, vip.gen, arg))

    def _begin_check(self, vip: _Vip, now: float) -> None:
        vip.state = "checking"
        vip.conflict = None
        vip.check_started = now
        vip.member_answered = False
        self._checking[vip.packed] = vip
        self._schedule(now, "probe", vip, (0,))

    def _announce(self, vip: _Vip, now: float, urgent: bool = False) -> None:
        """Start answering and announcing ``vip``; ``urgent``: it was taken over (its first round goes
        before any queued re-announcement)."""
        vip.state = "announcing"
        self._checking.pop(vip.packed, None)
        if self._conflicts.pop(vip.ip, None) is not None:
            self.log.info("ipConflictCleared", extra={"event": "ipConflictCleared", "ip": vip.ip})
        for name in vip.ifaces:
            self._start_answering(vip, name)
        self._start_series(vip, now, urgent)

    def _start_series(self, vip: _Vip, now: float, urgent: bool = False) -> None:
        """A new gratuitous schedule on every interface of ``vip``; the rounds still due of any earlier one
        are dropped, and so are its frames still queued (they would only repeat the new schedule's).
        ``urgent``: its first round goes in the urgent queue."""
        vip.series += 1
        self._schedule(now, "garp", vip, (0, tuple(sorted(vip.ifaces)), vip.series, urgent))

    def _start_answering(self, vip: _Vip, name: str) -> None:
        iface = self._ifaces.get(name)
        if iface is None:
            return
        if vip.version == 6:
            self._join(iface, ndp.solicited_node(vip.packed))
        iface.answer.add(vip.packed)
        self._resp.send(f"A {name} {vip.packed.hex()}")

    def _stop_answering(self, vip: _Vip, name: str) -> None:
        iface = self._ifaces.get(name)
        if iface is None:
            return
        iface.answer.discard(vip.packed)
        self._resp.send(f"D {name} {vip.packed.hex()}")
        if vip.version == 6:
            self._leave(iface, ndp.solicited_node(vip.packed))

    def _apply_ifaces(self, vip: _Vip, new: set[str], now: float) -> None:
        old = vip.ifaces
        vip.ifaces = new
        if vip.state != "announcing":
            return
        for name in old - new:
            self._stop_answering(vip, name)
        added = new - old
        for name in added:
            self._start_answering(vip, name)
        if added:
            self._schedule(now, "garp", vip, (0, tuple(sorted(added)), vip.series))

    def _withdraw(self, ip: str) -> None:
        vip = self._vips.pop(ip)
        self._checking.pop(vip.packed, None)
        if vip.state == "announcing":
            for name in vip.ifaces:
                self._stop_answering(vip, name)
        self._conflicts.pop(ip, None)

    def _current(self, ip: str, gen: int) -> _Vip | None:
        vip = self._vips.get(ip)
        return vip if vip is not None and vip.gen == gen else None

    # -- multicast groups --------------------------------------------------------------
    # Solicited-node groups are joined with IPV6_JOIN_GROUP, so the kernel also sends MLD
    # reports and MLD-snooping switches forward NS to this port. Each join or leave makes the
    # kernel send MLD reports, so the memberships follow the wanted counts through the same
    # paced queue as the gratuitous frames (one token per join/leave): a takeover of thousands
    # of IPv6 VIPs does not burst MLD either. A socket holds a limited number of groups
    # (optmem_max), so more sockets are opened as needed; where IPv6 is disabled on the
    # interface, PACKET_MR_MULTICAST on the raw socket stands in (no MLD then).
    def _join(self, iface: _Iface, group: bytes) -> None:
        iface.groups[group] += 1
        if iface.groups[group] == 1:
            iface.urgent.append(("", 0, group, "mcast", 0))  # answering NS needs it: before re-announcements

    def _leave(self, iface: _Iface, group: bytes) -> None:
        if iface.groups[group] <= 0:
            return
        iface.groups[group] -= 1
        if iface.groups[group] == 0:
            del iface.groups[group]
            iface.urgent.append(("", 0, group, "mcast", 0))  # the same queue as joins: their order is kept

    def _reconcile_group(self, iface: _Iface, group: bytes) -> bool:
        """Make the kernel membership of ``group`` match the wanted count; True if it changed."""
        wanted, joined = iface.groups.get(group, 0) > 0, group in iface.holder
        if wanted == joined:
            return False
        mreq = group + struct.pack("@I", iface.index)
        if not wanted:
            holder = iface.holder.pop(group)
            try:
                if holder is not None:
                    holder.setsockopt(socket.IPPROTO_IPV6, IPV6_LEAVE_GROUP, mreq)
                else:
                    set_link_multicast(iface.sock, iface.index, ndp.multicast_mac(group), False)
            except OSError:
                pass
            return True
        for attempt in range(2):
            if not iface.mcast or attempt:
                try:
                    iface.mcast.append(socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
                except OSError:
                    break
            try:
                iface.mcast[-1].setsockopt(socket.IPPROTO_IPV6, IPV6_JOIN_GROUP, mreq)
                iface.holder[group] = iface.mcast[-1]
                return True
            except OSError as exc:
                if exc.errno not in (errno.ENOBUFS, errno.ENOMEM):
                    break
        try:
            set_link_multicast(iface.sock, iface.index, ndp.multicast_mac(group), True)
            iface.holder[group] = None
        except OSError as exc:
            self.log.warning("multicastJoinFailed", extra={"event": "multicastJoinFailed", "iface": iface.name,
                                                           "error": str(exc)})
        return True

    # -- interfaces --------------------------------------------------------------------
    def _rescan(self) -> None:
        """Re-read interfaces; open/close sockets; re-resolve every VIP's interfaces."""
        others: dict[str, str] = {}
        try:
            info = interfaces(with_addresses=False, others=others)
        except Exception as exc:  # noqa: BLE001 - netlink hiccup: keep the current view
            self.log.warning("interfaceScanFailed", extra={"event": "interfaceScanFailed", "error": str(exc)})
            return
        before = (self._info, self._eligible, {n: (i.index, i.mac) for n, i in self._ifaces.items()})
        self._info, self._others = info, others
        # edges (issue 8 defect 3): announceable = up and not a bridge port/bond slave/tap/NOARP
        self._eligible = sorted(n for n, i in info.items() if i.announceable and not EXCLUDED.match(n))
        self._report_interfaces()  # issue 20 part 6: say what is wrong with the interfaces asked for
        needed = set(self._eligible)
        for vip in self._vips.values():
            needed.update(n for n in vip.wanted if n in info and info[n].announceable)
        for name in list(self._ifaces):
            cur = self._ifaces[name]
            i = info.get(name)
            if name not in needed or i is None or i.index != cur.index or arp.mac_bytes(i.mac) != cur.mac:
                self._close_iface(name)
        for name in sorted(needed - set(self._ifaces)):
            self._open_iface(info[name])
        self._next_rescan = time.monotonic() + self.rescan_interval
        if before == (info, self._eligible, {n: (i.index, i.mac) for n, i in self._ifaces.items()}):
            return  # nothing changed: no pass over every VIP (a cost at 10,000 VIPs every rescan_interval)
        now = time.monotonic()
        for vip in self._vips.values():
            self._apply_ifaces(vip, set(self._resolve(vip)), now)
            if vip.state == "announcing":  # re-add answers on re-opened interfaces
                for name in vip.ifaces:
                    if name in self._ifaces and vip.packed not in self._ifaces[name].answer:
                        self._start_answering(vip, name)
        self._next_rescan = time.monotonic() + self.rescan_interval

    def _open_iface(self, info: Interface) -> None:
        try:
            sock = open_packet_socket(info.name, ARP_NDP_PROGRAM if self._resp_fallback else DROP_ALL)
        except OSError as exc:
            self.log.warning("interfaceOpenFailed",
                             extra={"event": "interfaceOpenFailed", "iface": info.name, "error": str(exc)})
            return
        iface = _Iface(info.name, info.index, arp.mac_bytes(info.mac), sock,
                       tokens=float(self.burst), refilled=time.monotonic())
        self._ifaces[info.name] = iface
        if self._sel is not None:
            self._sel.register(sock, selectors.EVENT_READ, iface)
        self._resp.send(f"I {info.name} {info.index} {iface.mac.hex()}")
        self.log.info("interfaceAdded", extra={"event": "interfaceAdded", "iface": info.name})

    def _close_iface(self, name: str) -> None:
        iface = self._ifaces.pop(name)
        if self._sel is not None:
            try:
                self._sel.unregister(iface.sock)
            except (KeyError, ValueError):
                pass
        iface.answer.clear()
        now = time.monotonic()
        iface.urgent.clear()  # joins and takeover frames: the socket that would send them is gone
        for ip, gen, _frame, kind, _series in iface.queue:  # probes that will never leave: do not stall the check
            if kind == "mcast":
                continue
            vip = self._current(ip, gen)
            if kind == "probe" and vip is not None and vip.state == "checking":
                vip.probes_pending -= 1
                if vip.probes_pending <= 0:
                    self._probe_sent(vip, now)
        iface.queue.clear()
        iface.sock.close()
        self._resp.send(f"C {name}")
        for m in iface.mcast:
            m.close()  # leaves its groups
        self.log.info("interfaceRemoved", extra={"event": "interfaceRemoved", "iface": name})

    # -- event loop --------------------------------------------------------------------
    def _wake(self) -> None:
        self._resp.flush()  # the deltas of the change that woke us, in one write
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._loop_once()
            except Exception:  # noqa: BLE001 - the responder must survive anything a frame does
                self.log.exception("l2LoopError", extra={"event": "l2LoopError"})
                time.sleep(0.05)

    def _loop_once(self) -> None:
        now = time.monotonic()
        timeout = max(0.0, min(self._next_rescan - now, 1.0))
        with self._lock:
            if self._heap:
                timeout = min(timeout, max(0.0, self._heap[0][0] - now))
            no_lease = not self._lease.valid()  # gratuitous frames wait for the renewal (it wakes this loop)
            for iface in self._ifaces.values():
                if (iface.queue or iface.urgent) and not (no_lease and self._held(iface)):
                    timeout = min(timeout, max(0.0, (1.0 - iface.tokens) / self.rate))
            timeout = min(timeout, self._supervise(now))
            sel = self._sel
        if sel is None:
            return
        events = sel.select(timeout)
        with self._lock:
            for key, _mask in events:
                if key.data is _RESPONDER:
                    if not self._resp.read(self._on_responder):
                        self._responder_down("exited", time.monotonic())
                elif key.data is None:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                elif key.data.name in self._ifaces and self._ifaces[key.data.name] is key.data:
                    self._receive(key.data)
            self._run_timers()
            self._transmit()
            if self._rescan_now or time.monotonic() >= self._next_rescan:
                self._rescan_now = False
                self._rescan()

    def _receive(self, iface: _Iface) -> None:
        for _dummy in range(256):
            try:
                data = iface.sock.recv(65535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # interface went away: rescan soon
                self.log.warning("receiveFailed", extra={"event": "receiveFailed", "iface": iface.name,
                                                         "error": str(exc)})
                self._rescan_now = True
                return
            if data[12:14] == b"\x08\x06":
                self._on_arp(iface, data)
            else:
                self._on_nd(iface, data)

    def _send(self, iface: _Iface, frame: bytes) -> bool:
        try:
            iface.sock.send(frame)
            return True
        except OSError as exc:
            self.log.warning("sendFailed", extra={"event": "sendFailed", "iface": iface.name, "error": str(exc)})
            self._rescan_now = True
            return False

    # Frames reach _on_arp/_on_nd from the responder's reports (the watched addresses) or, while
    # no responder child has the state (``_resp_fallback``), from this thread's own sockets: only
    # then does this thread answer.
    def _on_arp(self, iface: _Iface, data: bytes) -> None:
        pkt = arp.parse(data)
        if pkt is None or pkt.sha == iface.mac or pkt.eth_src == iface.mac:
            return
        if pkt.op == arp.OP_REQUEST and pkt.tpa in iface.answer and pkt.spa != pkt.tpa:
            if not self._resp_fallback:
                return
            ip = pkt.target_ip
            self._counts["requests_received"][ip] += 1
            self.metrics.requests_received.labels(ip).inc()
            if not self._lease.valid():
                self._lease_refuse(ip)
            elif self._send(iface, arp.reply_to(pkt, iface.mac)):
                self._counts["responses_sent"][ip] += 1
                self.metrics.responses_sent.labels(ip).inc()
            return
        # Another MAC using an address we are checking as its sender address (RFC 5227 2.1.1):
        # an answer to our probe, an announcement, or its own requests.
        vip = self._checking.get(pkt.spa)
        if vip is not None:
            self._saw_conflict(vip, pkt.sha, iface.name)
        elif pkt.spa == pkt.tpa and pkt.spa in iface.answer:  # another MAC announces an address we answer
            self._saw_claim(pkt.spa, pkt.sha)

    def _on_nd(self, iface: _Iface, data: bytes) -> None:
        pkt = ndp.parse(data)
        if pkt is None or pkt.eth_src == iface.mac:
            return
        if pkt.type == ndp.NS:
            if pkt.target in iface.answer:
                if pkt.src == ndp.UNSPECIFIED and pkt.dst != ndp.solicited_node(pkt.target):
                    return  # RFC 4861 7.1.1: DAD NS must go to the solicited-node group
                if not self._resp_fallback:
                    return
                ip = pkt.target_ip
                self._counts["requests_received"][ip] += 1
                self.metrics.requests_received.labels(ip).inc()
                if not self._lease.valid():
                    self._lease_refuse(ip)
                elif self._send(iface, ndp.reply_to(pkt, iface.mac)):
                    self._counts["responses_sent"][ip] += 1
                    self.metrics.responses_sent.labels(ip).inc()
            return
        vip = self._checking.get(pkt.target)
        if vip is not None:
            self._saw_conflict(vip, pkt.lladdr or pkt.eth_src, iface.name)
        elif pkt.type == ndp.NA and pkt.target in iface.answer:  # another MAC announces an address we answer
            self._saw_claim(pkt.target, pkt.lladdr or pkt.eth_src)

    # -- the responder process (see responder.py) ------------------------------------------
    def _watch_changed(self, packed: bytes, added: bool) -> None:
        self._resp.send(f"{'W' if added else 'U'} {packed.hex()}")

    def _spawn_responder(self, now: float) -> None:
        """Start a responder child and replay the whole state to it (it becomes ``up`` at the pong)."""
        try:
            self._resp.spawn()
        except OSError as exc:
            self.log.error("responderSpawnFailed", extra={"event": "responderSpawnFailed", "error": str(exc)})
            self._resp_next_spawn = now + 1.0
            return
        if self._sel is not None:
            self._sel.register(self._resp.fileno(), selectors.EVENT_READ, _RESPONDER)
        for name, iface in self._ifaces.items():
            self._resp.send(f"I {name} {iface.index} {iface.mac.hex()}")
            for ip in iface.answer:
                self._resp.send(f"A {name} {ip.hex()}")
        for ip in self._checking:
            self._resp.send(f"W {ip.hex()}")
        self._ping(now)
        self._resp_synced_at = self._resp_seq

    def _ping(self, now: float) -> None:
        self._resp_seq += 1
        self._resp_ping = (self._resp_seq, now)
        self._resp.send(f"P {self._resp_seq}")

    def _supervise(self, now: float) -> float:
        """Restart a dead child, ping a live one, replace a hung one; the longest the loop may sleep."""
        gap, self._resp_last_pass = now - self._resp_last_pass, now
        if self._resp.proc is None:
            if now >= self._resp_next_spawn:
                self._spawn_responder(now)
            else:
                return self._resp_next_spawn - now
        self._resp.flush()
        limit = RESPONDER_TIMEOUT if self._resp.ready else RESPONDER_START  # Python's start-up is slow under load
        if self._resp_ping is None:
            if now - self._resp_pong < RESPONDER_PING:
                return min(RESPONDER_PING - (now - self._resp_pong), 0.01 if self._resp.out else RESPONDER_PING)
            self._ping(now)
        elif gap > RESPONDER_TIMEOUT / 2:
            self._resp_ping = (self._resp_ping[0], now)  # this loop itself stood still (host frozen): no verdict
        elif now - self._resp_ping[1] > limit:
            self._responder_down("hung" if self._resp.ready else "noStart", now)
            return 0.0
        wait = max(0.0, self._resp_ping[1] + limit - now) if self._resp_ping else RESPONDER_PING
        return min(wait, 0.01 if self._resp.out else RESPONDER_PING)

    def _on_responder(self, doc: dict) -> None:
        if "f" in doc:
            iface = self._ifaces.get(doc["f"])
            if iface is not None:
                data = bytes.fromhex(doc["x"])
                if data[12:14] == b"\x08\x06":
                    self._on_arp(iface, data)
                else:
                    self._on_nd(iface, data)
        elif "p" in doc:
            if self._resp_ping is not None and doc["p"] == self._resp_ping[0]:
                self._resp_ping = None
                self._resp_pong = time.monotonic()
                if doc["p"] >= self._resp_synced_at and not self._resp_up:
                    self._resp_up = True
                    self._set_fallback(False)
                    self.metrics.responder_up.set(1)
                    self.log.info("responderUp", extra={"event": "responderUp", "pid": self._resp.pid})
        elif "n" in doc:
            for ip, (received, sent) in doc["n"].items():
                self._counts["requests_received"][ip] += received
                self._counts["responses_sent"][ip] += sent
                self.metrics.requests_received.labels(ip).inc(received)
                self.metrics.responses_sent.labels(ip).inc(sent)
            self._resp_stats = doc.get("s", self._resp_stats)
            if doc.get("lx"):
                refused = next((ip for ip, (received, sent) in doc["n"].items() if received > sent), "")
                self._lease_refuse(refused, int(doc["lx"]))
        elif "error" in doc:
            self.log.warning("responderError", extra={"event": "responderError", "error": doc["error"]})

    def _responder_down(self, reason: str, now: float) -> None:
        """The child exited or hung: answer here at once, then start another one."""
        if self._resp.proc is None:
            return
        if self._sel is not None:
            try:
                self._sel.unregister(self._resp.fileno())
            except (KeyError, ValueError):
                pass
        quick = not self._resp.ready or now - self._resp.started < 1.0
        rc = self._resp.kill()
        self._set_fallback(True)
        self._resp_up = False
        self._resp_ping = None
        self.metrics.responder_up.set(0)
        self.metrics.responder_restarts.inc()
        self._resp_restarts += 1
        self._resp_exits.append({"at": datetime.now(UTC).isoformat(timespec="milliseconds"), "reason": reason,
                                 "returncode": rc})
        self.log.error("responderDown", extra={"event": "responderDown", "reason": reason, "returncode": rc,
                                               "restarts": self._resp_restarts})
        self._resp_quick = self._resp_quick + 1 if quick else 0  # dying at start again and again: back off
        self._resp_next_spawn = now + (min(5.0, 0.1 * 2 ** self._resp_quick) if self._resp_quick > 1 else 0.0)
        if self._resp_next_spawn <= now:
            self._spawn_responder(now)

    def _set_fallback(self, on: bool) -> None:
        """This thread answers (its sockets take ARP/NDP) or only sends (drop-all filter)."""
        self._resp_fallback = on
        for iface in self._ifaces.values():
            try:
                attach_filter(iface.sock, ARP_NDP_PROGRAM if on else DROP_ALL)
            except OSError as exc:
                self.log.warning("filterFailed", extra={"event": "filterFailed", "iface": iface.name,
                                                        "error": str(exc)})

    def _saw_claim(self, packed: bytes, mac: bytes) -> None:
        if any(mac == i.mac for i in self._ifaces.values()):
            return
        self.claims_seen += 1
        if self.on_contest is not None:
            ip = socket.inet_ntop(socket.AF_INET if len(packed) == 4 else socket.AF_INET6, packed)
            self.on_contest(ip, mac)

    def _saw_conflict(self, vip: _Vip, mac: bytes, iface: str) -> None:
        if any(mac == i.mac for i in self._ifaces.values()):
            return
        if self.is_peer_mac is not None and self.is_peer_mac(mac):
            self.log.debug("memberAnswered", extra={"event": "memberAnswered", "ip": vip.ip, "iface": iface,
                                                    "mac": arp.mac_str(mac)})
            with self._lock:
                if vip.state == "checking":
                    vip.member_answered = True  # it hands over once it hears this node: wait for its silence
            return
        with self._lock:
            if vip.state == "checking" and vip.conflict is None:
                vip.conflict = {"ip": vip.ip, "mac": arp.mac_str(mac), "iface": iface,
                                "at": datetime.now(UTC).isoformat(timespec="milliseconds")}

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._heap and self._heap[0][0] <= now:
            _when, _seq, action, ip, gen, arg = heapq.heappop(self._heap)
            vip = self._current(ip, gen)
            if vip is None:
                continue
            if action == "probe" and vip.state == "checking":
                n = arg[0]
                vip.probe_no = n
                vip.probes_pending = 0
                for name in sorted(vip.ifaces):
                    iface = self._ifaces.get(name)
                    if iface is None:
                        continue
                    frame = (arp.probe(iface.mac, vip.packed) if vip.version == 4
                             else ndp.solicitation(iface.mac, vip.packed))
                    iface.queue.append((ip, gen, frame, "probe", 0))
                    vip.probes_pending += 1
                if vip.probes_pending == 0:
                    self._probe_sent(vip, now)
            elif action == "decide" and vip.state == "checking":
                if vip.conflict is None and vip.member_answered and now - vip.check_started < self.member_wait:
                    vip.member_answered = False  # a member still answers: probe again, announce at its silence
                    self.member_waits += 1
                    self._schedule(now, "probe", vip, (max(0, self.check_probes - 1),))
                elif vip.conflict is None:
                    self._announce(vip, now)
                else:
                    self._on_conflict(vip, now)
            elif action == "recheck" and vip.state == "conflict":
                self._begin_check(vip, now)
            elif action == "garp" and vip.state == "announcing":
                rnd, names, series = arg[:3]
                urgent = rnd == 0 and len(arg) > 3 and arg[3]
                if series != vip.series:
                    continue  # replaced by a newer schedule (reannounce)
                for name in names:
                    iface = self._ifaces.get(name)
                    if iface is None or name not in vip.ifaces:
                        continue
                    frames = (arp.gratuitous(iface.mac, vip.packed) if vip.version == 4
                              else [ndp.unsolicited_na(iface.mac, vip.packed)])
                    if urgent:  # a takeover displaces queued re-announcements (newest first)
                        self._make_room(iface, len(frames), now)
                    if len(iface.queue) + len(iface.urgent) + len(frames) > self.max_queue:
                        # bounded: a round that does not fit is dropped (the next round comes anyway)
                        iface.dropped += len(frames)
                        continue
                    target = iface.urgent if urgent else iface.queue
                    for frame in frames:
                        target.append((ip, gen, frame, "gratuitous", series))
                if rnd + 1 < self.garp_rounds:
                    self._schedule(now + self.garp_interval, "garp", vip, (rnd + 1, names, series))

    def _make_room(self, iface: _Iface, frames: int, now: float) -> None:
        """Drop queued non-urgent frames, newest first, until ``frames`` more fit in ``max_queue``."""
        while iface.queue and len(iface.queue) + len(iface.urgent) + frames > self.max_queue:
            ip, gen, _frame, kind, _series = iface.queue.pop()
            iface.dropped += 1
            vip = self._current(ip, gen)
            if kind == "probe" and vip is not None and vip.state == "checking":
                vip.probes_pending -= 1  # a probe that will never leave: do not stall the check
                if vip.probes_pending <= 0:
                    self._probe_sent(vip, now)

    def _probe_sent(self, vip: _Vip, now: float) -> None:
        """All frames of probe ``vip.probe_no`` left (pacing may delay them): time the next step from now."""
        if vip.probe_no + 1 < self.check_probes:
            self._schedule(now + self.check_interval, "probe", vip, (vip.probe_no + 1,))
        else:
            self._schedule(now + self.check_wait, "decide", vip)

    def _on_conflict(self, vip: _Vip, now: float) -> None:
        vip.state = "conflict"
        self._checking.pop(vip.packed, None)
        first = vip.ip not in self._conflicts
        self._conflicts[vip.ip] = dict(vip.conflict or {})
        self.metrics.conflicts.labels(vip.ip).inc()
        if first:
            self.log.warning("ipConflict", extra={"event": "ipConflict", **(vip.conflict or {})})
        if self.conflict_retry > 0:
            self._schedule(now + self.conflict_retry, "recheck", vip)

    @staticmethod
    def _held(iface: _Iface) -> bool:
        """The next frame to leave ``iface`` is a gratuitous one (it waits while the lease has run out)."""
        head = (iface.urgent or iface.queue)[0]
        return head[3] == "gratuitous"

    def _transmit(self) -> None:
        now = time.monotonic()
        leased = self._lease.valid()
        for iface in self._ifaces.values():
            iface.tokens = min(float(self.burst), iface.tokens + (now - iface.refilled) * self.rate)
            iface.refilled = now
            budget = 512  # frames per loop pass, so receiving is never starved
            while (iface.urgent or iface.queue) and iface.tokens >= 1.0 and budget > 0:
                if not leased and self._held(iface):
                    head = (iface.urgent or iface.queue)[0]
                    if self._current(head[0], head[1]) is not None:
                        break  # no lease: claim nothing on the wire; kept, in order, for the next renewal
                ip, gen, frame, kind, series = (iface.urgent or iface.queue).popleft()
                if kind == "mcast":
                    if self._reconcile_group(iface, frame):
                        budget -= 1
                        iface.tokens -= MCAST_COST
                        iface.sent["mcast"] += 1
                    continue
                vip = self._current(ip, gen)
                if vip is None or vip.state != ("announcing" if kind == "gratuitous" else "checking"):
                    continue  # withdrawn (or check abandoned) meanwhile: drop without spending a token
                if kind == "gratuitous" and series != vip.series:
                    iface.dropped += 1
                    continue  # superseded by a newer schedule (reannounce): its own frames are queued
                budget -= 1
                iface.tokens -= 1.0
                ok = self._send(iface, frame)
                if kind == "probe":
                    vip.probes_pending -= 1
                    if vip.probes_pending <= 0:
                        self._probe_sent(vip, time.monotonic())
                if ok:
                    iface.sent[kind] += 1
                    if kind == "gratuitous":
                        self._counts["gratuitous_sent"][ip] += 1
                        self.metrics.gratuitous_sent.labels(ip).inc()
