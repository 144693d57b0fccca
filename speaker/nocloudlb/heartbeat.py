"""Direct heartbeats between members: fast failure suspicion, at a cost per node, never per VIP.

Gossip (kinship, SWIM) declares a crashed member dead after a probe round, indirect probes and a
suspicion timeout: 0.3-0.9 s at the shortest timers it takes. Heartbeats suspect it within
``interval x miss`` (the ``fast`` profile: 25 ms x 4) and gossip stays the judge of membership:
a suspected member is only *ineligible* (its VIPs go to the next node in their order, with handover
forwarding toward it, see l2/mode.py); it is declared dead, or comes back, by gossip.

Wire. Every ``interval`` each node sends one UDP datagram to every live member (gossip state
alive or suspect) at that member's gossip address, port + ``port_offset`` (every member uses the
same offset). The packets a node sends per second are ``members / interval``, whatever the number
of VIPs it leads. A datagram (network byte order)::

    "NLH2" | flags u8 | len u8 + sender name | len u8 + recipient name | boot u64 | seq u64
          | suspicions u32 | meta seq u32 | count u8 + (len u8 + name) the sender misses
          | [meta len u16 + meta JSON]   | HMAC-SHA256[:16]

- ``flags``: 1 = the sender suspects the recipient now (it stopped hearing it), 2 = meta follows.
- ``boot``: the sender's start time in ns, ``seq``: its packet counter. A receiver accepts a packet
  from a sender only with a larger ``(boot, seq)`` than the last it accepted: replays are refused.
- ``suspicions``: how many times the sender has suspected the recipient so far.
- the members the sender *misses* (heard before, not within ``interval x miss``): a second opinion
  for the recipient, like SWIM's indirect probe. A change of that list is sent at once.
- ``meta``: after this node published new metadata (labels: a drain), the next
  ``META_REPEAT`` packets to each peer carry it whole, the first one sent at once: peers apply a
  drain within a round trip instead of a gossip round. Every packet carries ``meta seq``; a
  receiver uses the meta it got by heartbeat only while its ``meta seq`` is the sender's latest
  (otherwise gossip's copy): it is what the sender published (kinship accepted it first), so every
  node still decides from published state.
- The HMAC key is derived from each memberlist key (``keyFile``): any key of the ring verifies, the
  first signs (rotation works as for gossip). Without keys (allowed for a one-member cluster only:
  the config of a cluster without ``keyFile`` is refused) the HMAC still catches corruption but
  authenticates nothing.

The suspicion rule (fail closed, never two owners as far as this node can tell). With ``heard(X)``
"a packet from X accepted within ``interval x miss``" and ``live`` the members gossip holds alive
or suspect (this node excluded), this node:

1. suspects a live member P it has heard at least once since it joined when it does not hear P
   now and either ``CONFIRMATIONS`` (2) live members it hears miss P too (their latest datagrams
   say so: other paths agree, so neither this node's own link nor lost packets on a path or two
   make a suspicion; with only one member heard beside P, as in a three-node cluster, that one
   suffices) or gossip suspects P too. Alone with P (a two-node cluster) a silent P is suspected
   only once gossip suspects it: a node cannot tell its own dead link from a dead peer without a
   third party. With 10 % loss each way, a false suspicion needs ``miss`` losses in a row on three
   paths at once (two in a three-node cluster). One confirmation was the rule before: the false
   suspicions it let through grew with the cluster, since any one of N - 2 others losing the same
   datagrams sufficed (benchmarks/heartbeat_sim.py); a crash costs no more, since every survivor
   stops hearing P at the same moment and sends its changed missing list at once.
2. is *cut off* when it has two or more live members, has heard some of them before and hears
   none now (its own link, or its own heartbeats, are down). It suspects nobody while cut off,
   even once its own gossip suspects them: nothing is grabbed. It has no quorum (below) either:
   it keeps what it announces and takes nothing, and yields a VIP when the majority's new owner
   announces it on the wire (l2/disagree.py).
3. is suspected by the members it hears whose packets say so (flag 1): it gives up each VIP
   whose next node is one of them; when their packets stop saying so, it takes them back.

Hearing is not being heard, and quorum (nocloudlb.core.quorum, docs/concepts.md "When nodes
disagree"). Flags 4, 8 and 16 were added without changing the format (older receivers ignore them):
``F_DEAF`` (8) when the sender has not heard the recipient within ``interval x miss``, so a node
whose inbound traffic is lost says so in the datagrams it still sends; ``F_NO_QUORUM`` (4) while
the sender is not connected to a majority; ``F_PARTIAL`` (16) when the missing list was cut to fit.
A member is *connected* when it is heard and its latest datagram does not say ``F_DEAF`` (a live
member never heard yet counts on gossip's word until its first datagram); the node has quorum
while itself, the connected members and the witness (``set_witness``, while it answers) are a
strict majority of ``max(configured, known) + witness`` (``set_quorum_basis``). Members heard
whose datagrams say ``F_NO_QUORUM`` are reported (``no_quorum``): the daemon leaves them out of
the election.

Bounded by construction: no datagram exceeds ``MAX_PACKET`` (what a receiver reads): a meta that
does not fit beside the longest fixed part is left to gossip, and a missing list that does not fit
is cut, the part sent rotating from one round to the next; a receiver keeps the parts it saw lately.
Every datagram dropped is counted by reason (``rejected``, ``nocloudlb_heartbeat_rejected_total``)
and logged at most once per reason every ``REJECT_LOG_EVERY`` s.

The thread sends and receives on its own (not the decision thread): a busy decision loop never
delays a heartbeat. It calls ``on_change()`` (posts a reconcile) whenever what it reports changed.

Cost (``fast``: 25 ms, 80 datagrams/s each way with three nodes). A wake-up of the thread costs more
than the datagram's Python work, so the thread wakes once per interval when nothing is happening:
two sockets share the port (SO_REUSEPORT) and a classic BPF program of the group steers each
datagram by its content: the *routine* ones (flags 0, nobody missed: "I am alive, nothing new") to
one socket, read at each send tick; every other one (a suspicion, a miss, a meta) to the *news*
socket, read the moment it arrives. ``heard`` is the datagram's arrival time (the kernel's
SO_TIMESTAMPNS), so reading a routine datagram at the next tick moves no timeout. The thread reads
the routine socket at once too whenever anything is not quiet: a member not heard for 1.5 intervals,
a member missed or suspected, a member that misses someone or suspects this node, a cut-off. So what
a datagram says is acted on as fast as before, and the packets on the wire are the same. Where the
kernel refuses the program (or the port has no SO_REUSEPORT) one socket is read at once, as before.
The packets' HMACs copy a keyed stdlib HMAC object per key, a routine datagram from a
known member is checked against the bytes expected from it rather than parsed, and the rule is
evaluated only when a datagram changed something, the peers changed, or a member's deadline passed.
"""

