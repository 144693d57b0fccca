"""The operator's settings of the BGP flow handover's rate limit: ``bgp.flowHandover`` in the
speaker's config file (core: schema.parse_flow_handover), checked with errors that name the field
and the value, carried to the mode's nft rules (loaded by the real nft: test_bgp_flows.py)."""

from __future__ import annotations

import pytest
from nocloudlb.bgp.flows import DEFAULT_RATE, Peer, flow_rules
from nocloudlb.bgp.mode import BgpMode
from nocloudlb.config import parse
from nocloudlb.core.errors import ConfigError
from nocloudlb.core.schema import FLOW_HANDOVER_RATE, parse_flow_handover
from test_speaker_config_state import base


@pytest.mark.parametrize("value, want", [
    (None, (20000, 20000)), ({}, (20000, 20000)), ({"rate": 5000}, (5000, 5000)),
    ({"rate": 5000, "burst": 100}, (5000, 100)), ({"burst": 40000}, (20000, 40000)),
])
def test_good_settings(value, want):
    rate, burst, errors = parse_flow_handover(value)
    assert (rate, burst) == want and errors == []


@pytest.mark.parametrize("value, error", [
    ({"rate": 0}, 'bgp.flowHandover.rate: "0" must be a whole number of segments per second from 100 to 10000000'),
    ({"rate": 99}, 'bgp.flowHandover.rate: "99" must be'),
    ({"rate": 2.5}, 'bgp.flowHandover.rate: "2.5" must be a whole number'),
    ({"rate": True}, 'bgp.flowHandover.rate: "True" must be'),
    ({"rate": "fast"}, 'bgp.flowHandover.rate: "fast" must be'),
    ({"burst": 0}, 'bgp.flowHandover.burst: "0" must be a whole number of segments from 1 to 10000000'),
    ({"burst": 10**8}, 'bgp.flowHandover.burst: "100000000" must be'),
    ({"limit": 5}, 'bgp.flowHandover: unknown key "limit" (known: burst, rate)'),
    ([20000], 'bgp.flowHandover: must be a mapping like {rate: 20000, burst: 20000}, got "[20000]"'),
])
def test_bad_settings_name_the_field_and_the_value(value, error):
    errors = parse_flow_handover(value)[2]
    assert len(errors) == 1 and errors[0].startswith(error), errors


def test_the_speaker_config_carries_them_to_the_mode_rules():
    cfg = parse(base(bgp={"flowHandover": {"rate": 3000, "burst": 500}}))
    assert (cfg.flow_rate, cfg.flow_burst) == (3000, 500)
    mode = BgpMode("n1", flow_peers=["198.51.100.12"], flow_rate=cfg.flow_rate, flow_burst=cfg.flow_burst,
                   registry=None)
    assert mode.flows.status()["rate"] == 3000 and mode.flows.status()["burst"] == 500
    rules = flow_rules(["203.0.113.10"], [Peer("198.51.100.12", "02:00:00:00:00:02", "eth0")],
                       mode.flows.rate, mode.flows.burst)
    assert "limit rate 3000/second burst 500 packets" in rules
    default = parse(base())
    assert (default.flow_rate, default.flow_burst) == (FLOW_HANDOVER_RATE, FLOW_HANDOVER_RATE) == (DEFAULT_RATE,) * 2


@pytest.mark.parametrize("bgp, error", [
    ({"flowHandover": {"rate": -1}}, "bgp.flowHandover.rate"),
    ({"flowhandover": {}}, "bgp: must be a mapping like"),
    ("fast", "bgp: must be a mapping like"),
])
def test_the_speaker_config_refuses_bad_settings(bgp, error):
    with pytest.raises(ConfigError) as info:
        parse(base(bgp=bgp))
    assert any(e.startswith(error) for e in info.value.errors), info.value.errors
