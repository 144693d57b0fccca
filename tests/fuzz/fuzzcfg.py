"""Bounded fuzzing (issue 8, section 3). ``make fuzz`` runs it with the defaults below, in well under two
minutes; the longer run documented in docs/fuzzing.md sets FUZZ_FRAMES=1000000 and FUZZ_EXAMPLES=5000."""

from __future__ import annotations

import os

FRAMES = int(os.environ.get("FUZZ_FRAMES", "20000"))
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
SEED = int(os.environ.get("FUZZ_SEED", "8"))