from __future__ import annotations

import logging
import math
import select
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .heartbeat_io import Sockets
from .heartbeat_outbox import META_REPEAT, Outbox
from .heartbeat_report import REJECT_LOG_EVERY, REJECTED, Report
from .heartbeat_rule import NO_QUORUM_HOLD, HeartbeatView, Peer, PeerTable
from .heartbeat_wire import (
    F_DEAF,
    F_META,
    F_NO_QUORUM,
    F_PARTIAL,
    F_SUSPECT_YOU,
    MAC_LEN,
    MAGIC,
    MAX_PACKET,
    Packet,
    PacketError,
    Reader,
    _mac,
    decode,
    derive_keys,
    encode,
)
from .logs import event

__all__ = ["CONFIRMATIONS", "F_DEAF", "F_META", "F_NO_QUORUM", "F_PARTIAL", "F_SUSPECT_YOU", "MAC_LEN", "MAGIC",
           "MAX_PACKET", "META_REPEAT", "NO_QUORUM_HOLD", "QUIET_LATE", "REJECTED", "REJECT_LOG_EVERY", "Heartbeat",
           "HeartbeatView", "Packet", "PacketError", "_mac", "check_settings", "decode", "derive_keys", "encode"]

#: members heard that must miss a member too before this node suspects it (fewer when fewer are heard: with
#: three nodes the one other; see the rule in the module docstring). With one, the false suspicions from loss
#: grow with the cluster (any one of N - 2 others that also lost the member's last datagrams is enough:
#: benchmarks/heartbeat_sim.py); with two, three paths must lose ``miss`` datagrams in a row at once.
#: Read at each evaluation (the simulator sets it here).
CONFIRMATIONS = 2
#: a member not heard for this many intervals makes the thread read every datagram at once
QUIET_LATE = 1.5

