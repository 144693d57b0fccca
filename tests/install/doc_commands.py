"""The commands of the docs' ``console`` blocks (README.md and docs/*.md), read one way for every test.

The tests that run documented commands take them from here (own_hosts.py, quickstart.py,
doc_playbooks.py), and tests/unit/docs/test_doc_commands.py checks that each command of every
page is run by one of them or says on the page why not: a block whose first line is
``# not run by the tests: REASON`` (the whole block), or a command whose own comment holds
``not run by the tests: REASON``.

A block is a transcript when its first line is a root prompt and a command (``# nocloudlb
status``): its commands are the prompted lines, the rest is output. In any other block every line
that is not a comment is a command (a line ending in a backslash goes on on the next one; a
here-document is part of its command).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```console\n(.*?)^```", re.M | re.S)
REASON = re.compile(r"not run by the tests(?: as written)?: (.+)$", re.I)
HEREDOC = re.compile(r"<<-?\s*'?(\w+)'?")
PROMPTED = re.compile(r"^# ((?:nocloudlb|tcpdump|systemctl|journalctl|ip|curl|ansible-playbook) .*)$")


@dataclass(frozen=True)
class Command:
    page: str  # relative to the checkout: README.md, docs/NAME.md
    line: int  # on the page (the first line of a continued command)
    text: str  # as written, continuations joined, its comment kept
    cmd: str  # without its comment
    block: int  # the page's console block it is in (0-based)
    reason: str | None  # why no test runs it, as the page says


def pages(top: Path = TOP) -> list[str]:
    return ["README.md"] + sorted(f"docs/{p.name}" for p in (top / "docs").glob("*.md"))


def without_comment(line: str) -> str:
    """``line`` up to its shell comment (a ``#`` after a blank, outside quotes), stripped."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def blocks(page: str, top: Path = TOP) -> list[tuple[int, str]]:
    """The page's console blocks in order, each (line of its first line, text)."""
    doc = (top / page).read_text()
    return [(doc.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in BLOCK.finditer(doc)]


def commands(page: str, top: Path = TOP) -> list[Command]:
    out: list[Command] = []
    for b, (first, text) in enumerate(blocks(page, top)):
        lines = text.splitlines()
        m = REASON.search(lines[0]) if lines and lines[0].startswith("#") else None
        block_reason = m.group(1) if m else None
        transcript = bool(lines and PROMPTED.match(lines[0]))
        i = 0
        while i < len(lines):
            n, line = first + i, lines[i].rstrip()
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1].rstrip() + " " + lines[i].strip()
            i += 1
            if transcript:
                p = PROMPTED.match(line)
                if not p:
                    continue  # output
                line = p.group(1)
            elif not line.strip() or line.lstrip().startswith("#"):
                continue
            cmd = without_comment(line)
            here = HEREDOC.search(cmd)
            if here:  # the document is part of the command
                while i < len(lines) and lines[i].strip() != here.group(1):
                    i += 1
                i += 1
            own = REASON.search(line[len(cmd):]) if cmd != line.strip() else None
            out.append(Command(page, n, line.strip(), cmd, b, own.group(1) if own else block_reason))
    return out


def all_commands(top: Path = TOP) -> list[Command]:
    return [c for page in pages(top) for c in commands(page, top)]
