"""The speaker's quorum (nocloudlb.core.quorum) wired to its parts: the configured and known members,
the heartbeats' view, the witness, the layer-2 mode's settling. One job: answer ``has()``.

- ``basis(members)``: (configured, known) from the config and gossip's members. Configured: the join
  list's addresses and this node's bind, once each, less the members that left gracefully (a stopped
  speaker withdrew everything first and competes for nothing: a rolling restart keeps quorum).
  Known: the members gossip holds alive, suspect or dead, this node included.
- ``attach(hb, l2)``: after the heartbeats started, hand them the witness (``memberlist.witness``,
  pinged by witness.py: one vote while it answers), the re-announce on quorum gained back, and give
  the layer-2 mode its settling time (three heartbeat timeouts); warn about an even cluster without
  a witness.
- ``has()``: from the heartbeats when they run (who hears whom); otherwise from gossip's live members.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from nocloudlb.core.quorum import has_quorum

from . import logs

log = logging.getLogger("nocloudlb.speaker")


class _Start(NamedTuple):
    """What the quorum reads of the config, taken at start (a restart applies a change of them)."""

    node_name: str
    bind: str
    join: tuple[str, ...]
    witness: str


class QuorumWiring:
    def __init__(self, cfg: Any, membership: Callable[[], Any], post: Callable[[str], None]) -> None:
        # those four fields only: holding the SpeakerConfig would keep the start-up config (every service
        # parsed) alive after each reload
        self.cfg = _Start(cfg.node_name, cfg.bind, tuple(cfg.join), cfg.witness)
        self.membership = membership  # -> the Membership, or None before start
        self.post = post
        self.heartbeat: Any = None
        self.witness: Any = None

    def configured(self) -> int:
        return len({self.cfg.bind, *self.cfg.join})

    def basis(self, members: list) -> tuple[int, int]:
        me = self.cfg.node_name
        left = sum(1 for m in members if m.state == "left" and m.name != me)
        known = sum(1 for m in members if m.state != "left" and m.name != me) + 1
        return max(1, self.configured() - left), known

    def attach(self, hb: Any, l2: Any) -> None:
        self.heartbeat = hb
        if l2 is not None:  # after a heal, a few heartbeat timeouts for the view to settle (l2/disagree.py)
            l2.wire.settle = 3 * hb.timeout
        hb.on_quorum = lambda: self.post(f"heal\tquorumGained\t{self.cfg.node_name}")
        if not self.cfg.witness and self.configured() % 2 == 0:
            logs.event(log, "quorumWithoutWitness", "an even number of configured members and no memberlist.witness: "
                       "a crash in a two-node cluster (an even split in a larger one) leaves no side with a majority, "
                       "so the dead node's VIPs stay unowned; name the gateway as witness", logging.WARNING,
                       members=self.configured())
        if self.cfg.witness:
            from .witness import Witness  # noqa: PLC0415

            self.witness = Witness(self.cfg.witness, period=max(hb.timeout / 2, 0.02), window=hb.timeout * 1.5,
                                   on_change=hb.witness_changed, logger=logging.getLogger("nocloudlb.witness"))
            try:
                self.witness.start()
            except OSError as exc:
                logs.event(log, "witnessFailed", f"cannot ping the witness {self.cfg.witness}: {exc}; "
                           "its vote counts as absent", logging.ERROR)
            hb.set_witness(self.witness.up)

    def has(self) -> bool:
        if self.heartbeat is not None:
            return bool(self.heartbeat.view().quorum)
        ml = self.membership()
        if ml is None:
            return False
        members = ml.members()
        alive = sum(1 for m in members if m.state in ("alive", "suspect") and m.name != self.cfg.node_name)
        return has_quorum(alive, *self.basis(members), bool(self.cfg.witness),
                          self.witness is not None and self.witness.up())

    def status(self) -> dict | None:
        return self.witness.status() if self.witness is not None else None

    def close(self) -> None:
        if self.witness is not None:
            self.witness.close()
