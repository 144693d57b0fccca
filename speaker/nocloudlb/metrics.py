"""Prometheus metrics of the speaker, named after MetalLB's with the ``nocloudlb_`` prefix.

The layer-2 counters (``nocloudlb_layer2_*``) are registered by ``nocloudlb.l2.metrics`` in
the default registry; this module adds, read from the daemon at scrape time:

- ``nocloudlb_speaker_announced{ip,node,protocol,service}`` 1 per VIP this node announces
- ``nocloudlb_config_loaded_bool`` 1 when the last load of the config file succeeded
- ``nocloudlb_config_stale_bool`` 1 when the speaker serves an older config than the file's
- ``nocloudlb_memberlist_members{state}`` members by state as this node sees them
- ``nocloudlb_memberlist_<counter>_total`` kinship's protocol counters (probes, suspicions,
  decrypt failures, ...) and ``nocloudlb_memberlist_local_health``
- ``nocloudlb_layer2_conflicts_current`` addresses another MAC answers for
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

Snapshot = Callable[[], dict[str, Any]]


class SpeakerCollector(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        snap = self.snapshot()
        ann = GaugeMetricFamily("nocloudlb_speaker_announced", "Services being announced from this node",
                                labels=["ip", "node", "protocol", "service"])
        for row in snap.get("announced", []):
            ann.add_metric([row["ip"], row["node"], "layer2", row["service"]], 1)
        yield ann
        yield GaugeMetricFamily("nocloudlb_config_loaded_bool", "1 if the config file was loaded without errors",
                                value=1 if snap.get("config_ok") else 0)
        yield GaugeMetricFamily("nocloudlb_config_stale_bool",
                                "1 if running on a stale config because the latest one failed to load",
                                value=1 if snap.get("config_stale") else 0)
        mem = GaugeMetricFamily("nocloudlb_memberlist_members", "Cluster members as this node sees them",
                                labels=["state"])
        counts = snap.get("members", {})
        for state in ("alive", "suspect", "dead", "left"):
            mem.add_metric([state], counts.get(state, 0))
        yield mem
        stats = snap.get("kinship", {})
        for key, value in sorted(stats.items()):
            if key == "local_health":
                yield GaugeMetricFamily("nocloudlb_memberlist_local_health", "Lifeguard local health score",
                                        value=value)
            else:
                yield CounterMetricFamily(f"nocloudlb_memberlist_{key}", f"kinship counter {key}", value=value)
        yield GaugeMetricFamily("nocloudlb_layer2_conflicts_current",
                                "Addresses for which another MAC answered before we announced",
                                value=snap.get("conflicts", 0))


def serve(bind: str, snapshot: Snapshot, registry: CollectorRegistry = REGISTRY) -> Any:
    """Register the collector and serve /metrics on ``bind`` ("host:port"); returns the server."""
    registry.register(SpeakerCollector(snapshot))
    if not bind:
        return None
    host, dummy, port = bind.rpartition(":")
    server, dummy_thread = start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0", registry=registry)
    return server
