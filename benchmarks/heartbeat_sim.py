#!/usr/bin/env python
"""The all-to-all heartbeat at size, simulated (issue 23 part 3): the REAL failure detector of
speaker/nocloudlb/heartbeat.py (class ``Heartbeat``: its encode, HMAC, ``_accept`` and ``_evaluate``,
the suspicion, cut-off and quorum rules) run for N nodes in one process over an in-memory transport,
on a virtual clock (discrete events, no threads, no sockets, no network traffic).

What it models:

- each node's ``Heartbeat``, built with ``clock=`` the simulator's virtual clock and a fake socket whose
  ``sendto`` puts the datagram on the transport; the simulator replaces the class's thread (``_run``):
  a send tick every ``interval`` from a random phase (``_send_all``, the next tick ``max(next + interval,
  now + interval / 4)``), each datagram taken at its arrival (``_accept``, then ``_evaluate(force=True)``
  when it changed something) and an evaluation whenever ``_dirty`` or the node's ``_deadline`` passed,
  as ``_run`` does in the one-socket mode ("read at once": ``_news`` is None);
- the network: one-way latency (base + uniform jitter; a path delivers in order unless ``reorder``),
  loss per datagram (everywhere, or per path), partitions (groups of nodes that cannot reach each other
  during a time window), all seeded (``Faults``; a test may change them between two ``run`` calls);
- crashes (the node stops sending and receiving) and CPU stalls (the node processes nothing for a while;
  the datagrams arriving meanwhile are taken at the stall's end with their arrival time, at most
  ``timeout / 2`` old as ``_receive_all`` clamps the kernel's SO_TIMESTAMPNS, all in one read as
  ``_receive_all`` does; ``rcvbuf`` can bound how many the socket holds, tail drop);
- optionally (``--cpu-scale``) the CPU time of the real work: a node is then busy, in virtual time, for
  the CPU time each of its steps took here (x the scale); what arrives meanwhile waits in its socket
  and is read in one batch, as a busy thread would. Off by default: processing is instant, and runs
  are then reproducible from the seed;
- membership as an oracle, not the real gossip (kinship is a native library with its own sockets and
  clock and cannot run on a virtual clock): every node's ``set_peers`` holds every other node "alive"
  (``set_quorum_basis(N, N)``); a crashed node turns "suspect" at every survivor ``probe_interval x 2``
  after the crash and is removed ("dead") after ``probe_interval x (1 + suspicion_mult)``, the profile's
  timers (speaker/nocloudlb/membership.py PROFILES). A partition changes nothing in gossip's view: the
  benchmark holds it for less than gossip's dead time, and measures the heartbeat layer alone.

What it does not model: the routine/news socket split and the quiet mode (they change when a datagram
is read, not what it says or when it is stamped), syscalls and the kernel's own cost, the decision
thread and VIPs, gossip's own detection, refutation and heal (healsync), restarts (a new boot), meta
(drains).

What it prints (one row per size; ``--json`` for JSON), all measured on the real objects:

- datagrams/s each node sends (``counters["sent"]``) in a steady window with loss only;
- the bursts: datagrams sent in the ``2 x interval x miss`` after a partition starts and after it heals,
  as a multiple of the steady rate (a changed missing list is sent to every member at once);
- crash detection: the time from a crash until the victim is in a survivor's ``view().suspected``,
  for the first survivor, the median and the last;
- false suspicions per node per minute: a member entering a ``view().suspected`` while it is alive, not
  stalled and not cut from the observer by a partition (each within ``interval x miss`` + a tick);
  beside it a rough model's figure (``false_rate_model``: the observer and at least one other member
  lost the target's last ``miss`` datagrams), which the counts follow: a few seconds see few of them;
- partition convergence: after a partition of a random minority heals, the time until every view has
  nothing suspected, no cut-off and quorum;
- the CPU one node would spend on heartbeats (datagrams each way x the real class's cost per datagram
  sent and taken, measured here) and the simulator's wall seconds per simulated second. Sizes whose
  estimated wall time exceeds ``--budget`` are not run (N=1000 ``fast`` all-to-all is 40 M datagrams per
  simulated second): the table says so, with the estimate.

Timeline of a run (``--seconds`` is raised to what the profile's phases need): warm-up, a steady window
(datagrams/s), a partition of a random minority and its heal (convergence), a crash of a random node
(detection, then gossip's oracle suspects and removes it). Loss applies throughout.

Run (about 1.5 minutes for these sizes on one core, most of it N=100)::

    .venv/bin/python benchmarks/heartbeat_sim.py --sizes 10,30,100 --profile fast --seconds 5 --loss 0.1 --seed 1
    .venv/bin/python benchmarks/heartbeat_sim.py --sizes 10,30,100 --profile lan --loss 0.1 --json
    .venv/bin/python benchmarks/heartbeat_sim.py --sizes 30,100 --cpu-scale 1 --rcvbuf 256   # with CPU time

Fast tests: tests/unit/speaker/test_heartbeat_sim.py.
"""

