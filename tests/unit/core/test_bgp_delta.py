# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Network-only changes applied as a delta (bgp/delta.py): the pure decision between a delta and a
full reload, the lines sent, and the worker's choice and fallback with a stand-in for FRR (the
netns test drives real bgpd)."""

from __future__ import annotations

import socket
import threading

import pytest
from conftest import bfd, bgpadv, peer, pool, service
from nocloudlb.backoff import Backoff
from nocloudlb.bgp.delta import DeltaApplier, add_lines, additions, structure, switches_differ
from nocloudlb.bgp.frr import FrrError
from nocloudlb.bgp.mode import bgp_metrics
from nocloudlb.bgp.reload import Reloader
from nocloudlb.bgp.render import render
from nocloudlb.bgp.state import BgpState
from nocloudlb.bgp.withdraw import Withdrawer
from nocloudlb.core.bgp import bgp_decision
from nocloudlb.core.election import NodeView
from nocloudlb.core.schema import parse_resources
from prometheus_client import CollectorRegistry

POOL = pool("bgp", "203.0.113.0/26")
POOL6 = pool("v6", "2001:db8:5::/116")
R1 = peer("r1", myASN=64512, peerASN=64500, peerAddress="198.51.100.1")
R2 = peer("r2", myASN=64512, peerASN=64500, peerAddress="198.51.100.2")
ADV = bgpadv("all")


def vips(n: int, first: int = 10, **labels) -> list[dict]:
    return [service(f"s{i}", labels=labels or None, status_ips=[f"203.0.113.{i}"]) for i in range(first, first + n)]


def rendered(docs):
    cfg = parse_resources(docs)
    return render("n1", bgp_decision("n1", [NodeView("n1", {})], cfg), cfg)


def nets(*prefixes: str, family: str = "ipv4") -> dict:
    out: dict = {"ipv4": [], "ipv6": []}
    out[family] = list(prefixes)
    return {("", 64512): out}


BASE = [POOL, R1, ADV]
CASES = {
    # name: (running docs, desired docs, additions or None for a full reload)
    "one VIP added": (BASE + vips(2), BASE + vips(3), nets("203.0.113.12/32")),
    "many VIPs added": (BASE + vips(1), BASE + vips(40), nets(*[f"203.0.113.{i}/32" for i in range(11, 50)])),
    "a VIP removed (the withdrawal went first)": (BASE + vips(3), BASE + vips(2), nets()),
    "first VIP of an empty router": (BASE, BASE + vips(1), None),  # deny-any prefix list becomes the pool's
    "the same config": (BASE + vips(2), BASE + vips(2), nets()),
    "a neighbour added": (BASE + vips(2), [POOL, R1, R2, ADV] + vips(3), None),
    "the peer's ASN": (BASE + vips(2), [POOL, peer("r1", myASN=64512, peerASN=64599, peerAddress="198.51.100.1"),
                                        ADV] + vips(3), None),
    "our ASN": (BASE + vips(2), [POOL, peer("r1", myASN=64513, peerASN=64500, peerAddress="198.51.100.1"),
                                 ADV] + vips(3), None),
    "timers": (BASE + vips(2), [POOL, peer("r1", myASN=64512, peerASN=64500, peerAddress="198.51.100.1",
                                           holdTime="9s", keepaliveTime="3s"), ADV] + vips(2), None),
    "BFD": (BASE + vips(2), [POOL, bfd("fast", receiveInterval=100), ADV,
                             peer("r1", myASN=64512, peerASN=64500, peerAddress="198.51.100.1", bfdProfile="fast")]
            + vips(2), None),
    "a community": (BASE + vips(2), [POOL, R1, bgpadv("all", communities=["64512:7"])] + vips(2), None),
    "a VIP with its own community (its own prefix list)": (
        [POOL, R1, ADV, bgpadv("gold", communities=["64512:9"], serviceSelectors=[{"matchLabels": {"t": "g"}}])]
        + vips(3),
        [POOL, R1, ADV, bgpadv("gold", communities=["64512:9"], serviceSelectors=[{"matchLabels": {"t": "g"}}])]
        + vips(3) + vips(1, first=20, t="g"), None),
    "an address family appears": (BASE + vips(2), [POOL, POOL6, R1, ADV,
                                                   peer("r6", myASN=64512, peerASN=64500, peerAddress="2001:db8:1::1")]
                                  + vips(2), None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_delta_only_when_nothing_but_networks_differs(name):
    before, after, expected = CASES[name]
    running, desired = rendered(before), rendered(after)
    assert additions(running, desired, running.networks) == expected


def test_no_running_config_reloads_and_announced_counts_not_the_text():
    desired = rendered(BASE + vips(3))
    assert additions(None, desired, {}) is None
    # networks withdrawn since the reload (a drain undone): the same text, but they go again
    assert additions(desired, desired, nets("203.0.113.10/32")) == nets("203.0.113.11/32", "203.0.113.12/32")


def test_structure_strips_every_network_line_and_nothing_else():
    text = rendered(BASE + vips(3)).text
    assert "network 203.0.113" in text
    stripped = structure(text)
    assert "  network " not in stripped and " no bgp network import-check" in stripped
    assert [line for line in text.splitlines() if not line.startswith("  network ")] == stripped.splitlines()


@pytest.mark.parametrize("rendered_as, live, differ", [
    ((True, True), (True, True), False),
    ((False, False), (False, False), False),
    ((True, False), (True, False), False),
    ((True, True), (False, True), True),  # NAT needs IPv4 forwarding, the node has it off: a reload turns it on
    ((True, True), (True, False), True),
    ((False, True), (True, True), True),
    ((True, True), None, False),  # unreadable: no reason to reload
])
def test_a_forwarding_switch_to_turn_on_is_a_reload(rendered_as, live, differ):
    cfg = parse_resources(BASE + vips(2))
    text = render("n1", bgp_decision("n1", [NodeView("n1", {})], cfg), cfg, rendered_as).text
    assert switches_differ(text, live) is differ


def test_add_lines_enter_each_router_and_family():
    nets_ = {("", 64512): {"ipv4": ["203.0.113.10/32"], "ipv6": []},
             ("blue", 64513): {"ipv6": ["2001:db8:5::1/128", "2001:db8:5::2/128"]}, ("", 1): {"ipv4": []}}
    assert add_lines(nets_) == [
        "router bgp 64512", "address-family ipv4 unicast", "network 203.0.113.10/32", "exit-address-family", "exit",
        "router bgp 64513 vrf blue", "address-family ipv6 unicast", "network 2001:db8:5::1/128",
        "network 2001:db8:5::2/128", "exit-address-family", "exit"]


class FakeFrr:
    """FRR as the worker sees it: vty answers, reloads and files recorded."""

    def __init__(self, refuse: str = "", fail: bool = False) -> None:
        self.refuse, self.fail = refuse, fail
        self.vty: list[list[str]] = []
        self.reloads: list[str] = []
        self.files: dict[str, str] = {}
        self.conf = "/etc/frr/frr.conf"

    def configure_vty(self, lines, daemon="bgpd", timeout=2.0):
        self.vty.append(list(lines))
        if self.fail:
            raise FrrError("bgpd: [Errno 2] No such file or directory")
        return [(line, 2 if self.refuse and self.refuse in line else 0, "% refused" if self.refuse in line else "")
                for line in lines]

    def forwarding(self):
        return True, True

    def staged(self):
        return "/etc/frr/frr.conf.nocloudlb-new"

    def write(self, text, path=None):
        self.files[path or self.conf] = text
        return path or self.conf

    def test(self, path, timeout=60.0):
        return ""

    def reload(self, path, timeout=60.0):
        self.reloads.append(self.files[path])
        return ""

    def path(self, p):
        return p


def worker(frr: FakeFrr, running_docs, desired_docs):
    st = BgpState("n1")
    running, desired = rendered(running_docs), rendered(desired_docs)
    st.applied, st.announced, st.desired, st.disk = running, running.networks, desired, running.text
    st.forwarding = (True, True)
    st.announced_sure = True  # as after a reload
    withdrawer = Withdrawer(frr, st, Backoff("vtysh", base=0.5))  # type: ignore[arg-type]
    metrics = bgp_metrics(CollectorRegistry())
    rl = Reloader(frr, st, withdrawer, Backoff("frr-reload", base=5.0), metrics, 0.0)  # type: ignore[arg-type]
    return st, rl, metrics, desired


def test_added_networks_go_to_the_vty_socket_then_to_frr_conf_without_a_reload():
    frr = FakeFrr()
    st, rl, metrics, desired = worker(frr, BASE + vips(2), BASE + vips(4))
    rl._apply(desired)
    assert frr.vty == [["router bgp 64512", "address-family ipv4 unicast", "network 203.0.113.12/32",
                        "network 203.0.113.13/32", "exit-address-family", "exit"]]
    assert frr.reloads == [] and frr.files[frr.conf] == desired.text and st.disk == desired.text
    assert st.applied is desired and not st.pending()
    assert (rl.delta_applies, rl.reloads, rl.last_path) == (1, 0, "delta")
    assert metrics["applies"].labels("delta")._value.get() == 1


@pytest.mark.parametrize("frr", [FakeFrr(refuse="203.0.113.13/32"), FakeFrr(fail=True)], ids=["refused", "no socket"])
def test_a_failed_delta_reloads_the_whole_config_and_counts_what_bgpd_may_hold(frr):
    st, rl, metrics, desired = worker(frr, BASE + vips(2), BASE + vips(4))
    rl._apply(desired)
    assert len(frr.vty) == 1 and frr.reloads == [desired.text]
    assert (rl.delta_applies, rl.reloads, rl.last_path) == (0, 1, "reload")
    assert metrics["delta_failures"]._value.get() == 1 and metrics["applies"].labels("reload")._value.get() == 1
    assert st.applied is desired and st.announced == desired.networks


def test_a_failed_delta_whose_reload_fails_too_leaves_everything_tried_to_be_withdrawn():
    frr = FakeFrr(fail=True)
    st, rl, _metrics, desired = worker(frr, BASE + vips(2), BASE + vips(4))

    def refuse(path, timeout=60.0):
        raise FrrError("frr-reload --reload failed")

    frr.reload = refuse  # type: ignore[method-assign]
    rl._apply(desired)
    assert st.reload_error and st.applied is not desired
    assert sorted(st.announced[("", 64512)]["ipv4"]) == [f"203.0.113.{i}/32" for i in range(10, 14)]
    # the decision drops two of them: the withdrawal removes what bgpd may have taken
    st.desired = rendered(BASE + vips(2))
    assert rl.withdrawer.due()
    # bgpd works again, the decision keeps all four: a reload (a delta would take the two counted
    # as announced for sent), then deltas again
    frr.fail = False
    frr.reload = FakeFrr.reload.__get__(frr)  # type: ignore[method-assign]
    rl.backoff.succeeded()
    st.desired = desired
    rl._apply(desired)
    assert frr.reloads == [desired.text] and rl.last_path == "reload" and st.announced_sure
    more = rendered(BASE + vips(5))
    st.desired = more
    rl._apply(more)
    assert rl.last_path == "delta" and frr.vty[-1][2:-2] == ["network 203.0.113.14/32"]


def test_forwarding_off_where_the_config_wants_it_on_reloads_instead_of_a_delta():
    frr = FakeFrr()
    frr.forwarding = lambda: (False, True)  # type: ignore[method-assign]
    st, rl, _m, desired = worker(frr, BASE + vips(2), BASE + vips(3))
    st.config = None  # no re-render: the NAT Backends' need keeps the switch rendered on
    rl._apply(desired)
    assert frr.vty == [] and frr.reloads == [desired.text] and rl.last_path == "reload"


def test_a_structural_change_reloads_and_delta_off_reloads_everything():
    frr = FakeFrr()
    _st, rl, _m, desired = worker(frr, BASE + vips(2), [POOL, R1, R2, ADV] + vips(3))
    rl._apply(desired)
    assert frr.vty == [] and frr.reloads == [desired.text] and rl.last_path == "reload"
    frr2 = FakeFrr()
    _st, rl2, _m, desired2 = worker(frr2, BASE + vips(2), BASE + vips(3))
    rl2.delta = False
    rl2._apply(desired2)
    assert frr2.vty == [] and frr2.reloads == [desired2.text]


def test_a_delta_a_newer_config_withdraws_from_is_dropped():
    frr = FakeFrr()
    st, _rl, _m, desired = worker(frr, BASE + vips(2), BASE + vips(4))
    st.desired = rendered(BASE + vips(1))  # a drain came in meanwhile
    assert DeltaApplier(frr, st, Withdrawer(frr, st, Backoff("vtysh", base=0.5))).apply(desired) == "dropped"  # type: ignore[arg-type]
    assert frr.vty == [] and frr.files == {}
    rl = Reloader(frr, st, Withdrawer(frr, st, Backoff("vtysh", base=0.5)), Backoff("frr-reload", base=5.0),  # type: ignore[arg-type]
                  bgp_metrics(CollectorRegistry()), 0.0)
    applied_before = st.applied
    rl._apply(desired)  # neither applied nor reloaded: the worker's next round takes the newer config
    assert st.applied is applied_before and (rl.delta_applies, rl.reloads) == (0, 0) and frr.reloads == []


def test_the_lock_is_held_while_the_lines_go():
    frr = FakeFrr()
    st, _rl, _m, desired = worker(frr, BASE + vips(2), BASE + vips(3))
    seen: list[bool] = []
    inner = frr.configure_vty

    def watched(lines, daemon="bgpd", timeout=2.0):
        seen.append(st.frr_lock.locked())
        return inner(lines, daemon, timeout)

    frr.configure_vty = watched  # type: ignore[method-assign]
    applier = DeltaApplier(frr, st, Withdrawer(frr, st, Backoff("vtysh", base=0.5)))  # type: ignore[arg-type]
    t = threading.Thread(target=applier.apply, args=(desired,))
    t.start()
    t.join(5)
    assert seen == [True]


def fake_daemon(srv, stop: threading.Event) -> None:
    """A vty socket (``srv``, listening) that answers each NUL-terminated command (read in small pieces)
    in turn: ``% refused`` with status 2 for a command holding "bad", else nothing with status 0."""
    srv.settimeout(5)
    conn, _addr = srv.accept()
    buf = b""
    while not stop.is_set():
        chunk = conn.recv(7)  # commands split across reads, several in one read
        if not chunk:
            break
        buf += chunk
        while b"\0" in buf:
            cmd, buf = buf.split(b"\0", 1)
            conn.sendall((b"% refused\n\0\0\0\2") if b"bad" in cmd else b"\0\0\0\0")
    conn.close()
    srv.close()


def test_vty_lines_go_in_batches_and_each_keeps_its_own_answer(tmp_path):
    from nocloudlb.bgp.frr import VtySession  # noqa: PLC0415

    path = str(tmp_path / "bgpd.vty")
    stop = threading.Event()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)  # listening before the session connects (a socket file alone refuses connections)
    t = threading.Thread(target=fake_daemon, args=(srv, stop), daemon=True)
    t.start()
    lines = [f"network 2001:db8:5::{i:x}/128" for i in range(450)]
    lines[201] = "bad line"
    with VtySession(path, "bgpd", 5.0) as vty:
        answers = vty.ask_many(lines, batch=200)
    stop.set()
    assert len(answers) == 450
    assert [i for i, (status, _text) in enumerate(answers) if status] == [201]
    assert answers[201] == (2, "% refused\n") and answers[200] == (0, "")


def test_union_keeps_order_and_each_network_once_in_linear_time():
    from nocloudlb.bgp.state import union  # noqa: PLC0415

    a = {("", 1): {"ipv4": ["a", "b", "b"]}}
    b = {("", 1): {"ipv4": ["c", "a"], "ipv6": ["x"]}, ("v", 2): {"ipv4": []}}
    assert union(a, b) == {("", 1): {"ipv4": ["a", "b", "c"], "ipv6": ["x"]}, ("v", 2): {"ipv4": []}}
    big = [f"2001:db8:5::{i:x}/128" for i in range(20000)]
    assert union({("", 1): {"ipv6": big[:11000]}}, {("", 1): {"ipv6": big[1000:]}})[("", 1)]["ipv6"] == big


def test_a_failed_withdrawal_makes_the_next_change_a_reload():
    frr = FakeFrr(fail=True)

    def vtysh_refuses(lines, timeout=5.0):
        raise FrrError("vtysh: % bgpd is not running")

    frr.configure = vtysh_refuses  # type: ignore[attr-defined]
    st, rl, _m, _desired = worker(frr, BASE + vips(3), BASE + vips(2))
    rl.withdrawer.withdraw(st.desired.networks)  # type: ignore[union-attr]
    assert not st.announced_sure and rl.withdrawer.backoff.failures == 1
    frr.fail = False
    later = rendered(BASE + vips(4))
    st.desired = later
    rl._apply(later)
    assert rl.last_path == "reload" and frr.reloads == [later.text]
