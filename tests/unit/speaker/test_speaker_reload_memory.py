"""Issue 23 part 4, memory across reloads: after a reload of a changed config, nothing holds the previous
config (its parsed services were kept alive by the quorum's wiring, which held the start-up config whole:
at 10,000 VIPs about 280,000 blocks, 20-30 MB, that never came back; benchmarks/reload_memory.py)."""

from __future__ import annotations

import gc
import weakref

from inproc_speaker import pool_docs, service_doc


def test_a_reload_of_a_changed_config_frees_the_previous_one(harness):
    docs = pool_docs() + [service_doc(f"svc{i}", f"198.51.100.{200 + i}") for i in range(5)]
    sp = harness.speaker("s", docs)
    try:
        sp.reconcile()
        first = sp.config.cfg
        gone = [weakref.ref(first.parsed), *(weakref.ref(s) for s in first.parsed.services)]
        del first
        for i in range(2):  # the first reload frees the start-up config, the second its own predecessor
            path = harness.write("s", harness.config("s", docs + [service_doc(f"new{i}", f"198.51.100.{230 + i}")]))
            assert path.exists()
            assert sp.reload()["ok"]
            sp.reconcile()
            if i == 0:
                second = weakref.ref(sp.config.cfg.parsed)
        gc.unfreeze()  # memory.settle froze what was alive at the reconcile: collect for real
        gc.collect()
        assert [r for r in gone if r() is not None] == []
        assert second() is None
        assert len(sp.config.cfg.parsed.services) == 6
    finally:
        gc.unfreeze()
