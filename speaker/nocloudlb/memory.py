"""The cyclic garbage collector at size (issue 10).

At 10,000 VIPs the speaker holds a few hundred thousand long-lived objects (the parsed config, the
election's plan, the rows). CPython's full collection walks all of them, about 0.1 s here, and it
comes when the allocation count says so, in the middle of a reconcile (a membership change took
0.1 s longer whenever one fell in it). ``settle`` runs once after each config is in use: it
collects what the previous config left (cycles included), then freezes every object alive, so later
collections walk only what was allocated since. Objects frozen are still freed by reference
counting; a frozen cycle is collected at the next ``settle`` (the next config). Then glibc's
``malloc_trim`` hands the free heap left by the previous config back to the system (6-11 MB at
10,000 VIPs here); elsewhere that step is skipped.
"""

from __future__ import annotations

import ctypes
import gc

_libc: ctypes.CDLL | None = None
try:
    _libc = ctypes.CDLL("libc.so.6")  # glibc by name: find_library would run ldconfig at import
    if not hasattr(_libc, "malloc_trim"):
        _libc = None
except OSError:
    _libc = None


def settle() -> int:
    """Collect, then move every live object out of the collector's reach; returns objects collected."""
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    if _libc is not None:
        _libc.malloc_trim(0)
    return found