#: bounds of the settings (the profile's, or memberlist overrides)
INTERVAL_MIN, INTERVAL_MAX = 0.005, 5.0
MISS_MIN, MISS_MAX = 2, 100
OFFSET_MAX = 1000


def check_settings(interval: Any, miss: Any, offset: Any, dead_after: float | None = None) -> list[str]:
    """Problems with heartbeat settings, each naming the memberlist field and its value."""
    errors: list[str] = []
    ok_interval = isinstance(interval, int | float) and not isinstance(interval, bool) and math.isfinite(interval)
    if not ok_interval or not INTERVAL_MIN <= interval <= INTERVAL_MAX:
        errors.append(f"memberlist.heartbeatInterval: {interval!r} must be a number of seconds from "
                      f"{INTERVAL_MIN} to {INTERVAL_MAX}")
        ok_interval = False
    ok_miss = isinstance(miss, int | float) and not isinstance(miss, bool) and float(miss).is_integer()
    if not ok_miss or not MISS_MIN <= miss <= MISS_MAX:
        errors.append(f"memberlist.heartbeatMiss: {miss!r} must be a whole number from {MISS_MIN} to {MISS_MAX} "
                      "(heartbeats missed before a member is suspected; 1 would suspect on one lost packet)")
        ok_miss = False
    if isinstance(offset, bool) or not isinstance(offset, int | float) or not float(offset).is_integer() \
            or not 0 <= offset <= OFFSET_MAX:
        errors.append(f"memberlist.heartbeatPortOffset: {offset!r} must be a whole number from 0 (heartbeats off) "
                      f"to {OFFSET_MAX}")
    if ok_interval and ok_miss and dead_after is not None and interval * miss >= dead_after:
        errors.append(f"memberlist.heartbeatInterval x heartbeatMiss: {interval:g} x {int(miss)} = "
                      f"{interval * miss:g} s must be shorter than gossip's probeInterval x (1 + suspicionMult) = "
                      f"{dead_after:g} s, or gossip declares a member dead before heartbeats suspect it")
    return errors


