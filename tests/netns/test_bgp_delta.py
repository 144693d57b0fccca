"""The BGP mode against real bgpd (FRR 8.4, frr_harness.py): a change of networks only reaches
the router as ``network`` lines on bgpd's vty socket, with no frr-reload run; a structural change
(a community) still reloads; a delta bgpd does not take falls back to the reload and the router
ends with every prefix all the same.

Node n1 runs zebra and bgpd driven by a ``BgpMode`` in this process (its FrrControl enters n1's
namespaces, as a speaker's would be on a node); router n2 runs zebra and bgpd as a plain eBGP
peer. Every check reads the router's table."""

from __future__ import annotations

import logging
import time

import pytest
from frr_harness import FrrHost, frr_image, router_lines
from nocloudlb.bgp.frr import FrrControl, FrrError
from nocloudlb.bgp.mode import BgpMode
from nocloudlb.core.election import NodeView
from nocloudlb.core.schema import parse_resources
from prometheus_client import CollectorRegistry

IMAGE = frr_image()
pytestmark = pytest.mark.skipif(IMAGE is None, reason="no lab base image with FRR (roles/lab/files/labctl.py)")

NODE, ROUTER = "198.51.100.11", "198.51.100.12"


@pytest.fixture
def netns_prefix() -> str:
    return "nbd"


class CountingFrr(FrrControl):
    """FrrControl that records every command it runs; ``break_adds`` makes the vty session that
    adds networks fail (a socket gone)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.commands: list[list[str]] = []
        self.break_adds = False

    def run(self, args, timeout=30.0, input_text=None):
        self.commands.append(list(args))
        return super().run(args, timeout, input_text)

    def configure_vty(self, lines, daemon="bgpd", timeout=2.0):
        if self.break_adds and any(line.startswith("network ") for line in lines):
            raise FrrError("bgpd: [Errno 2] No such file or directory")
        return super().configure_vty(lines, daemon, timeout)

    def reload_runs(self) -> int:
        return sum(1 for c in self.commands if any("frr-reload" in a for a in c) and "--reload" in c)


def docs(n: int, communities: tuple[str, ...] = ()):
    out = [{"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "v4"},
            "spec": {"addresses": ["203.0.113.0/24"]}},
           {"apiVersion": "metallb.io/v1beta2", "kind": "BGPPeer", "metadata": {"name": "r1"},
            "spec": {"myASN": 64512, "peerASN": 64500, "peerAddress": ROUTER, "connectTime": "1s"}},
           {"apiVersion": "metallb.io/v1beta1", "kind": "BGPAdvertisement", "metadata": {"name": "all"},
            "spec": {"ipAddressPools": ["v4"], **({"communities": list(communities)} if communities else {})}}]
    for i in range(n):
        out.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"s{i}", "namespace": "t"},
                    "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
                    "status": {"loadBalancer": {"ingress": [{"ip": f"203.0.113.{10 + i}"}]}}})
    return parse_resources(out)


def wait_for(pred, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


@pytest.fixture
def bgp(make_segment):
    seg = make_segment(hosts=2, client=False)
    assert IMAGE is not None
    hosts = [FrrHost(seg, seg.hosts[0].ns, "n1", IMAGE), FrrHost(seg, seg.hosts[1].ns, "r1", IMAGE)]
    mode = None
    try:
        node, router = hosts
        node.start()
        router.start()
        router.vtysh(*router_lines(64500, {NODE: 64512}))
        frr = CountingFrr(prefix=list(node.prefix), root=node.root)
        registry = CollectorRegistry()
        mode = BgpMode("n1", frr, debounce=0.05, retry=0.5, registry=registry)
        mode.start()
        yield mode, frr, registry, router
    finally:
        if mode is not None:
            mode.close()
        for h in hosts:
            h.close()


def apply(mode: BgpMode, cfg) -> None:
    mode.apply("n1", [NodeView("n1", {})], cfg)
    assert mode.wait_applied(60), mode.status()["config"]


def applies(registry: CollectorRegistry, path: str) -> float:
    return registry.get_sample_value("nocloudlb_bgp_config_applies_total", {"path": path}) or 0.0


def test_added_networks_reach_the_router_without_a_reload_and_structure_still_reloads(bgp, caplog):
    mode, frr, registry, router = bgp
    caplog.set_level(logging.INFO, logger="nocloudlb.bgp")
    apply(mode, docs(2))  # the first config: nothing runs yet, a full reload
    assert wait_for(lambda: router.received(NODE) == 2, 30), router.vtysh("show bgp ipv4 unicast summary")
    assert (applies(registry, "reload"), applies(registry, "delta")) == (1, 0)
    reloads = frr.reload_runs()
    since = len(frr.commands)

    apply(mode, docs(60))  # 58 more VIPs: the same pool-wide prefix list, only network lines differ
    assert wait_for(lambda: router.received(NODE) == 60, 30), router.vtysh("show bgp ipv4 unicast summary")
    assert frr.reload_runs() == reloads, "a network-only change ran frr-reload"
    assert not any("frr-reload" in a or "vtysh" in a for c in frr.commands[since:] for a in c), frr.commands[since:]
    assert (applies(registry, "reload"), applies(registry, "delta")) == (1, 1)
    status = mode.status()["config"]
    assert (status["lastPath"], status["deltas"], status["reloads"]) == ("delta", 1, 1)
    assert any(getattr(r, "event", "") == "frrDeltaApplied" for r in caplog.records)
    table = router.table()
    assert sorted(table) == sorted(f"203.0.113.{10 + i}/32" for i in range(60))
    with open(frr.path(frr.conf), encoding="utf-8") as fh:  # a bgpd that restarts reads the same
        on_disk = fh.read()
    assert on_disk.count("  network 203.0.113.") == 60 and on_disk == mode.rendered().text  # type: ignore[union-attr]

    apply(mode, docs(40))  # a withdrawal (vty, at once), then a delta with nothing to add
    assert wait_for(lambda: router.received(NODE) == 40, 30)
    assert frr.reload_runs() == reloads and applies(registry, "delta") == 2

    apply(mode, docs(40, communities=("64512:7",)))  # structural: the route-map changes
    assert wait_for(lambda: "Community: 64512:7" in router.vtysh("show bgp ipv4 unicast 203.0.113.10/32"), 30), \
        router.vtysh("show bgp ipv4 unicast 203.0.113.10/32")
    assert frr.reload_runs() == reloads + 1 and applies(registry, "reload") == 2
    assert mode.status()["config"]["lastPath"] == "reload"
    assert router.received(NODE) == 40


def test_a_failed_delta_falls_back_to_the_full_reload(bgp):
    mode, frr, registry, router = bgp
    apply(mode, docs(2))
    assert wait_for(lambda: router.received(NODE) == 2, 30)
    frr.break_adds = True
    apply(mode, docs(30))
    assert wait_for(lambda: router.received(NODE) == 30, 30), router.vtysh("show bgp ipv4 unicast summary")
    assert registry.get_sample_value("nocloudlb_bgp_delta_failures_total") == 1
    assert (applies(registry, "reload"), applies(registry, "delta")) == (2, 0)
    frr.break_adds = False
    apply(mode, docs(31))
    assert wait_for(lambda: router.received(NODE) == 31, 30)
    assert applies(registry, "delta") == 1
