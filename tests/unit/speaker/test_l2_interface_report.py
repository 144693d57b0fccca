"""Issue 20 part 6: an interface an L2Advertisement names that is missing, down or enslaved is reported
(status, log line, metric) instead of silently announcing on nothing; a VIP this node leads with no
interface left to announce on is shown as not announced (``noUsableInterface``)."""

from __future__ import annotations

import logging

from nocloudlb.l2.announcer import L2Announcer
from nocloudlb.l2.interfaces import Interface, unusable
from nocloudlb.l2.mode import L2View, VipRow, seen_key, with_l2
from nocloudlb.statusview import Paint, header, interface_lines, role_of
from prometheus_client import CollectorRegistry


def _info() -> dict[str, Interface]:
    return {
        "eth0": Interface("eth0", 2, "02:00:00:00:00:01", True),
        "eth1": Interface("eth1", 3, "02:00:00:00:00:02", False),
        "eth2": Interface("eth2", 4, "02:00:00:00:00:03", True, skip="master bond0"),
        "eth3": Interface("eth3", 5, "02:00:00:00:00:04", True, carrier=False),
        "tap0": Interface("tap0", 6, "02:00:00:00:00:05", True, skip="tap"),
        "bond0": Interface("bond0", 7, "02:00:00:00:00:03", True),
    }


def test_unusable_names_the_reason_of_each_interface():
    info, others = _info(), {"lo": "loopback", "wg0": "notEthernet"}
    assert unusable("eth0", info, others) == ("", "")
    assert unusable("bond0", info, others) == ("", "")
    assert unusable("eth9", info, others)[0] == "missing"
    assert unusable("eth1", info, others)[0] == "down"
    reason, detail = unusable("eth2", info, others)
    assert reason == "enslaved" and "bond0" in detail and "name the master" in detail
    assert unusable("eth3", info, others)[0] == "noCarrier"
    assert unusable("tap0", info, others)[0] == "tap"
    assert unusable("lo", info, others)[0] == "loopback"
    assert unusable("wg0", info, others)[0] == "notEthernet"


def _announcer(caplog) -> tuple[L2Announcer, CollectorRegistry]:
    reg = CollectorRegistry()
    a = L2Announcer("n1", logging.getLogger("test.ifreport"), registry=reg, check_probes=0)
    a._links.info, a._links.others = _info(), {"lo": "loopback"}
    a._links.eligible = ["bond0", "eth0", "eth3"]
    return a, reg


def _gauge(reg: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {(s.labels["iface"], s.labels["reason"]): s.value for m in reg.collect() for s in m.samples
            if s.name == "nocloudlb_layer2_interface_unusable"}


def test_the_announcer_reports_logs_and_counts_each_unusable_interface(caplog):
    a, reg = _announcer(caplog)
    caplog.set_level(logging.INFO, logger="test.ifreport")
    a.watch_interfaces(["eth0", "eth1", "eth2", "eth9", "lo"], all_eligible=False)
    report = a.interface_report()
    got = {u["iface"]: u["reason"] for u in report["unusable"]}
    assert got == {"eth1": "down", "eth2": "enslaved", "eth9": "missing", "lo": "loopback"}
    assert report["watched"] == ["eth0", "eth1", "eth2", "eth9", "lo"]
    assert _gauge(reg) == {("eth1", "down"): 1, ("eth2", "enslaved"): 1, ("eth9", "missing"): 1,
                           ("lo", "loopback"): 1}
    warned = {r.iface: r for r in caplog.records if getattr(r, "event", "") == "interfaceUnusable"}
    assert sorted(warned) == ["eth1", "eth2", "eth9", "lo"]
    assert all(r.levelno == logging.WARNING for r in warned.values())
    # the same scan again: no new line; eth1 comes up: usable again, logged once, the metric goes
    caplog.clear()
    a._links.report()
    assert not [r for r in caplog.records if getattr(r, "event", "") == "interfaceUnusable"]
    a._links.info["eth1"] = Interface("eth1", 3, "02:00:00:00:00:02", True)
    a._links.report()
    assert [r.iface for r in caplog.records if getattr(r, "event", "") == "interfaceUsable"] == ["eth1"]
    assert ("eth1", "down") not in _gauge(reg)
    # the names VIPs are given are reported on as well (eth3: up without carrier, a warning)
    a.set_announced({"198.51.100.200": ["eth3"]})
    a._links.report()
    assert {u["iface"]: u["reason"] for u in a.interface_report()["unusable"]}["eth3"] == "noCarrier"


def test_no_eligible_interface_is_reported_when_every_interface_is_asked_for(caplog):
    a, _reg = _announcer(caplog)
    a._links.eligible = []
    a.watch_interfaces([], all_eligible=False)
    assert a.interface_report()["unusable"] == []
    a.watch_interfaces([], all_eligible=True)
    (entry,) = a.interface_report()["unusable"]
    assert entry["iface"] == "*" and entry["reason"] == "noEligible" and "eth2 (enslaved)" in entry["detail"]


def test_a_vip_with_no_interface_to_announce_on_is_not_shown_as_announced(caplog):
    a, _reg = _announcer(caplog)
    a.set_announced({"198.51.100.200": ["eth9"], "198.51.100.201": ["eth0"], "198.51.100.202": []})
    states, _conflicts = a.vip_states()
    assert set(states.values()) == {"announcing"}
    assert a.unanswered() == {"198.51.100.200"}  # fail closed: eth9 is missing, nothing is announced
    assert a.stats()["vips"]["198.51.100.200"]["interfaces"] == []
    rows = [VipRow(ip, "t/s", "default", "n1", True, "", ifs, True)
            for ip, ifs in (("198.51.100.200", ["eth9"]), ("198.51.100.201", ["eth0"]), ("198.51.100.202", []))]
    view = L2View(states, {}, nowhere=a.unanswered())
    shown = {r.ip: r for r in with_l2(rows, view)}
    assert (shown["198.51.100.200"].announcing, shown["198.51.100.200"].reason) == (False, "noUsableInterface")
    assert shown["198.51.100.201"].announcing and shown["198.51.100.202"].announcing
    assert seen_key(rows[0], view) == (False, "noUsableInterface") and seen_key(rows[1], view) == (True, "")
    assert role_of(shown["198.51.100.200"].view()) == "nobody"


def test_status_shows_one_line_per_unusable_interface():
    unusable = [{"iface": "eth9", "reason": "missing", "detail": "no such interface on this node", "since": "T"},
                {"iface": "eth3", "reason": "noCarrier", "detail": "up, but without carrier", "since": "T"}]
    modes = {"l2": {"interfaces": {"unusable": unusable}}, "bgp": {"frr": {}}}
    lines = interface_lines(modes)
    assert lines == ["l2: interface eth9 missing since T: no such interface on this node: nothing is announced on it",
                     "l2: interface eth3 noCarrier since T: up, but without carrier"]
    text = header({"node": "n1", "config": {"state": "ok"}, "modes": modes}, Paint(False))
    assert lines[0] in text.splitlines()
    assert interface_lines({"l2": {"interfaces": {"unusable": []}}}) == []
