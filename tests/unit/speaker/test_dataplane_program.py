"""The data plane's programming when nft fails (speaker/nocloudlb/dataplane/program.py, tool.py).

The netns tests (tests/netns/test_dataplane_fail_closed.py) prove it on real nftables; here a
stand-in tool that refuses any script naming a given address drives the bisection and the
bookkeeping through many services, and NftTool runs real programs that print junk.
"""

from __future__ import annotations

import logging

import pytest
from nocloudlb.backoff import Backoff
from nocloudlb.core.backends import Rule, Target
from nocloudlb.dataplane import program
from nocloudlb.dataplane.program import Programmer
from nocloudlb.dataplane.tool import NftError, NftTool

IFACES = {"eth0": (2, ["198.51.100.11/24"])}
log = logging.getLogger("test")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class StandIn:
    """Applies nothing; refuses scripts naming an address of ``refuse`` (checks too), or all when broken."""

    def __init__(self) -> None:
        self.refuse: set[str] = set()
        self.broken = False
        self.applied: list[str] = []
        self.runs = 0
        self.checks = 0

    def _judge(self, script: str) -> None:
        self.runs += 1
        if self.broken:
            raise NftError("broken")
        bad = sorted(a for a in self.refuse if f" {a}:" in script)
        if bad:
            raise NftError(f"refused {bad[0]}")

    def apply(self, script: str) -> None:
        self._judge(script)
        self.applied.append(script)

    def check(self, script: str) -> None:
        self.checks += 1
        self._judge(script)


def rule(i: int, server: str | None = None) -> Rule:
    addr = server or f"198.51.100.{30 + i % 50}"
    t = Target(addr, 80, 1, True, f"{addr}:80")
    return Rule(f"prod/s{i:02d}", f"203.0.113.{i}", "tcp", 80, "nat", "rr", "numgen", [t], [0])


def make(clock: Clock | None = None) -> tuple[Programmer, StandIn]:
    tool = StandIn()
    clock = clock or Clock()
    return Programmer(tool, log, Backoff("nft", base=0.4, ceiling=1.6, clock=clock), clock=clock), tool  # type: ignore[arg-type]


def test_two_services_nft_refuses_are_found_and_the_rest_programmed():
    p, tool = make()
    plan = [rule(i) for i in range(32)]
    assert p.program(plan, IFACES)
    tool.refuse = {"198.51.100.241", "198.51.100.242"}
    new = [*plan[:5], rule(5, "198.51.100.241"), *plan[6:20], rule(20, "198.51.100.242"), *plan[21:]]
    assert p.program(new, IFACES)
    assert sorted(p.held) == ["prod/s05", "prod/s20"]
    assert "refused 198.51.100.241" in p.held["prod/s05"].reason
    assert [r for r in p.rules if r.service == "prod/s05"] == [plan[5]]  # its last good rules stay
    assert not p.pending and not p.backoff.backing_off
    assert tool.checks <= 1 + 2 * 2 * 5  # the empty tables, then about 2 log2(32) per refused service
    # nothing changes: nothing runs, and the refusal holds
    runs = tool.runs
    assert not p.program(new, IFACES) and tool.runs == runs


def test_a_refused_service_is_tried_again_at_a_change_and_after_the_retry_time():
    clock = Clock()
    p, tool = make(clock)
    plan = [rule(i) for i in range(4)]
    p.program(plan, IFACES)
    tool.refuse = {"198.51.100.250"}
    new = [*plan[:3], rule(3, "198.51.100.250")]
    p.program(new, IFACES)
    assert list(p.held) == ["prod/s03"]
    tool.refuse = set()
    clock.now += program.RETRY_REFUSED - 1
    assert not p.program(new, IFACES) and list(p.held) == ["prod/s03"]  # not yet
    clock.now += 1
    assert p.program(new, IFACES) and not p.held and p.rules == new
    tool.refuse = {"198.51.100.251"}
    p.program([*plan[:3], rule(3, "198.51.100.251")], IFACES)
    tool.refuse = set()
    assert p.program([*plan[:3], rule(3, "198.51.100.252")], IFACES) and not p.held  # its config changed


def test_a_new_service_nft_refuses_is_not_forwarded():
    p, tool = make()
    plan = [rule(i) for i in range(3)]
    p.program(plan, IFACES)
    tool.refuse = {"198.51.100.253"}
    assert p.program([*plan, rule(3, "198.51.100.253")], IFACES)
    assert p.rules == plan and list(p.held) == ["prod/s03"]


def test_a_broken_tool_keeps_the_tables_backs_off_and_runs_once_per_retry():
    clock = Clock()
    p, tool = make(clock)
    plan = [rule(i) for i in range(8)]
    p.program(plan, IFACES)
    good = p.rendered
    tool.broken = True
    new = [*plan[:7], rule(7, "198.51.100.99")]
    assert not p.program(new, IFACES)
    assert tool.runs == 1 + 3  # change, whole, check without services: no bisection
    assert p.pending == ["prod/s07"] and p.rendered is good and p.rules == plan
    runs = tool.runs
    for _n in range(5):
        clock.now += p.backoff.remaining()
        assert not p.program(new, IFACES)
    assert tool.runs - runs == 5  # one run per retry while it fails the same way
    assert p.backoff.state()["failures"] == 6
    tool.broken = False
    clock.now += p.backoff.remaining()
    assert p.program(new, IFACES) and p.rules == new and not p.pending and not p.backoff.backing_off


