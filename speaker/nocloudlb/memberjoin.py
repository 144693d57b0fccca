"""Joining the cluster: the join thread tries the seeds (backing off up to 10 s) until this node has
company, and keeps the join state the gate and the status read (a refused join names the likely
cause: a seed that accepts connections but refuses our gossip has another key)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import kinship
from kinship.blocking import Cluster

from .logs import event
from .memberview import tcp_reachable


class Joiner:
    """The join thread's loop (``run``) and the join state: ``join_state`` (starting | joined | alone |
    joinFailed), ``join_error``, ``join_refused`` (seeds reachable but our gossip refused: wrong key or
    cluster label) and ``first_join_done`` (set once the first attempt ended)."""

    def __init__(self, cluster: Callable[[], Cluster | None], stop: threading.Event, on_change: Callable[[], None],
                 log: logging.Logger) -> None:
        self._cluster = cluster
        self._stop = stop
        self._on_change = on_change
        self.log = log
        self.join_state = "starting"  # starting | joined | alone | joinFailed
        self.join_error = ""
        self.join_refused = False  # seeds reachable but our gossip refused (wrong key / cluster label)
        self.first_join_done = threading.Event()

    def run(self, seeds: list[str], join_timeout: float) -> None:
        """Join ``seeds`` (each attempt at most ``join_timeout`` s) until this node has company."""
        delay = 1.0
        while not self._stop.is_set():
            cluster = self._cluster()
            assert cluster is not None
            if not seeds:
                self.join_state = "alone"
                self.first_join_done.set()
                return
            if len(cluster.members()) > 1:
                self.joined()
                return
            error = ""
            try:
                cluster.join(seeds, timeout=join_timeout)
            except kinship.JoinError as exc:
                error = str(exc)
            except (TimeoutError, kinship.KinshipClosed):
                if self._stop.is_set():
                    return
                error = "join timed out"
            # Another member may have joined us while our own attempt failed (a slow seed, a loaded
            # host): then we are in a cluster, and calling it refused would withdraw every VIP.
            if len(cluster.members()) > 1 or self._stop.is_set():
                self.joined()
                return
            if error:
                self.failed(seeds, error)
            self.first_join_done.set()
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, 10.0)

    def joined(self) -> None:
        was = self.join_state
        self.join_state, self.join_error, self.join_refused = "joined", "", False
        self.first_join_done.set()
        if was != "joined":
            cluster = self._cluster()
            assert cluster is not None
            event(self.log, "memberlistJoined", members=sorted(m.name for m in cluster.members()))
        self._on_change()

    def failed(self, seeds: list[str], error: str) -> None:
        reachable = [s for s in seeds if tcp_reachable(s)]
        if reachable:
            reason = (f"seeds {', '.join(reachable)} accept connections but refused our gossip: the gossip key "
                      "(memberlist.keyFile) or the cluster label most likely differs from the cluster's")
        else:
            reason = f"no seed reachable ({', '.join(seeds)}): {error}; starting alone and retrying"
        changed = reason != self.join_error
        self.join_state, self.join_error, self.join_refused = "joinFailed", reason, bool(reachable)
        if changed:
            event(self.log, "memberlistJoinFailed", reason, logging.ERROR, seeds=seeds, reachable=reachable)
            self._on_change()
