"""The MACs of the layer-2 mode: the ones this node answers from, published to its peers (so they
know its answers for a handover, not a conflict, and forward to it), and the ones each member
published (``member_of``, ``is_peer_mac``).

Part of the layer-2 mode (mode.py); ``publish`` runs on every reconcile, so it is cheap at
10,000 VIPs (the interfaces in use are worked out again only when what was announced changed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..metadata import MAX_MACS


class MacMeta:
    """Publishes this node's MACs; looks up the members'."""

    def __init__(self, member_macs: Callable[[], dict[str, tuple[bytes, ...]]]) -> None:
        self.member_macs = member_macs  # member name -> the MACs it published (this node excluded)
        self._key: tuple | None = None
        self._used: set[str] = set()

    def publish(self, announcer: Any, announced: dict[str, list[str]]) -> dict[str, Any]:
        """``{"macs": [...]}``: the MACs of the interfaces in use first, at most MAX_MACS; {} on failure."""
        try:
            # cheap (every reconcile, 10,000 VIPs): the announcer's MACs, and the interfaces in use from
            # what it was given (all eligible ones when a VIP names none)
            macs_of = getattr(announcer, "macs", None)
            macs = macs_of() if macs_of is not None else announcer.stats().get("macs", {})
            key = (id(announced), tuple(sorted(macs.items())))
            if key != self._key:
                used: set[str] = set()
                for ifs in announced.values():
                    used.update(ifs if ifs else macs)
                self._key, self._used = key, used
            used = self._used
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

    def member_of(self, mac: bytes) -> str | None:
        """The member that published ``mac`` (None: not a member's)."""
        for name, macs in self.member_macs().items():
            if mac in macs:
                return name
        return None

    def is_peer_mac(self, mac: bytes) -> bool:
        """A MAC another member published (answers from it are a handover, not a conflict)."""
        return any(mac in macs for macs in self.member_macs().values())
