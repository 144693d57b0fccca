"""Issue 8, section 5: Local-policy services sharing one address must agree on what decides health.

``address_allocate`` never put two Local services with different health checks on one address
(tests/unit/core/test_allocation.py, since the allocator's first commit), so its test passed
on every commit: it could not show the gap. The gap was the speaker: it takes the addresses
as written in ``status.loadBalancer.ingress`` and elects one leader per (service, address).
Two Local services on one address with different checks are healthy on different nodes, so
each elects its own leader for the one VIP: two owners. The speaker (``nocloudlb validate``
and every reload) now refuses such a file with MetalLB's checkSharing reason.

Shown to fail before the fix: on main at 8b916d6 (before ``held_address_problems``),
``test_validate_and_reload_refuse_local_services_that_disagree_on_the_check`` fails at
``assert not ok`` (the file was accepted) and so do the Cluster/Local and port cases;
``test_without_the_check_one_address_gets_two_leaders`` passes there and here (it shows why).
"""

from __future__ import annotations

import pytest
import yaml
from nocloudlb.core.election import NodeView, layer2_decision
from nocloudlb.core.schema import parse_resources
from nocloudlb.daemon import Speaker, validate
from test_speaker_config_state import L2, POOL, base, svc

IP = "198.51.100.200"
HC = "nocloud.io/health-check"
SHARE = "metallb.io/allow-shared-ip"
HC1 = "tcp://127.0.0.1:8080"
HC1_SPELLED_OTHERWISE = '{"port": 8080, "type": "tcp"}'
HC2 = "tcp://127.0.0.1:8081"


def shared(name: str, port: int, policy: str = "Local", check: str | None = None, key: str = "k") -> dict:
    ann = {SHARE: key}
    if check is not None:
        ann[HC] = check
    doc = svc(name, IP, policy, ann)
    doc["spec"]["ports"] = [{"port": port, "protocol": "TCP"}]
    return doc


def write(tmp_path, *services) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(base(resources=[POOL, L2, *services])))
    return str(path)


def test_without_the_check_one_address_gets_two_leaders():
    """Why the speaker must refuse: each service elects its own leader for the same address."""
    parsed = parse_resources([POOL, L2, shared("a", 80, check=HC1), shared("b", 81, check=HC2)])
    nodes = [NodeView(f"n{i}", {}, "alive", frozenset({"prod/a"} if i % 2 else {"prod/b"})) for i in range(1, 7)]
    leaders = {layer2_decision("n1", nodes, parsed.l2_advertisements, s, IP)[0] for s in parsed.services}
    assert len(leaders) == 2  # one node healthy for a only, another for b only: both announce IP


@pytest.mark.parametrize(
    ("first", "second", "reason"),
    [
        (shared("a", 80, check=HC1), shared("b", 81, check=HC2),
         'can\'t change sharing key for "prod/b", address also in use by prod/a'),
        (shared("a", 80, check=HC1), shared("b", 81),  # no check at all: healthy everywhere
         'can\'t change sharing key for "prod/b", address also in use by prod/a'),
        (shared("a", 80, policy="Cluster"), shared("b", 81, check=HC1),
         'can\'t change sharing key for "prod/b", address also in use by prod/a'),
        (shared("a", 80, check=HC1), shared("b", 81, check=HC1, key="other"),
         'can\'t change sharing key for "prod/b", address also in use by prod/a'),
        (shared("a", 80, check=HC1), shared("b", 80, check=HC1),
         f'port TCP/80 is already in use on "{IP}"'),
    ],
    ids=["other-check", "no-check", "cluster-and-local", "other-key", "same-port"],
)
def test_validate_and_reload_refuse_local_services_that_disagree_on_the_check(tmp_path, first, second, reason):
    good = write(tmp_path, first)
    sp = Speaker(good)
    ok, cfg = sp._load()
    assert ok and cfg is not None
    sp.cfg = cfg
    path = write(tmp_path, first, second)
    ok, errors = validate(path)
    assert not ok
    assert errors == [f"Service prod/b: status.loadBalancer.ingress {IP}: {reason}"]
    ok2, cfg2 = sp._load()  # a reload refuses the same file and keeps the last good config
    assert not ok2 and cfg2 is cfg and sp.holder.errors == errors


def test_the_same_check_spelled_otherwise_shares(tmp_path):
    ok, errors = validate(write(tmp_path, shared("a", 80, check=HC1), shared("b", 81, check=HC1_SPELLED_OTHERWISE),
                                shared("c", 82, policy="Local")))
    # a and b agree (the same check once parsed); c has none, so it is refused, and only c
    assert not ok and errors == [
        f'Service prod/c: status.loadBalancer.ingress {IP}: can\'t change sharing key for "prod/c", '
        "address also in use by prod/a,prod/b"]
    ok, errors = validate(write(tmp_path, shared("a", 80, check=HC1), shared("b", 81, check=HC1_SPELLED_OTHERWISE)))
    assert ok, errors