from __future__ import annotations

import argparse
import base64
import functools
import heapq
import json
import logging
import math
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

from nocloudlb import heartbeat as heartbeat_module
from nocloudlb.heartbeat import Heartbeat, HeartbeatView
from nocloudlb.membership import PROFILES

#: one memberlist key for every node (base64 of 32 bytes): the datagrams' HMACs are real work
KEY = base64.b64encode(bytes(range(32))).decode()
PORT = 7947  # the heartbeat port of every node; an address is (node name, PORT), an id on the transport
BIND = "192.0.2.1"  # never bound: the sockets are fake

TICK, DGRAM, WAKE, RESUME, CALL = range(5)

_QUIET = logging.getLogger("heartbeat_sim.nodes")
_QUIET.disabled = True  # the nodes' events (nodeUnreachable, ...) would be stamped with wall time: off


@dataclass(frozen=True)
class Partition:
    """Nodes in different ``groups`` cannot reach each other from ``start`` to ``end`` (virtual s)."""

    groups: tuple[frozenset[str], ...]
    start: float
    end: float

    def separates(self, a: str, b: str) -> bool:
        return not any(a in g and b in g for g in self.groups)


@dataclass(frozen=True)
class Stall:
    """``node`` processes nothing (no tick, no datagram, no evaluation) from ``start`` for ``duration`` s."""

    node: str
    start: float
    duration: float


@dataclass
class Faults:
    loss: float = 0.0  # probability a datagram is lost, every path
    path_loss: dict[tuple[str, str], float] = field(default_factory=dict)  # (sender, recipient) -> probability
    latency: float = 0.0002  # one way, s
    jitter: float = 0.0002  # uniform extra latency, s
    partitions: list[Partition] = field(default_factory=list)
    crashes: dict[str, float] = field(default_factory=dict)  # node -> virtual time it stops
    stalls: list[Stall] = field(default_factory=list)
    rcvbuf: int = 0  # datagrams a stalled node's socket holds (tail drop); 0: unbounded
    reorder: bool = False  # False: a path delivers in order (jitter never overtakes), as a LAN link does


@dataclass(frozen=True)
class Gossip:
    """The membership oracle's timers after a crash (None: gossip never says so)."""

    suspect_after: float | None = None
    dead_after: float | None = None

    @classmethod
    def of(cls, profile: str) -> Gossip:
        prof = PROFILES[profile]
        probe = float(prof["probe_interval"])
        return cls(probe * 2, probe * (1 + float(prof["suspicion_mult"])))


@dataclass(frozen=True)
class Suspicion:
    """``target`` entered ``observer``'s ``view().suspected`` at ``time``; ``false`` when no fault excuses it."""

    time: float
    observer: str
    target: str
    false: bool


class FakeSock:
    """What ``Heartbeat._send_all`` sends through: the datagram goes onto the simulator's transport."""

    def __init__(self, sim: Simulator, src: int) -> None:
        self.sim = sim
        self.src = src

    def sendto(self, data: bytes, addr: tuple[str, int]) -> int:
        self.sim.transmit(self.src, addr, data)
        return len(data)

    def fileno(self) -> int:
        return -1

    def close(self) -> None:
        pass


@dataclass(eq=False)
class SimNode:
    index: int
    name: str
    hb: Heartbeat
    next_send: float
    tick_at: float = math.inf  # the pending TICK event's time
    wake_at: float = math.inf  # the pending WAKE event's time (the heartbeat's deadline)
    crashed_at: float | None = None
    stalled_until: float = -math.inf  # a stall, or busy with its last step (cpu_scale)
    resume_at: float = math.inf  # the pending RESUME event's time
    backlog: list[tuple[float, bytes]] = field(default_factory=list)  # datagrams that arrived while stalled
    view: HeartbeatView | None = None  # the view last observed
    clean: bool = False  # nothing suspected, not cut off, quorum


