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
- ``nocloudlb_speaker_step_errors_total{step}`` failures of each step of the decision thread, each
  behind its own barrier (``publish``, ``health``, ``view``, ``heartbeatPeers``, ``MODE.apply``,
  ``MODE.hook.NAME``, ``status``, ``loop``, ...)
- ``nocloudlb_speaker_fail_closed_bool`` 1 while a failure that persists keeps this node excluded

The listener binds the node's management address by default (``metrics.bind: auto:7472``, "auto"
being memberlist.bind's host), not 0.0.0.0, so /metrics is not reachable through every VIP; it
serves at most MAX_CONNECTIONS scrapes at once, with a read timeout.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import MetricsHandler
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
            ann.add_metric([row["ip"], row["node"], row.get("protocol") or "layer2", row["service"]], 1)
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
        if "quorum" in snap:
            yield GaugeMetricFamily("nocloudlb_speaker_quorum_bool",
                                    "1 while this node is connected to a majority of the cluster's votes (it may "
                                    "take VIPs)", value=1 if snap["quorum"] else 0)
        steps = CounterMetricFamily("nocloudlb_speaker_step_errors", "Failures of a step of the decision thread "
                                    "(each behind its own barrier)", labels=["step"])
        for step, count in sorted({"loop": 0, "view": 0, **snap.get("step_errors", {})}.items()):
            steps.add_metric([step], count)
        yield steps
        yield GaugeMetricFamily("nocloudlb_speaker_fail_closed_bool", "1 while this node publishes itself "
                                "excluded because a step keeps failing", value=1 if snap.get("fail_closed") else 0)
        yield GaugeMetricFamily("nocloudlb_layer2_conflicts_current",
                                "Addresses for which another MAC answered before we announced",
                                value=snap.get("conflicts", 0))


MAX_CONNECTIONS = 8  # concurrent scrapes; more are closed at once (a scraper needs one)
REQUEST_TIMEOUT = 5.0  # seconds a client may take to send its request


class BoundedMetricsServer(ThreadingHTTPServer):
    """/metrics over HTTP with at most ``max_connections`` handler threads and a read timeout: a flood of
    connections (the port is reachable from wherever the bind address is) costs no thread per socket."""

    daemon_threads = True
    request_queue_size = 16

    def __init__(self, addr: tuple[str, int], handler: type, max_connections: int = MAX_CONNECTIONS) -> None:
        self.slots = threading.BoundedSemaphore(max_connections)
        self.refused = 0
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def serve(bind: str, snapshot: Snapshot, registry: CollectorRegistry = REGISTRY,
          max_connections: int = MAX_CONNECTIONS) -> Any:
    """Register the collector and serve /metrics on ``bind`` ("host:port"); returns the server (``shutdown()``)."""
    registry.register(SpeakerCollector(snapshot))
    if not bind:
        return None
    host, dummy, port = bind.rpartition(":")
    handler = type("_Handler", (MetricsHandler.factory(registry),), {"timeout": REQUEST_TIMEOUT,
                                                                     "log_message": lambda *a, **k: None})
    server = BoundedMetricsServer((host.strip("[]") or "0.0.0.0", int(port)), handler, max_connections)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="metrics",
                              daemon=True)
    thread.start()
    return server
