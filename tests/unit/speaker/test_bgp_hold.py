"""bgp/hold.py: what a stop of the speaker does to bgpd's networks (issue 22 part 4).

The pure parts are table-tested here: which systemd jobs mean a restart, which unit a cgroup file
names, which ``network`` lines a config holds, when a stop keeps the routes; and ``guard`` on a real
frr.conf with no bgpd running (its work on a live bgpd, and the whole restart at three routers, is
molecule bgp's section 8: ``rolling_restart.yml`` with every router's FIB sampled, and ``kill -9``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nocloudlb.bgp.frr import FrrControl
from nocloudlb.bgp.hold import guard, kept_on_stop, own_unit, restarting
from nocloudlb.bgp.render import networks_in, strip_networks

UNIT = "nocloudlb-speaker.service"


@pytest.mark.parametrize(("output", "want"), [
    (f"279 {UNIT} restart running\n", True),
    (f"280 {UNIT} try-restart running\n", True),
    (f"281 {UNIT} stop running\n", False),  # systemctl stop: withdraw
    (f"282 {UNIT} start waiting\n", False),
    ("", False),  # no job: a kill, the watchdog
    (f"283 other.service restart running\n284 {UNIT} stop running\n", False),  # another unit's restart
    ("283 other.service restart running\n", False),
    ("garbage", False),
])
def test_only_a_restart_job_of_this_unit_keeps_the_routes(output, want):
    assert restarting(output, UNIT) is want


@pytest.mark.parametrize(("text", "want"), [
    (f"0::/system.slice/{UNIT}\n", UNIT),  # cgroup v2
    (f"12:pids:/system.slice/{UNIT}\n9:name=systemd:/system.slice/{UNIT}\n1:blkio:/\n", UNIT),  # v1
    (f"0::/nlab/bgp/n1/system.slice/{UNIT}\n", UNIT),  # a lab host's nested tree
    ("0::/user.slice/user-0.slice/session-3.scope\n", ""),  # not a service
])
def test_own_unit_is_read_from_the_cgroup_path(tmp_path, text, want):
    f = tmp_path / "cgroup"
    f.write_text(text)
    assert own_unit(str(f)) == want
    assert own_unit(str(tmp_path / "missing")) == ""


CONF = """frr defaults traditional
hostname n1
!
router bgp 64512
 bgp router-id 198.51.100.11
 neighbor 198.51.100.1 remote-as 64500
 !
 address-family ipv4 unicast
  network 203.0.113.10/32
  network 203.0.113.11/32
  neighbor 198.51.100.1 route-map r1-out out
 exit-address-family
 !
 address-family ipv6 unicast
  network 2001:db8:1::10/128
 exit-address-family
exit
!
router bgp 64512 vrf red
 address-family ipv4 unicast
  network 203.0.113.20/32
 exit-address-family
exit
!
route-map r1-out permit 10
exit
!
"""


def test_networks_in_reads_every_router_and_family_and_strip_removes_exactly_them():
    nets = networks_in(CONF)
    assert nets == {("", 64512): {"ipv4": ["203.0.113.10/32", "203.0.113.11/32"], "ipv6": ["2001:db8:1::10/128"]},
                    ("red", 64512): {"ipv4": ["203.0.113.20/32"]}}
    stripped = strip_networks(CONF, None)
    assert networks_in(stripped) == {}
    assert "network" not in stripped and "route-map r1-out out" in stripped
    assert len(stripped.splitlines()) == len(CONF.splitlines()) - 4
    one = strip_networks(CONF, {("", 64512): {"ipv4": ["203.0.113.11/32"]}})
    assert networks_in(one)[("", 64512)]["ipv4"] == ["203.0.113.10/32"]
    assert networks_in(one)[("red", 64512)] == {"ipv4": ["203.0.113.20/32"]}


@dataclass
class FakeBgp:
    name: str = "bgp"
    failing: str = ""
    mode: object = field(default=None)


class Keeps:
    def __init__(self, keeps: bool) -> None:
        self.keeps = keeps

    def keeps_routes(self) -> bool:
        return self.keeps


@pytest.mark.parametrize(("failing", "mode_failing", "keeps", "pending", "want"), [
    ("", "", True, True, {"bgp"}),
    ("", "", True, False, set()),  # a stop, not a restart
    ("the decision loop has failed", "", True, True, set()),  # failing closed: withdraw
    ("", "apply: boom", True, True, set()),  # the mode's apply fails
    ("", "", False, True, set()),  # a change pending, a withdrawal in force, bgpd not answering
])
def test_a_stop_keeps_bgp_routes_only_for_a_restart_of_a_healthy_mode(failing, mode_failing, keeps, pending, want):
    modes = [FakeBgp(name="l2", mode=Keeps(True)), FakeBgp(failing=mode_failing, mode=Keeps(keeps))]
    asked: list[str] = []

    def ask(unit: str) -> bool:
        asked.append(unit)
        return pending

    assert kept_on_stop(modes, failing, UNIT, ask) == want
    assert kept_on_stop(modes[:1], "", UNIT, ask) == set()  # no BGP mode


def _frr(tmp_path: Path) -> tuple[FrrControl, Path]:
    """FrrControl on a root of its own: frr.conf written there, no bgpd socket, no vtysh (FRR down)."""
    conf = tmp_path / "etc" / "frr" / "frr.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(CONF)
    (tmp_path / "run" / "frr").mkdir(parents=True)
    return FrrControl(root=str(tmp_path), vtysh=str(tmp_path / "no-vtysh")), conf


def test_guard_keeps_everything_for_a_clean_stop_before_a_restart(tmp_path):
    frr, conf = _frr(tmp_path)
    assert guard({"SERVICE_RESULT": "success"}, frr, UNIT, lambda unit: True) == 0
    assert conf.read_text() == CONF


@pytest.mark.parametrize("result", ["signal", "watchdog", "timeout", "exit-code", "core-dump", "", "success"])
def test_guard_strips_frr_conf_when_no_restart_follows_a_clean_stop_or_the_stop_was_not_clean(tmp_path, result):
    """kill -9 (signal), the watchdog, a stop past TimeoutStopSec, a failed start, or a clean stop with
    no restart: the networks leave frr.conf (what a bgpd that starts reads); with no bgpd to tell,
    guard says so by its exit status."""
    frr, conf = _frr(tmp_path)
    assert guard({"SERVICE_RESULT": result}, frr, UNIT, lambda unit: False) == 1
    assert networks_in(conf.read_text()) == {}
    assert "neighbor 198.51.100.1 remote-as 64500" in conf.read_text()


def test_guard_with_neither_bgpd_nor_frr_conf_has_nothing_to_do(tmp_path):
    frr = FrrControl(root=str(tmp_path), vtysh=str(tmp_path / "no-vtysh"))
    assert guard({"SERVICE_RESULT": "signal"}, frr, UNIT, lambda unit: False) == 0
