"""Issue 10 (scale), the layer-2 decision at size: the grouped election equals ``layer2_decision`` VIP by
VIP; the decision runs only on change (a tick, a reload of the same file, an event that moves nothing
send nothing and re-announce nothing)."""

from __future__ import annotations

import logging
import random

import pytest
from inproc_speaker import announcer_of, decided, pool_docs, service_doc, vips_led, wait_for
from nocloudlb.core.election import DRAIN_LABEL, NodeView, layer2_decision
from nocloudlb.core.schema import parse_resources
from nocloudlb.l2.election import Election

pytestmark = pytest.mark.timeout(90)

NODES = ["n1", "n2", "n3", "n4"]


def random_config(rng: random.Random):
    docs: list[dict] = [
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "a"},
         "spec": {"addresses": ["198.51.100.0/25"]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "b"},
         "spec": {"addresses": ["198.51.100.128/25"]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "c"},
         "spec": {"addresses": ["203.0.113.0/24"]}},  # no advertisement
    ]
    for i in range(rng.randint(1, 3)):
        spec: dict = {"ipAddressPools": rng.sample(["a", "b"], rng.randint(1, 2))}
        if rng.random() < 0.5:
            spec["nodeSelectors"] = [{"matchLabels": {"zone": rng.choice("xy")}}]
        if rng.random() < 0.3:
            spec["serviceSelectors"] = [{"matchLabels": {"tier": "web"}}]
        if rng.random() < 0.3:
            spec["interfaces"] = [rng.choice(["eth0", "eth1"])]
        if rng.random() < 0.3:
            spec["preferredNodeSelectors"] = [{"weight": rng.randint(1, 50),
                                               "preference": {"matchLabels": {"zone": rng.choice("xy")}}}]
        docs.append({"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement",
                     "metadata": {"name": f"l2-{i}"}, "spec": spec})
    ips = rng.sample([f"198.51.100.{i}" for i in range(256)] + [f"203.0.113.{i}" for i in range(5)], 40)
    for i, ip in enumerate(ips):
        doc = service_doc(f"s{i}", ip, rng.choice(["Cluster", "Local"]))
        if rng.random() < 0.5:
            doc["metadata"]["labels"] = {"tier": rng.choice(["web", "db"])}
        docs.append(doc)
    return parse_resources(docs)


def random_view(rng: random.Random, services: list[str]) -> list[NodeView]:
    out = []
    for name in rng.sample(NODES, rng.randint(1, 4)):
        labels = {"zone": rng.choice("xy")}
        if rng.random() < 0.2:
            labels[DRAIN_LABEL] = ""
        healthy = frozenset(s for s in services if rng.random() < 0.7)
        out.append(NodeView(name, labels, rng.choice(["alive", "alive", "suspect", "dead", "left"]), healthy))
    return out


def test_grouped_election_equals_layer2_decision():
    rng = random.Random(10)
    for _round in range(60):
        parsed = random_config(rng)
        election = Election()
        keys = [s.key for s in parsed.services]
        for _view in range(4):  # the same Election across views: its cached hash orders stay right
            nodes = random_view(rng, keys)
            me = rng.choice(NODES)
            for ip, skey, pool, leader, reason, _g in election.decide(me, nodes, parsed):
                svc = parsed.service(skey)
                if pool is None:
                    assert reason == "notInAnyPool" and parsed.pool_for_ip(ip) is None
                    continue
                want = layer2_decision(me, nodes, parsed.l2_advertisements_for_pool(pool), svc, ip)
                assert (leader, reason) == want, (ip, me, nodes)


def two_nodes(harness, n_per_node: int = 3, node_selectors: list | None = None):
    vips = vips_led(["s", "p"], n_per_node)
    docs = pool_docs(node_selectors) + [service_doc(f"svc{i}", ip) for i, ip in enumerate(sorted(vips))]
    sp = harness.speaker("s", docs, join=["p"], labels={"zone": "a"})
    peer = harness.peer("p", sp.codec.encode({"zone": "a"}, []), join=["s"])
    decided(sp, {"s", "p"})
    return sp, peer, vips


def test_ticks_and_a_reload_of_the_same_file_do_no_work_and_send_nothing(harness):
    sp, _peer, vips = two_nodes(harness)
    led = {ip for ip, n in vips.items() if n == "s"}
    assert set(sp.journal.announced()) == led
    applies, entries = sp.l2.applies, len(sp.journal)
    for _tick in range(5):  # what the 1 s tick does
        sp._iteration(["tick"])
    assert sp.l2.applies == applies, "the election ran again with nothing changed"
    out = sp.reload()  # SIGHUP, the file untouched
    assert out["ok"] and sp.holder.unchanged
    sp._iteration(["tick"])
    assert sp.l2.applies == applies and len(sp.journal) == entries, sp.journal[entries:]
    # a changed label is a change: the decision runs again (and withdraws everything here)
    sp.labels.update({DRAIN_LABEL: ""})
    sp._iteration(["change"])
    assert sp.l2.applies == applies + 1 and sp.journal.announced() == {}


def test_an_unrelated_member_joining_moves_nothing_and_reannounces_nothing(harness):
    """A member no advertisement selects joins: the view changes (the decision runs), but no VIP moves,
    so nothing is announced, withdrawn or re-announced."""
    sp, _peer, vips = two_nodes(harness, node_selectors=[{"matchLabels": {"zone": "a"}}])
    led = {ip for ip, n in vips.items() if n == "s"}
    assert set(sp.journal.announced()) == led
    entries, applies = len(sp.journal), sp.l2.applies
    harness.peer("q", sp.codec.encode({"zone": "b"}, []), join=["s"])
    wait_for(lambda: "q" in {m.name for m in sp.membership.members() if m.state == "alive"}, 10, "q joins")
    sp._iteration(["change", "heal\tmemberJoined\tq"])
    assert sp.l2.applies > applies
    assert sp.journal[entries:] == [], sp.journal[entries:]


def test_a_vip_the_announcer_takes_late_is_logged_announced_on_a_later_tick(harness, caplog):
    """Work only on change must not lose the log: a VIP won while the announcer has not picked it up yet
    (l2Pending) is logged ``serviceAnnounced`` once it answers, though nothing else changed since."""
    caplog.set_level(logging.DEBUG)
    vips = vips_led(["s", "p"], 2)
    docs = pool_docs() + [service_doc(f"svc{i}", ip) for i, ip in enumerate(sorted(vips))]
    sp = harness.speaker("s", docs, join=["p"], labels={"zone": "a"})
    ann = announcer_of(sp)
    pending = {"on": True}
    real_stats = ann.stats

    def stats() -> dict:
        out = real_stats()
        if pending["on"]:
            out["vips"] = {ip: {"state": "", "interfaces": v["interfaces"]} for ip, v in out["vips"].items()}
        return out

    ann.stats = stats  # type: ignore[method-assign]
    harness.peer("p", sp.codec.encode({"zone": "a"}, []), join=["s"])
    decided(sp, {"s", "p"})
    led = {ip for ip, n in vips.items() if n == "s"}
    assert set(ann.current) == led

    def announced() -> set[str]:
        return {r.fields["ip"] for r in caplog.records if getattr(r, "event", "") == "serviceAnnounced"}

    assert announced() == set()  # not answered yet: not logged as announced
    pending["on"] = False  # the announcer answers now; nothing else changes
    sp._iteration(["tick"])
    assert announced() == led
