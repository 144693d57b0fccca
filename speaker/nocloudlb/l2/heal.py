"""What the layer-2 mode re-announces when the cluster heals (mode.py ``on_heal``): only what may
have moved behind this node's back. After this node was doubted (``refuted``), paused
(``resumed``) or back in the majority after it kept its VIPs without quorum (``quorumGained``):
every VIP it leads; after a peer came back (``memberJoined``): the VIPs it leads for which that
peer is a candidate; anything else (a refuted suspicion of a peer) moved nothing.

A pure function, like the election: the mode calls the announcer with its answer.
"""

from __future__ import annotations


def heal_picks(heals: list[tuple[str, str]], led: list[str],
               candidates: dict[str, list[str]]) -> tuple[set[str], dict[str, set[str]]]:
    """The VIPs of ``led`` to re-announce for ``heals`` ((reason, node) pairs), and reason -> the nodes
    that made it pick any."""
    reasons: dict[str, set[str]] = {}
    want: set[str] = set()
    for reason, node in heals:
        if reason in ("refuted", "resumed", "quorumGained"):  # quorumGained: it kept them in a minority
            picked = set(led)
        elif reason == "memberJoined":
            picked = {ip for ip in led if node in candidates.get(ip, ())}
        else:
            picked = set()
        if picked:
            reasons.setdefault(reason, set()).add(node)
            want |= picked
    return want, reasons