class Simulator:
    """N real ``Heartbeat`` objects on one virtual clock (see the module docstring)."""

    def __init__(self, n: int | list[str], interval: float, miss: int, faults: Faults | None = None,
                 gossip: Gossip | None = None, seed: int = 1, cpu_scale: float = 0.0) -> None:
        names = [f"n{i + 1}" for i in range(n)] if isinstance(n, int) else list(n)
        self.t = 0.0
        self.interval, self.miss = float(interval), int(miss)
        self.timeout = self.interval * self.miss
        self.faults = faults or Faults()
        self.gossip = gossip or Gossip()
        self.rng = random.Random(seed)
        self.cpu_scale = cpu_scale  # > 0: a node is busy for the CPU time its step took here x this
        self._heap: list[tuple[float, int, int, int, Any]] = []
        self._seq = 0
        self._last_arrival: dict[int, float] = {}  # src x N + dst -> the path's last arrival (in order)
        self.nodes = [self._node(i, name) for i, name in enumerate(names)]
        self.by_name = {node.name: node for node in self.nodes}
        self._by_addr = {(node.name, PORT): node.index for node in self.nodes}
        self.state = dict.fromkeys(names, "alive")  # the membership oracle: name -> gossip state
        self.suspicions: list[Suspicion] = []
        self.clean_log: list[tuple[float, bool]] = [(0.0, False)]  # (time, every live view clean) changes
        self.dropped = {"loss": 0, "partition": 0, "crashed": 0, "rcvbuf": 0}
        self.events = 0
        for node in self.nodes:
            node.hb.set_peers(self.peers_of(node.name))
            node.hb.set_quorum_basis(len(names), len(names))
            node.tick_at = self.rng.uniform(0.0, self.interval)  # the thread starts at a random phase
            node.next_send = node.tick_at
            self._push(node.tick_at, TICK, node.index)
        for name, at in self.faults.crashes.items():
            self.at(at, functools.partial(self.crash, name))
        for stall in self.faults.stalls:
            self.at(stall.start, functools.partial(self._stall, stall))

    def _node(self, index: int, name: str) -> SimNode:
        hb = Heartbeat(name, BIND, PORT, [KEY], self.interval, self.miss, logger=_QUIET, clock=self.now)
        hb._sock = cast(socket.socket, FakeSock(self, index))  # never started: no thread, no real socket
        return SimNode(index, name, hb, 0.0)

    # -- the clock and the events ------------------------------------------------------------
    def now(self) -> float:
        return self.t

    def _push(self, t: float, kind: int, index: int, data: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, index, data))

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` at virtual time ``t``."""
        self._push(t, CALL, -1, fn)

    def run(self, until: float) -> None:
        """Process every event up to virtual time ``until``."""
        heap, nodes = self._heap, self.nodes
        while heap and heap[0][0] <= until:
            t, _seq, kind, index, data = heapq.heappop(heap)
            self.t = t
            self.events += 1
            if kind == CALL:
                data()
                continue
            node = nodes[index]
            if node.crashed_at is not None:
                if kind == DGRAM:
                    self.dropped["crashed"] += 1
                continue
            if kind == RESUME:
                self._resume(node, t)
            elif t < node.stalled_until:
                self._defer(node, kind, t, data)
            elif kind == DGRAM:
                self._step(node, batch=((t, data),))
            elif kind == TICK and t == node.tick_at:
                self._step(node, tick=True)
            elif kind == WAKE and t == node.wake_at:
                node.wake_at = math.inf
                self._step(node)
        self.t = max(self.t, until)

    def _defer(self, node: SimNode, kind: int, t: float, data: Any) -> None:
        """An event for a stalled (or busy) node: a datagram waits in its socket; ticks and deadlines are
        taken when it resumes (the thread's loop comes back)."""
        if kind == DGRAM:
            if self.faults.rcvbuf and len(node.backlog) >= self.faults.rcvbuf:
                self.dropped["rcvbuf"] += 1
            else:
                node.backlog.append((t, data))
        elif (kind == TICK and t != node.tick_at) or (kind == WAKE and t != node.wake_at):
            return  # stale
        if node.resume_at == math.inf:
            node.resume_at = node.stalled_until
            self._push(node.resume_at, RESUME, node.index)

    def _resume(self, node: SimNode, t: float) -> None:
        if t != node.resume_at:
            return
        node.resume_at = math.inf
        if t < node.stalled_until:  # stalled again meanwhile
            node.resume_at = node.stalled_until
            self._push(node.resume_at, RESUME, node.index)
            return
        batch, node.backlog = node.backlog, []
        self._step(node, tick=t >= node.next_send, batch=batch)

    # -- one node's thread (Heartbeat._run, one socket read at once) --------------------------
    def _step(self, node: SimNode, tick: bool = False, batch: Iterable[tuple[float, bytes]] = ()) -> None:
        hb, now = node.hb, self.t
        started = time.thread_time() if self.cpu_scale else 0.0  # CPU time: a preemption here is no stall
        oldest = now - hb.timeout / 2  # _receive_all: an arrival stamp is at most timeout / 2 old
        changed = False
        for arrival, data in batch:
            changed |= hb._accept(data, max(arrival, oldest))
        if changed:
            hb._evaluate(now, force=True)
        if tick:
            hb._send_all(now)
            node.next_send = max(node.next_send + hb.interval, now + hb.interval / 4)
            node.tick_at = node.next_send
            self._push(node.next_send, TICK, node.index)
        if hb._dirty or now >= hb._deadline:
            hb._evaluate(now)
        if now < hb._deadline < node.next_send and hb._deadline != node.wake_at:  # it waits until the earlier
            node.wake_at = hb._deadline
            self._push(node.wake_at, WAKE, node.index)
        self._observe(node)
        if self.cpu_scale:
            node.stalled_until = max(node.stalled_until, now + (time.thread_time() - started) * self.cpu_scale)

    def transmit(self, src: int, addr: tuple[str, int], data: bytes) -> None:
        """A datagram from node ``src`` to ``addr``: lost, cut by a partition, or queued for its arrival."""
        dst = self._by_addr[addr]
        f = self.faults
        loss = f.path_loss.get((self.nodes[src].name, addr[0]), f.loss) if f.path_loss else f.loss
        if loss and self.rng.random() < loss:
            self.dropped["loss"] += 1
            return
        if f.partitions and self._cut(self.nodes[src].name, addr[0], self.t):
            self.dropped["partition"] += 1
            return
        arrival = self.t + f.latency + (self.rng.random() * f.jitter if f.jitter else 0.0)
        if not f.reorder:
            path = src * len(self.nodes) + dst
            arrival = max(arrival, self._last_arrival.get(path, 0.0))
            self._last_arrival[path] = arrival
        self._push(arrival, DGRAM, dst, data)

    def _cut(self, a: str, b: str, t: float, grace: float = 0.0) -> bool:
        return any(p.start <= t <= p.end + grace and p.separates(a, b) for p in self.faults.partitions)

    # -- faults and the membership oracle -----------------------------------------------------
    def crash(self, name: str) -> None:
        """``name`` stops sending and receiving now; the oracle's gossip suspects and removes it later."""
        node = self.by_name[name]
        node.crashed_at = self.t
        node.backlog = []
        self._set_clean(node, True)  # out of the convergence tally
        g = self.gossip
        if g.suspect_after is not None:
            self.at(self.t + g.suspect_after, functools.partial(self.set_state, name, "suspect"))
        if g.dead_after is not None:
            self.at(self.t + g.dead_after, functools.partial(self.set_state, name, "dead"))

    def _stall(self, stall: Stall) -> None:
        node = self.by_name[stall.node]
        node.stalled_until = max(node.stalled_until, self.t + stall.duration)

    def peers_of(self, name: str) -> dict[str, tuple[tuple[str, int], str]]:
        """What the daemon passes to ``set_peers``: the live members (alive or suspect), this node excluded."""
        return {m: ((m, PORT), s) for m, s in self.state.items() if m != name and s in ("alive", "suspect")}

    def set_state(self, name: str, state: str) -> None:
        """Gossip's verdict on ``name`` reaches every node now (``set_peers``; the thread is kicked)."""
        self.state[name] = state
        for node in self.nodes:
            if node.crashed_at is None and node.name != name:
                node.hb.set_peers(self.peers_of(node.name))
                if self.t >= node.stalled_until:
                    self._step(node)

    # -- what is measured ---------------------------------------------------------------------
    def _observe(self, node: SimNode) -> None:
        view = node.hb.view()
        if view is node.view:
            return
        new = view.suspected - node.view.suspected if node.view is not None else view.suspected
        for target in sorted(new):
            self.suspicions.append(Suspicion(self.t, node.name, target, not self.excused(node.name, target)))
        node.view = view
        self._set_clean(node, not view.suspected and not view.cut_off and view.quorum)

    def _set_clean(self, node: SimNode, clean: bool) -> None:
        node.clean = clean
        every = all(n.clean for n in self.nodes)
        if every != self.clean_log[-1][1]:
            self.clean_log.append((self.t, every))

    def excused(self, observer: str, target: str) -> bool:
        """A fault explains ``observer`` suspecting ``target`` now: it crashed, stalled or is cut off
        from ``observer`` by a partition (each within ``interval x miss`` + a tick and the latency)."""
        crashed = self.by_name[target].crashed_at
        if crashed is not None and crashed <= self.t:
            return True
        grace = self.timeout + self.interval + self.faults.latency + self.faults.jitter
        if any(s.node == target and s.start <= self.t <= s.start + s.duration + grace for s in self.faults.stalls):
            return True
        return self._cut(observer, target, self.t, grace)

    def converged_after(self, t: float) -> float | None:
        """Seconds from ``t`` until every live view was clean (0 when it was at ``t``); None if never."""
        state = False
        for when, every in self.clean_log:
            if when > t:
                if every:
                    return when - t
            else:
                state = every
        return 0.0 if state else None

    def sent(self) -> dict[str, int]:
        return {node.name: node.hb.counters["sent"] for node in self.nodes}


# -- the benchmark --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timeline:
    warm: float
    steady_end: float  # the partition starts here
    heal: float
    crash: float
    end: float

    @classmethod
    def of(cls, profile: str, seconds: float) -> Timeline:
        prof = PROFILES[profile]
        timeout = float(prof["heartbeat_interval"]) * int(prof["heartbeat_miss"])
        gossip = Gossip.of(profile)
        assert gossip.dead_after is not None
        warm = max(0.5, 4 * timeout)
        held = max(2 * timeout, min(max(0.5, 4 * timeout), 0.9 * gossip.dead_after))  # gossip keeps them alive
        settle = max(1.0, 6 * timeout)
        after_crash = max(1.0, gossip.dead_after + 3 * timeout)
        steady = max(0.5, 20 * float(prof["heartbeat_interval"]), seconds - warm - held - settle - after_crash)
        start = warm + steady
        return cls(warm, start, start + held, start + held + settle, start + held + settle + after_crash)


@dataclass(frozen=True)
class Options:
    profile: str = "fast"
    seconds: float = 5.0
    loss: float = 0.1
    seed: int = 1
    latency: float = 0.0002
    jitter: float = 0.0002
    cpu_scale: float = 0.0
    rcvbuf: int = 0
    confirmations: int = heartbeat_module.CONFIRMATIONS  # the class's rule: members that must miss one too


@dataclass
class Row:
    n: int
    confirmations: int
    profile: str
    seconds: float
    datagrams_per_node: float  # each node sends, per s, in the steady window (mean over nodes)
    datagrams_per_node_min: float
    datagrams_per_node_max: float
    expected_per_node: float  # (N - 1) / interval
    cut_burst: float  # datagrams sent in the 2 x interval x miss after a partition starts, / the steady rate's
    heal_burst: float  # the same after it heals
    detect_first_ms: float | None
    detect_p50_ms: float | None
    detect_max_ms: float | None
    detected_by: int  # survivors that suspected the victim before gossip removed it
    survivors: int
    false_suspicions: int
    false_per_node_min: float
    false_model_per_node_min: float  # false_rate_model's figure under this loss, for comparison
    convergence_ms: float | None  # None: not converged before the crash
    wall_s: float
    wall_per_sim_s: float
    datagrams: int  # sent, every node, the whole run
    cpu_per_node: float  # one core's share a node would spend on heartbeats (the class's cost, measured)
    dropped: dict[str, int]
    first_false: list[dict[str, Any]]


def run_size(n: int, opts: Options, cost: tuple[float, float]) -> Row:
    """The benchmark's timeline (Timeline) for ``n`` nodes; every figure read from the real objects."""
    prof = PROFILES[opts.profile]
    interval, miss = float(prof["heartbeat_interval"]), int(prof["heartbeat_miss"])
    tl = Timeline.of(opts.profile, opts.seconds)
    rng = random.Random(opts.seed * 1_000_003 + n)
    names = [f"n{i + 1}" for i in range(n)]
    minority = frozenset(rng.sample(names, (n - 1) // 2))
    victim = rng.choice(names)
    faults = Faults(loss=opts.loss, latency=opts.latency, jitter=opts.jitter, crashes={victim: tl.crash},
                    partitions=[Partition((minority, frozenset(names) - minority), tl.steady_end, tl.heal)],
                    rcvbuf=opts.rcvbuf)
    wall0 = time.perf_counter()
    sim = Simulator(names, interval, miss, faults, Gossip.of(opts.profile), opts.seed, opts.cpu_scale)
    window = 2 * interval * miss
    marks = (tl.warm, tl.steady_end, tl.steady_end + window, tl.heal, tl.heal + window, tl.end)
    sent: list[dict[str, int]] = []
    rule = heartbeat_module.CONFIRMATIONS
    heartbeat_module.CONFIRMATIONS = opts.confirmations  # the rule the class reads at each evaluation
    try:
        for mark in marks:
            _run_reporting(sim, mark, n)
            sent.append(sim.sent())
    finally:
        heartbeat_module.CONFIRMATIONS = rule
    wall = time.perf_counter() - wall0
    rates = [(sent[1][m] - sent[0][m]) / (tl.steady_end - tl.warm) for m in names]
    steady = statistics.fmean(rates) * window * n
    detections = _detections(sim, victim, tl.crash)
    first, p50, last = _ms(detections)
    conv = sim.converged_after(tl.heal)
    false = [s for s in sim.suspicions if s.false]
    return Row(n=n, confirmations=opts.confirmations, profile=opts.profile, seconds=tl.end,
               datagrams_per_node=statistics.fmean(rates),
               datagrams_per_node_min=min(rates), datagrams_per_node_max=max(rates),
               expected_per_node=(n - 1) / interval,
               cut_burst=(sum(sent[2].values()) - sum(sent[1].values())) / steady,
               heal_burst=(sum(sent[4].values()) - sum(sent[3].values())) / steady,
               detect_first_ms=first, detect_p50_ms=p50, detect_max_ms=last,
               detected_by=len(detections), survivors=n - 1, false_suspicions=len(false),
               false_per_node_min=len(false) / n / (tl.end / 60),
               false_model_per_node_min=false_rate_model(n, interval, miss, opts.loss, opts.confirmations) / n * 60,
               convergence_ms=None if conv is None or conv > tl.crash - tl.heal else conv * 1000,
               wall_s=wall, wall_per_sim_s=wall / tl.end, datagrams=sum(sent[-1].values()),
               cpu_per_node=(n - 1) / interval * (cost[0] + cost[1]), dropped=dict(sim.dropped),
               first_false=[asdict(s) for s in false[:5]])


def false_rate_model(n: int, interval: float, miss: int, loss: float, confirmations: int = 1) -> float:
    """False suspicions per second in the whole cluster under independent ``loss`` per datagram, roughly
    (an estimate to compare with, not used by the simulation): every interval, for each of the
    N x (N - 1) observer-target pairs, the observer lost the target's last ``miss`` datagrams
    (p = loss^miss) while at least ``confirmations`` of the N - 2 others did too (their missing lists are
    the other opinions; fewer when fewer others exist, as the class rules). With one, per node it grows as
    N: about N x p^2 / interval while N x p is small; with k, as N^k x p^(k+1)."""
    p = loss ** miss
    others = n - 2
    k = min(confirmations, others)
    at_least_k = 1.0 - sum(math.comb(others, j) * p ** j * (1 - p) ** (others - j) for j in range(k))
    return n * (n - 1) * p * at_least_k / interval


def _run_reporting(sim: Simulator, until: float, n: int, chunk: float = 1.0) -> None:
    """Run to ``until`` in chunks of simulated time, reporting progress on stderr when it is slow."""
    start = time.perf_counter()
    while sim.t < until:
        sim.run(min(until, sim.t + chunk))
        if time.perf_counter() - start > 5:
            print(f"  N={n}: {sim.t:.1f} s simulated, {sum(sim.sent().values()):,} datagrams", file=sys.stderr)


def _detections(sim: Simulator, victim: str, crash: float) -> list[float]:
    first: dict[str, float] = {}
    for s in sim.suspicions:
        if s.target == victim and s.time >= crash:
            first.setdefault(s.observer, s.time - crash)
    return sorted(first.values())


def _ms(values: list[float]) -> tuple[float | None, float | None, float | None]:
    if not values:
        return None, None, None
    return values[0] * 1000, statistics.median(values) * 1000, values[-1] * 1000


def datagram_cost(rounds: int = 3000) -> tuple[float, float]:
    """Seconds the real class spends per datagram sent (``_send_all``: encode + HMAC) and per datagram
    taken (``_accept``: the routine check + HMAC), measured here on one peer."""
    sim = Simulator(["a", "b"], 0.025, 4)
    sim.run(0.5)  # steady: each hears the other, so their datagrams are routine ones (flags 0)
    a, b = sim.nodes[0].hb, sim.nodes[1].hb
    out: list[bytes] = []
    a._sock = cast(socket.socket, _Collect(out))
    t0 = time.perf_counter()
    for _i in range(rounds):
        a._send_all(0.0)
    send = (time.perf_counter() - t0) / rounds
    t0 = time.perf_counter()
    for data in out:
        b._accept(data, 0.0)
    take = (time.perf_counter() - t0) / len(out)
    return send, take


class _Collect:
    def __init__(self, out: list[bytes]) -> None:
        self.out = out

    def sendto(self, data: bytes, addr: tuple[str, int]) -> int:
        self.out.append(data)
        return len(data)


# -- output ---------------------------------------------------------------------------------------

HEADER = ("| N | confirmations | datagrams/s per node (expected) | burst at partition / heal (x steady) | "
          "crash detection first / p50 / max ms | false suspicions / node / min (count; model) | "
          "partition convergence ms | heartbeat CPU per node (est.) | wall s per sim s |")
RULE = "|---|---|---|---|---|---|---|---|---|"


def _fmt(v: float | None, spec: str = ".0f", none: str = "never") -> str:
    return none if v is None else format(v, spec)


def table_row(r: Row) -> str:
    detect = f"{_fmt(r.detect_first_ms)} / {_fmt(r.detect_p50_ms)} / {_fmt(r.detect_max_ms)}"
    if r.detected_by < r.survivors:
        detect += f" ({r.detected_by}/{r.survivors} survivors)"
    return (f"| {r.n} | {r.confirmations} | {r.datagrams_per_node:.1f} ({r.expected_per_node:.0f}) | "
            f"{r.cut_burst:.1f} / {r.heal_burst:.1f} | {detect} | {r.false_per_node_min:.2f} "
            f"({r.false_suspicions}; model {r.false_model_per_node_min:.2g}) | "
            f"{_fmt(r.convergence_ms, '.1f', 'not converged')} | {r.cpu_per_node * 100:.1f} % of a core | "
            f"{r.wall_per_sim_s:.2f} |")


def skipped_row(n: int, interval: float, cost: tuple[float, float], wall_per_datagram: float) -> str:
    per_s = n * (n - 1) / interval
    return (f"| {n} | | {(n - 1) / interval:.0f} expected | not run: {per_s / 1e6:.1f} M datagrams per simulated s x "
            f"{wall_per_datagram * 1e6:.1f} us = about {per_s * wall_per_datagram:,.0f} wall s per simulated s | | | "
            f"| {(n - 1) / interval * sum(cost) * 100:.1f} % of a core | (not run) |")


def footer(profile: str, loss: float, cost: tuple[float, float], wall_per_datagram: float,
           confirmations: list[int]) -> list[str]:
    interval, miss = float(PROFILES[profile]["heartbeat_interval"]), int(PROFILES[profile]["heartbeat_miss"])
    send, take = cost
    per_node = 999 / interval
    models = ", ".join(f"{f:,.3g} per s in the cluster ({f / 1000 * 60:.2g} per node per minute) with {k} "
                       f"confirmation{'s' if k > 1 else ''}" for k in confirmations
                       for f in (false_rate_model(1000, interval, miss, loss, k),))
    return [f"Cost of the real class per routine datagram, measured here: {send * 1e6:.1f} us to send (encode + "
            f"HMAC, no syscall), {take * 1e6:.1f} us to take (check + HMAC); the simulator spent "
            f"{wall_per_datagram * 1e6:.1f} us of wall time per datagram sent (both ends, evaluations, events).",
            f"N=1000 all-to-all ({profile}, {interval * 1000:g} ms): {per_node:,.0f} datagrams/s sent and as many "
            f"taken by each node = {per_node * (send + take) * 100:.0f} % of one core per node for heartbeats alone "
            f"(syscalls not counted); simulating it takes {1000 * per_node / 1e6:.1f} M datagrams per simulated s, "
            f"about {1000 * per_node * wall_per_datagram:,.0f} wall s per simulated s here: out of reach. Under "
            f"{loss:g} loss the false-suspicion model gives {models}."]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", maxsplit=1)[0],
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="10,30,100", help="cluster sizes, comma-separated (default 10,30,100)")
    ap.add_argument("--profile", choices=sorted(PROFILES), default="fast")
    ap.add_argument("--seconds", type=float, default=5.0, help="simulated seconds per size (raised to the phases')")
    ap.add_argument("--loss", type=float, default=0.1, help="loss probability per datagram, every path")
    ap.add_argument("--latency-ms", type=float, default=0.2, help="one-way latency, base")
    ap.add_argument("--jitter-ms", type=float, default=0.2, help="one-way latency, uniform extra")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cpu-scale", type=float, default=0.0,
                    help="0: processing is instant; > 0: a node is busy, in virtual time, for the CPU time each\n"
                         "step of the real class took here x this (datagrams wait in its socket meanwhile)")
    ap.add_argument("--rcvbuf", type=int, default=0,
                    help="datagrams a busy or stalled node's socket holds (0: no bound)")
    ap.add_argument("--budget", type=float, default=300.0,
                    help="wall seconds a size may take (estimated); bigger sizes are reported, not run")
    ap.add_argument("--confirmations", default=str(heartbeat_module.CONFIRMATIONS),
                    help="the suspicion rule's confirmations, comma-separated: each size runs once per value, side\n"
                         f"by side (the class's rule is {heartbeat_module.CONFIRMATIONS}; 1 was the rule before)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if any(n < 3 for n in sizes):
        ap.error("--sizes: every size must be 3 or more (a partition needs a minority and a majority)")
    try:
        rules = [int(k) for k in args.confirmations.split(",") if k.strip()]
    except ValueError:
        ap.error(f"--confirmations: {args.confirmations!r} must be whole numbers, comma-separated")
    if not rules or any(k < 1 for k in rules):
        ap.error(f"--confirmations: {args.confirmations!r} must be whole numbers from 1")
    opts = Options(args.profile, args.seconds, args.loss, args.seed, args.latency_ms / 1000, args.jitter_ms / 1000,
                   args.cpu_scale, args.rcvbuf, rules[0])
    interval = float(PROFILES[opts.profile]["heartbeat_interval"])
    cost = datagram_cost()
    wall_per_datagram = 3 * sum(cost)  # until a size measured it
    tl = Timeline.of(opts.profile, opts.seconds)
    if tl.end > opts.seconds + 1e-9:
        print(f"--seconds raised to {tl.end:.2f}: the {opts.profile} profile's phases need it", file=sys.stderr)
    rows: list[Row] = []
    lines = [HEADER, RULE]
    for n in sizes:
        estimate = n * (n - 1) / interval * tl.end * wall_per_datagram
        if estimate > args.budget:
            print(f"N={n}: not run, about {estimate:,.0f} wall s (--budget {args.budget:g})", file=sys.stderr)
            lines.append(skipped_row(n, interval, cost, wall_per_datagram))
            continue
        for k in rules:
            print(f"N={n}, {k} confirmation(s): simulating {tl.end:.2f} s ({opts.profile}), about {estimate:.0f} "
                  "wall s", file=sys.stderr)
            row = run_size(n, replace(opts, confirmations=k), cost)
            wall_per_datagram = row.wall_s / max(1, row.datagrams)
            rows.append(row)
            lines.append(table_row(row))
    if args.json:
        print(json.dumps({"options": asdict(opts), "cost_send_s": cost[0], "cost_take_s": cost[1],
                          "wall_per_datagram_s": wall_per_datagram, "rows": [asdict(r) for r in rows]}, indent=2))
        return 0
    prof = PROFILES[opts.profile]
    print(f"Profile {opts.profile}: heartbeat {interval * 1000:g} ms x {prof['heartbeat_miss']}, loss {opts.loss:g} "
          f"per datagram, latency {args.latency_ms:g} + {args.jitter_ms:g} ms, seed {opts.seed}, cpu-scale "
          f"{opts.cpu_scale:g}, rcvbuf {opts.rcvbuf or 'unbounded'}, {tl.end:.2f} simulated s per size\n")
    print("\n".join([*lines, "", *footer(opts.profile, opts.loss, cost, wall_per_datagram, rules)]))
    for r in rows:
        for f in r.first_false:
            print(f"false suspicion at N={r.n}, {r.confirmations} confirmation(s): {f['observer']} suspected "
                  f"{f['target']} at {f['time']:.3f} s (seed {opts.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
