"""The cyclic garbage collector at size (issue 10).

At 10,000 VIPs the speaker holds a few hundred thousand long-lived objects (the parsed config, the
election's plan, the rows). CPython's full collection walks all of them, about 0.1 s here, and it
comes when the allocation count says so, in the middle of a reconcile (a membership change took
0.1 s longer whenever one fell in it). ``settle`` runs once after each config is in use: it
collects what the previous config left (cycles included), then freezes every object alive, so later
collections walk only what was allocated since. Objects frozen are still freed by reference
counting; a frozen cycle is collected at the next ``settle`` (the next config).
"""

from __future__ import annotations

import gc


def settle() -> int:
    """Collect, then move every live object out of the collector's reach; returns objects collected."""
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found