def test_the_plan_reverting_while_failing_needs_no_nft_run():
    p, tool = make()
    plan = [rule(i) for i in range(3)]
    p.program(plan, IFACES)
    tool.broken = True
    assert not p.program([*plan[:2], rule(2, "198.51.100.98")], IFACES)
    runs = tool.runs
    assert not p.program(plan, IFACES)  # back to what the tables hold
    assert tool.runs == runs and not p.backoff.backing_off and not p.pending


def test_nft_printing_junk_is_counted_not_a_failure(tmp_path):
    junk = tmp_path / "nft"
    junk.write_text("#!/bin/sh\ncat >/dev/null\necho '{\"nftables\": [{\"counter\": 7'\necho 'core dumped' >&2\n")
    junk.chmod(0o755)
    tool = NftTool(str(junk), log)
    tool.apply("add table inet t\n")  # exit 0: applied, whatever it printed
    assert tool.counters("inet", "t") == {}
    assert tool.unexpected == 2 and tool.runs == 2
    fails = tmp_path / "nft-fails"
    fails.write_text("#!/bin/sh\necho '\\x01\\x02 garbage' >&2\nexit 3\n")
    fails.chmod(0o755)
    with pytest.raises(NftError, match="garbage"):
        NftTool(str(fails), log).apply("x")
    with pytest.raises(NftError, match="cannot run"):
        NftTool(str(tmp_path / "missing"), log).check("x")


# --------------------------------------------------------------------------- Maglev maps


def maglev_rule(down: set[int] = frozenset(), n: int = 10, scheduler: str = "maglev") -> Rule:
    from nocloudlb.core.backends import maglev_with_health, slots_for

    targets = [Target(f"198.51.100.{30 + i}", 80, 1, i not in down, f"198.51.100.{30 + i}:80") for i in range(n)]
    names, weights, ok = [t.ident for t in targets], [1] * n, [t.healthy for t in targets]
    if scheduler == "maglev":
        slots = maglev_with_health(names, weights, ok)
    else:
        slots = slots_for(scheduler, weights, ok, names)
    return Rule("prod/web", "203.0.113.7", "tcp", 80, "nat", scheduler, "jhash-flow", targets, slots)


def test_maglev_slots_live_in_a_map_and_a_health_flip_changes_only_the_slots_of_that_server():
    from nocloudlb.dataplane import nft

    first = nft.render([maglev_rule()], IFACES)
    (unit,) = first.units.values()
    assert unit.map and len(unit.entries) == 251 and len(unit.chains) == 10
    assert f"vmap @{unit.map}" in first.script and "vmap {" not in first.script
    assert first.script.count(" : goto b") == 251  # one element per slot, no intervals
    down = nft.render([maglev_rule({3})], IFACES, first)
    lines = down.script.splitlines()
    held = [s for s, c in enumerate(unit.entries) if c == unit.chains[3]]
    assert [ln.split(" {")[0] for ln in lines] == [
        f"delete element inet {nft.TABLE} {unit.map}", f"add element inet {nft.TABLE} {unit.map}"]
    assert lines[0].endswith("{ " + ", ".join(map(str, held)) + " }")  # the failed server's slots, no other
    assert lines[1].count(" : goto ") == len(held) and unit.chains[3] not in lines[1]
    assert "counter" not in down.script  # chains and counters stay: the counter keeps counting
    back = nft.render([maglev_rule()], IFACES, down)
    assert back.script.replace("add element", "x").count(" : goto ") == len(held) and back.units == first.units


def test_maglev_map_goes_and_comes_with_the_scheduler():
    from nocloudlb.dataplane import nft

    first = nft.render([maglev_rule()], IFACES)
    (unit,) = first.units.values()
    sh = nft.render([maglev_rule(scheduler="sh")], IFACES, first)
    assert f"delete map inet {nft.TABLE} {unit.map}" in sh.script
    assert sh.script.index(f"flush chain inet {nft.TABLE} {unit.sid}") < sh.script.index("delete map")
    again = nft.render([maglev_rule()], IFACES, sh)
    assert f"add map inet {nft.TABLE} {unit.map}" in again.script and again.script.count(" : goto b") == 251
    gone = nft.render([], IFACES, again)
    assert f"delete map inet {nft.TABLE} {unit.map}" in gone.script
    assert gone.script.index("delete map") < gone.script.index("delete chain")  # elements referenced the chains


def test_maglev_service_in_the_programmer_keeps_its_table_through_flips():
    p, tool = make()
    assert p.program([maglev_rule()], IFACES)
    assert p.program([maglev_rule({0, 1})], IFACES)
    assert tool.applied[-1].startswith("delete element") and len(tool.applied[-1].splitlines()) == 2
    assert p.program([maglev_rule()], IFACES) and p.rules == [maglev_rule()]
