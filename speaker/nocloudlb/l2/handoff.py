"""Make before break: which VIPs this node keeps answering while a member takes them.

A planned move (a drain, an undrain, a member preempting after a restart, a member that stopped
hearing this node) has two sides that decide apart: the node giving a VIP up decides when it hears of
the change (its own label at once, a peer's by gossip), the node taking it announces once its
handover forwarding is in place (l2/forwarding.py, tens of milliseconds of ``nft``). Withdrawing at
the decision left a window in which nobody answered ARP/NDP for the VIP (measured at an undrain: up
to one 0.1 s sample in three runs of the mixed-version test).

So the side giving the VIP up hands it off instead: its responder keeps answering (sending no more
gratuitous frames) until the member taking it announces it (any other MAC's announcement ends it too:
the taker may have died meanwhile and a third node taken over), and stops on that frame
(l2/responder.py, ``H``), or after ``HANDOFF_MAX`` s when no announcement came.
Both answer only for as long as the responder takes to read that one frame. A taker that runs the
RFC 5227 check first (after its restart or a boot cut off from its peers, or taking back a VIP it
yielded) hears this node answer its probes; it waits for their silence at most ``MEMBER_WAIT`` s
(the speaker's announcer is made with it), then announces and this node stops. Before hand-offs that
wait was 2 s: a member answering a take-back's probes was about to withdraw. Now it is the normal
case, so the wait is short: long enough for a member on the previous release, which withdraws when it
hears of the take-back (milliseconds), to fall silent first, short enough that a take-back is not
slower than before (a boot cut off from its peers, then healed, has 3 s to one owner again:
tests/netns/test_partition_matrix.py).

Only a move to a member this node sees ``alive``, with quorum, whose MACs it knows, and only for a VIP
this node gives up because the election now names that member: anything that makes this node fail
closed (no quorum, its gate, wrong ARP sysctls, a VIP it cannot hold on lo, a failing group) or the
wire rule's verdict (``yieldedOnWire``: the other side announces already) withdraws at once, as does
``withdraw_all``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nocloudlb.core.quorum import REASON_YIELDED_ON_WIRE

from .forwarding import HANDOVER_WAIT
from .rows import VipRow

#: the longest a taker that runs the RFC 5227 check waits for a member answering its probes to fall silent
MEMBER_WAIT = 0.5
#: the longest a hand-off answers without the taker's announcement: the taker's own longest wait before it
#: announces (HANDOVER_WAIT for its forwarding; MEMBER_WAIT after its check), and a second for the news of
#: the move to reach it
HANDOFF_MAX = max(HANDOVER_WAIT, MEMBER_WAIT) + 1.0


def handoffs(lost: Iterable[str], rows: Iterable[VipRow], me: str, states: Mapping[str, str],
             macs: Mapping[str, tuple[bytes, ...]], quorum: bool) -> dict[str, tuple[bytes, ...]]:
    """Of the VIPs this node stops announcing (``lost``), the ones to hand off: ip -> the taker's MACs."""
    lost = set(lost)
    if not lost or not quorum:
        return {}
    out: dict[str, tuple[bytes, ...]] = {}
    for r in rows:
        if r.ip not in lost:
            continue
        taker = r.leader
        if not taker or taker == me or r.reason == REASON_YIELDED_ON_WIRE or states.get(taker) != "alive":
            lost.discard(r.ip)  # any row of the VIP that says otherwise: withdrawn at once
            out.pop(r.ip, None)
            continue
        theirs = macs.get(taker)
        if theirs:
            out[r.ip] = tuple(theirs)
        else:
            lost.discard(r.ip)
    return out
