"""Every relative link in README.md and docs/ points at a file that exists (pages other
branches are writing are allowed to be missing until they land)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# written on other branches (BGP, keepalived, data plane, chaos)
ELSEWHERE = {"bgp.md", "keepalived.md", "dataplane.md", "chaos.md"}


def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if Path(path).name in ELSEWHERE:
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
