"""Who exchanges full state with a member that came back: a few members, not all of them.

When a member comes back (joined, or alive again after this node held it dead or left), membership.py
starts an anti-entropy push-pull with it, so that a one-sided merge heals within a round trip (its
docstring says why). If every member did that, each return would cost the member that came back one
full-state exchange per member, O(N) TCP sessions of O(N) bytes at once: at 40 ``lan`` members under
load that slowed the member enough to be suspected again, whose refutation was a return again, and
the cluster fed its own suspicion storm.

The rule: ``me`` exchanges with ``member`` when either is among the other's first ``k`` members by
rendezvous hash (kinship.rendezvous) over the members ``me`` sees alive or suspect. A return costs the
cluster about 2k exchanges, whatever N is. Both sides compute the same pairs whenever they agree on
the names, and a node that comes back to a cluster it held dead still exchanges with the first
member it sees again (alone in its view, that member is among its first k): the one-sided merge is
healed from both sides. A member that was only suspected and refuted needs no exchange (nobody held
it dead); membership.py asks this rule only on kinship's ``MemberJoined`` (alive after unknown, dead
or left), never on ``MemberRecovered`` (a refuted suspicion).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from kinship.rendezvous import owners

HEAL_SYNC_K = 2  # each side's partners per return; 2 so that one unreachable partner is not the only one


def first(member: str, others: Iterable[str], k: int = HEAL_SYNC_K) -> list[str]:
    """The first ``k`` of ``others`` (less ``member``) by kinship's rendezvous weight for ``member``: the
    same on every node that knows the same names."""
    return owners(member, {o for o in others if o != member}, k)


@functools.lru_cache(maxsize=4096)  # the reconnect loop asks again every 0.5 s for each member held dead
def _paired(me: str, member: str, names: frozenset[str], k: int) -> bool:
    return me in first(member, names, k) or member in first(me, names, k)


def heal_sync(me: str, member: str, alive: Iterable[str], k: int = HEAL_SYNC_K) -> bool:
    """Does ``me`` push-pull with ``member``, which just came back, given the members ``me`` sees alive?"""
    if me == member:
        return False
    return _paired(me, member, frozenset(alive) | {me, member}, k)
