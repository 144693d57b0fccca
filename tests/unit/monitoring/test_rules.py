"""The Prometheus rules and Grafana dashboard in monitoring/: every metric they name is one
the speaker really exports (read from its collectors, not from a list), and promtool
loads the rules and runs their unit tests (monitoring/prometheus/nocloudlb.rules.test.yml)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from nocloudlb.backoff import Backoff, backoff_metrics
from nocloudlb.l2.metrics import l2_metrics
from nocloudlb.metrics import SpeakerCollector
from prometheus_client import CollectorRegistry, generate_latest

ROOT = Path(__file__).resolve().parents[3]
MON = ROOT / "monitoring"
RULES = MON / "prometheus" / "nocloudlb.rules.yml"
NAME = re.compile(r"\b(nocloudlb_[a-z0-9_]+|up)\b(?!\s*\()")
# written by monitoring/vip-probe.yml (checked below), and BGP mode's session gauge, which
# mirrors MetalLB's metallb_bgp_session_up and lands with the BGP speaker
OTHER_SOURCES = {"nocloudlb_vip_answering_macs": MON / "vip-probe.yml",
                 # the data plane's collector needs nft and its tables (tests/netns reads it)
                 "nocloudlb_dataplane_services_refused": ROOT / "speaker" / "nocloudlb" / "dataplane" / "mode.py"}
PENDING = {"nocloudlb_bgp_session_up"}


def exported() -> set[str]:
    reg = CollectorRegistry()
    m = l2_metrics(reg)
    for c in (m.requests_received, m.responses_sent, m.gratuitous_sent, m.conflicts):
        c.labels(ip="198.51.100.200").inc()
    snap = {"announced": [{"ip": "198.51.100.200", "node": "n1", "service": "prod/web"}], "config_ok": True,
            "config_stale": False, "members": {"alive": 3}, "kinship": {"local_health": 0, "probes_sent": 1},
            "conflicts": 0}
    reg.register(SpeakerCollector(lambda: snap))
    backoff_metrics(reg).add(Backoff("frr-reload")).failed("refused")
    names = set()
    for line in generate_latest(reg).decode().splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names | {"up"}


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [(r["alert"], r["expr"]) for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads((MON / "grafana" / "nocloudlb.json").read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


@pytest.mark.parametrize("where", ["rules", "dashboard"])
def test_every_metric_named_is_exported(where):
    real = exported()
    assert {"nocloudlb_speaker_announced", "nocloudlb_layer2_conflicts_current",
            "nocloudlb_layer2_responses_sent_total", "nocloudlb_memberlist_members"} <= real
    for name, source in OTHER_SOURCES.items():
        assert name in source.read_text(), f"{name} is not written by {source}"
    known = real | set(OTHER_SOURCES) | PENDING
    exprs = rule_exprs() if where == "rules" else dashboard_exprs()
    assert exprs
    for what, expr in exprs:
        names = {n for n in NAME.findall(expr) if n.startswith("nocloudlb_") or n == "up"}
        assert names, f"{what}: names no metric"
        unknown = names - known
        assert not unknown, f"{what}: {sorted(unknown)} not exported by the speaker ({expr})"


def test_the_alerts_the_operator_needs_are_there():
    alerts = {a for a, _e in rule_exprs()}
    assert {"NocloudlbVipTwoOwners", "NocloudlbVipNoOwner", "NocloudlbAddressConflict",
            "NocloudlbVipAnsweredByTwoMacs", "NocloudlbMembershipBelowQuorum", "NocloudlbConfigRefused",
            "NocloudlbBgpSessionDown"} <= alerts


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_promtool_checks_and_unit_tests_the_rules():
    for args in (["check", "rules", RULES.name], ["test", "rules", "nocloudlb.rules.test.yml"]):
        proc = subprocess.run(["promtool", *args], cwd=RULES.parent, capture_output=True, text=True, timeout=120,
                              check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS" in proc.stdout + proc.stderr