class Heartbeat:
    """See the module docstring. ``set_peers`` from the decision thread at every reconcile.

    The coordinator and the thread: it owns the sockets (heartbeat_io.Sockets), the reader of the
    datagrams (heartbeat_wire.Reader), the members' table and rule (heartbeat_rule.PeerTable), what
    is sent (heartbeat_outbox.Outbox) and the counters and log lines (heartbeat_report.Report); it
    sends, receives and calls back."""

    def __init__(self, name: str, bind_ip: str, port: int, keys: list[str] | None, interval: float, miss: int,
                 on_change: Callable[[], None] = lambda: None, logger: logging.Logger | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._clock = clock  # monotonic seconds; a virtual clock in benchmarks/heartbeat_sim.py
        self.bind_ip = bind_ip
        self.port = port
        self.interval = float(interval)
        self.miss = int(miss)
        self.timeout = self.interval * self.miss
        self.on_change = on_change
        self.on_quorum: Callable[[], None] | None = None  # called when quorum is gained back (not at start)
        self.log = logger or logging.getLogger("nocloudlb.heartbeat")
        self._reader = Reader(name, derive_keys(keys))
        self._io = Sockets(bind_ip, port, self.log)
        self._table = PeerTable(self.interval, self.timeout)
        self._report = Report(self.log, clock, self.timeout)
        self._outbox = Outbox(name)
        self._lock = threading.Lock()  # guards the table and what is sent
        self._peers = self._table.peers  # the same dict, for the tests' eyes
        self._view = HeartbeatView()
        self._missing: frozenset[str] = frozenset()  # members this node misses now (raw, before the rule)
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self._dirty = True  # a datagram or set_peers changed what _evaluate reads
        self._deadline = 0.0  # monotonic time by which a heard member's timeout may end: evaluate then
        self._quiet = False  # nothing happening: the routine socket is read at send ticks only
        self._heard: frozenset[str] = frozenset()  # members heard at the last evaluation (F_DEAF for the others)
        self._configured = 1  # members configured (the join list with this node): the quorum's floor
        self._known = 1  # members gossip knows (alive, suspect, dead; not left), this node included
        self._witness: Callable[[], bool] | None = None  # the witness answers now (see set_witness)
        self.counters = self._report.counters
        self.rejected = self._report.rejected

    @property
    def _sock(self) -> Any:
        """The socket that sends (and reads the routine datagrams); the simulator puts a fake one here."""
        return self._io.sock

    @_sock.setter
    def _sock(self, sock: Any) -> None:
        self._io.sock = sock

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._io.open()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()
        event(self.log, "heartbeatStarted", bind=f"{self.bind_ip}:{self.port}", interval=self.interval,
              miss=self.miss)

    def close(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._io.close()

    # -- inputs ----------------------------------------------------------------------------
    def set_peers(self, peers: Mapping[str, tuple[tuple[str, int], str]]) -> None:
        """The live members (name -> ((ip, heartbeat port), gossip state)), this node excluded."""
        now = self._clock()
        with self._lock:
            for name in list(self._peers):
                if name not in peers:
                    del self._peers[name]  # dead or left for gossip: forget it (heard_once too)
                    self._outbox.forget(name)
            for name, (addr, state) in peers.items():
                p = self._peers.get(name)
                if p is None:
                    self._peers[name] = Peer(addr, state, now)
                    self._outbox.greet(name)
                elif p.addr != addr or p.gossip_state != state:
                    p.addr, p.gossip_state = addr, state
            self._dirty = True
        self._kick.set()

    def set_meta(self, meta: Mapping[str, str]) -> None:
        """This node published ``meta``: push it to every peer now (and in the next packets)."""
        with self._lock:
            if not self._outbox.publish(meta, self._peers):
                return
        self._send_all(self._clock())

    def set_keys(self, keys: list[str] | None) -> None:
        self._reader.set_keys(derive_keys(keys))

    def set_quorum_basis(self, configured: int, known: int) -> None:
        """The members configured (join list and this node, less those that left gracefully) and known to
        gossip (alive, suspect or dead; this node included)."""
        configured, known = max(1, int(configured)), max(1, int(known))
        if (configured, known) != (self._configured, self._known):
            self._configured, self._known = configured, known
            self._dirty = True
            self._kick.set()

    def set_witness(self, answers: Callable[[], bool] | None) -> None:
        """A witness (one more vote while ``answers()``); call ``witness_changed`` when its answer changes."""
        self._witness = answers
        self._dirty = True

    def witness_changed(self) -> None:
        self._dirty = True
        self._kick.set()

    # -- outputs ---------------------------------------------------------------------------
    def view(self) -> HeartbeatView:
        return self._view

    def status(self) -> dict[str, Any]:
        now = self._clock()
        v = self._view
        with self._lock:
            peers = self._table.status(now, v.suspected)
        return {"bind": f"{self.bind_ip}:{self.port}", "interval": self.interval, "miss": self.miss,
                "cutOff": v.cut_off, "suspected": sorted(v.suspected), "suspecters": sorted(v.suspecters),
                "quorum": {"has": v.quorum, "votes": v.votes, "total": v.total, "connected": sorted(v.connected),
                           "witness": None if self._witness is None else bool(self._witness())},
                "noQuorum": sorted(v.no_quorum), "deafTo": sorted(v.deaf_to),
                "peers": peers, "counters": dict(self.counters), "rejected": dict(self.rejected)}

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        next_send = self._clock()
        ready: list[Any] = []
        io = self._io
        while not self._stop.is_set():
            try:
                assert io.sock is not None
                if io.sock.fileno() < 0 and io.news is not None:
                    io.news.close()  # the main socket closed (a test's dead node): no news either
                now = self._clock()
                tick = now >= next_send
                # news at once; routine datagrams now too, unless quiet and between ticks
                self._receive_all(routine=tick or not self._quiet or io.sock in ready,
                                  news=io.news is not None and (io.news in ready or not self._quiet))
                if tick:
                    self._send_all(now)
                    next_send = max(next_send + self.interval, now + self.interval / 4)
                now = self._clock()
                if self._dirty or now >= self._deadline:
                    self._evaluate(now)
                self._quiet = io.news is not None and self._is_quiet(now)
                # quiet: every member was heard within QUIET_LATE intervals, so no timeout ends before the next
                # tick (the deadline kept from the last evaluation is older: it is checked at that tick)
                until = next_send if self._quiet else min(next_send, self._deadline)
                wait = max(0.0, until - self._clock())
                socks = [io.news] if io.news is not None else []
                if not self._quiet:
                    socks.append(io.sock)
                ready = select.select(socks, [], [], wait)[0]
            except Exception:  # noqa: BLE001 - the heartbeat outlives any one error
                self.log.exception("heartbeat loop error")
                self._stop.wait(self.interval)

    def _is_quiet(self, now: float) -> bool:
        """Nothing happening: every member heard within QUIET_LATE intervals, none missed or suspected by
        anyone as far as their datagrams say, this node not cut off."""
        v = self._view
        if v.suspected or v.suspecters or v.cut_off or self._missing or not v.quorum or v.no_quorum or v.deaf_to:
            return False
        late = now - QUIET_LATE * self.interval
        with self._lock:
            return self._table.quiet(late)

    def _send_all(self, now: float) -> None:
        sock = self._sock
        if sock is None:
            return
        view = self._view
        with self._lock:
            out, rotation = self._outbox.round(self._peers, view.suspected, self._missing, self._heard)
            key = self._reader.keys[0]
            no_quorum = not view.quorum
        for addr, pkt, deaf in out:
            try:
                sock.sendto(encode(pkt, key, no_quorum=no_quorum, deaf=deaf, rotation=rotation), addr)
                self.counters["sent"] += 1
            except OSError:
                pass  # unreachable, no route (link down): the peers will suspect us, which is right

    def _receive_all(self, routine: bool = True, news: bool = True) -> None:
        """Read the routine socket (``routine``) and the news socket (``news``) until they are empty."""
        changed = False
        for data, now in self._io.datagrams(routine, news, self._clock, self.timeout / 2):
            changed |= self._accept(data, now)
        if changed:
            self._evaluate(self._clock(), force=True)

    def _accept(self, data: bytes, now: float) -> bool:
        """Take one datagram; True when it changed a meta this node reports."""
        try:
            pkt = self._reader.read(data)
        except PacketError as exc:
            self._report.reject(exc.reason, str(exc))
            return False
        if pkt.recipient != self.name:
            self._report.reject("notForMe", f"addressed to {pkt.recipient[:64]!r}")
            return False
        with self._lock:
            refused, dirty, changed = self._table.take(pkt, now)
            if refused is not None:
                self._report.reject(*refused)
                return False
            if dirty:
                self._dirty = True
        self.counters["received"] += 1
        return changed

    def _evaluate(self, now: float, force: bool = False) -> None:
        with self._lock:
            self._dirty = False
            verdict = self._table.evaluate(now, self._view, CONFIRMATIONS, self._configured, self._known,
                                           self._witness)
            self._heard = verdict.heard
            self._deadline = verdict.deadline
        view, missing = verdict.view, verdict.missing
        old = self._view
        if missing != self._missing:
            self._missing = missing
            send_now = True
        else:
            send_now = False
        if view == old and not force:
            if send_now:
                self._send_all(now)
            return
        self._view = view
        if view.quorum != old.quorum:
            self._report.quorum(view)
            send_now = True  # the peers learn it at once (F_NO_QUORUM)
            if view.quorum and self.on_quorum is not None:
                self.on_quorum()  # back in the majority: what it kept may have moved meanwhile (re-announce)
        if view.suspected != old.suspected or view.suspecters != old.suspecters or view.cut_off != old.cut_off:
            self._report.suspicions(old, view)
        if view != old:
            self.on_change()
        if send_now:  # a second opinion travels at once (peers confirm a suspicion a datagram later)
            self._send_all(now)
