# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""When nodes disagree: who may take a layer-2 VIP, who keeps one, who yields. Pure functions.

The rule (docs/concepts.md, "When nodes disagree"):

1. **Quorum.** A node has quorum while it is *connected* to a strict majority of the cluster's
   votes, itself included: ``2 x votes > total``. A peer counts when its heartbeats arrive here and
   its latest one does not say that it stops hearing this node (hearing and being heard are
   separate facts: a node whose inbound traffic is lost hears nobody and says so in the heartbeats
   it still sends). ``total`` is the larger of the configured members (the join list with this
   node, less the members that left gracefully: they withdrew everything before leaving and
   compete for nothing, so a rolling restart keeps quorum) and the members gossip knows (alive,
   suspect or dead), so a cluster that grew beyond its join lists never lets two halves both count
   a majority. A witness (an address on
   the announce segment, such as the gateway) adds one vote to ``total`` and one to ``votes``
   while it answers: a two-node cluster then fails over on a crash, yet a node alone without the
   witness takes nothing.
2. **Take only with quorum.** A node announces a VIP it does not already announce only while it
   has quorum. Without quorum it keeps what it holds (it cannot tell its peers' death from its
   own isolation, and when every node is isolated, keeping is what leaves exactly one owner) and
   takes nothing new.
3. **Peers without quorum are not candidates.** A member whose heartbeats have said for a few
   heartbeat timeouts that it has no quorum is left out of the election by the others (as if
   unreachable): the majority elects a new owner
   for its VIPs, the way it does for a member it stopped hearing.
4. **The wire is the last word.** A node that sees another member's MAC announce a VIP it
   announces (a gratuitous ARP, an unsolicited NA) yields that VIP when it has no quorum, or when
   that member is a candidate it ranks before itself for the VIP. Otherwise it keeps it (the other
   side yields by the same rule). Both sides compute this alike from what they know of
   themselves, so a node cut from its peers but still on the client segment stops answering
   as soon as the majority's new owner announces, instead of answering beside it.

What it costs: a node that lost its peers (the others crashed, or it is cut off) keeps its VIPs
but takes no new ones; the last survivor of a three-node cluster keeps its own VIPs, and those
of the dead nodes stay unowned until a majority is back, or the operator gives it quorum back
(``memberlist.witness`` for two nodes, or a smaller join list).
"""

from __future__ import annotations

from collections.abc import Sequence

#: reasons a VIP is not announced (beside the election's)
REASON_NO_QUORUM = "noQuorum"
REASON_YIELDED_ON_WIRE = "yieldedOnWire"
REASON_SETTLING = "quorumSettling"  # quorum just gained back: the view settles before anything new is taken


def quorum_total(configured: int, known: int, witness: bool) -> int:
    """The cluster's votes: the larger of the configured and the gossip-known members, plus the witness."""
    return max(int(configured), int(known), 1) + (1 if witness else 0)


def has_quorum(connected: int, configured: int, known: int, witness: bool = False, witness_up: bool = False) -> bool:
    """True when this node and the ``connected`` peers (plus the witness, while it answers) are a
    strict majority of ``quorum_total``. A one-member cluster always has quorum."""
    votes = 1 + max(0, int(connected)) + (1 if witness and witness_up else 0)
    return 2 * votes > quorum_total(configured, known, witness)


def contest_yields(me: str, other: str, quorum: bool, order: Sequence[str], candidates: Sequence[str]) -> bool:
    """Whether this node (``me``) yields a VIP it announces when member ``other`` announces it too.

    ``order``: the VIP's election order as this node computes it (every member, best first);
    ``candidates``: the members this node holds eligible for it. Without quorum this node yields.
    With quorum it yields only to a candidate it ranks before itself (the election would hand
    the VIP over anyway); a member it does not hold eligible (unreachable, without quorum, drained)
    is not followed: that member yields by the same rule.
    """
    if not quorum:
        return True
    if other not in candidates:
        return False
    rank = {n: i for i, n in enumerate(order)}
    return rank.get(other, len(rank)) < rank.get(me, len(rank))
