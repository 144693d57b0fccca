"""The live parts of one speaker, shared by the parts of the daemon that use them (issue 23).

``Speaker`` (daemon.py) makes these at start (membership, heartbeats, quorum, health checker, label
store, layer-2 mode) and hands this one record to its parts (configstate, views, status, handlers,
...): each part reads what it needs when it runs, so a part made before start sees what start made.
It holds no decision; the two reads below are the ones several parts share.

- ``post(what)``: wake the decision thread (``Speaker.post``: safe from any thread and signal handlers);
- ``steps``: the barriers' failure counts (modes.Steps); ``modes``: the running modes, in apply order;
- ``ready``: the first join ended (READY=1 sent); ``closed``: the gossip layer stopped (fail closed, exit);
  ``stopping``: a graceful stop began (no reconcile any more);
- ``has_quorum()``: connected to a majority of the cluster's votes (quorumwire.py), False before start;
- ``suspecters()``: members that suspect this node now (heartbeat.py), none without heartbeats;
- ``mode_rows(status)``: a mode status's VIP rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .modes import ModeRunner, Steps

if TYPE_CHECKING:
    from .health import HealthChecker
    from .heartbeat import Heartbeat
    from .membership import Membership
    from .quorumwire import QuorumWiring
    from .state import LabelStore


@dataclass(eq=False)
class Runtime:
    post: Callable[..., None]
    steps: Steps = field(default_factory=Steps)  # failures per step, behind their barriers (nocloudlb.modes)
    modes: list[ModeRunner] = field(default_factory=list)
    membership: Membership | None = None
    heartbeat: Heartbeat | None = None  # heartbeat: direct heartbeats (fast suspicion, drains)
    quorum: QuorumWiring | None = None  # quorumwire.py: who may take VIPs, made at start
    health: HealthChecker | None = None
    labels: LabelStore | None = None
    l2: Any = None  # the layer-2 mode (nocloudlb.l2.mode.L2Mode)
    delivery: Any = None  # nocloudlb.l2.delivery, or a stand-in given to Speaker
    connsync: Any = None  # nocloudlb.dataplane.connsync.ConnSync while connectionSync is enabled
    ready: bool = False
    closed: bool = False  # the gossip layer stopped: fail closed and exit
    stopping: bool = False  # a graceful stop began: no reconcile any more

    def has_quorum(self) -> bool:
        """This node is connected to a majority of the cluster's votes (quorumwire.py): it may take VIPs."""
        return self.quorum.has() if self.quorum is not None else False

    def suspecters(self) -> frozenset[str]:
        """Members that suspect this node now (heartbeat.py's rule 2 and 3): it yields them the VIPs
        they take."""
        return self.heartbeat.view().suspecters if self.heartbeat is not None else frozenset()


def mode_rows(st: dict) -> list[dict]:
    """A mode status's VIP rows (``vips``: one owner per VIP, as layer 2 keeps them), rows only."""
    rows = st.get("vips")
    return [v for v in rows if isinstance(v, dict) and "ip" in v] if isinstance(rows, list) else []
