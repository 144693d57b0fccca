"""Prometheus counters of the layer-2 responders, named after MetalLB's (metallb_layer2_*).

prometheus_client exposes counters with a ``_total`` suffix, so the scraped series are
e.g. ``nocloudlb_layer2_requests_received_total{ip="..."}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


@dataclass
class L2Metrics:
    requests_received: Counter
    responses_sent: Counter
    gratuitous_sent: Counter
    conflicts: Counter
    responder_up: Gauge
    responder_restarts: Counter
    lease_expired: Counter
    lease_remaining: Gauge
    interface_unusable: Gauge


# id(registry) -> (registry, its counters): the registry is kept, so that its id is never reused by
# another registry (a test's short-lived one) that would then be handed counters it does not hold
_by_registry: dict[int, tuple[CollectorRegistry | None, L2Metrics]] = {}


def l2_metrics(registry: CollectorRegistry | None = REGISTRY) -> L2Metrics:
    """The layer-2 counters registered once in ``registry`` (None: unregistered, for tests)."""
    key = id(registry)
    if key not in _by_registry or _by_registry[key][0] is not registry:
        _by_registry[key] = registry, L2Metrics(
            Counter("nocloudlb_layer2_requests_received", "Number of layer2 requests received for owned IPs",
                    ["ip"], registry=registry),
            Counter("nocloudlb_layer2_responses_sent", "Number of layer2 responses sent for owned IPs",
                    ["ip"], registry=registry),
            Counter("nocloudlb_layer2_gratuitous_sent", "Number of gratuitous layer2 packets sent for owned IPs",
                    ["ip"], registry=registry),
            Counter("nocloudlb_layer2_conflicts", "Number of address conflicts found before announcing an IP",
                    ["ip"], registry=registry),
            Gauge("nocloudlb_layer2_responder_up", "1 when the ARP/NDP responder process has the whole state; "
                  "0 while the daemon answers in its place", registry=registry),
            Counter("nocloudlb_layer2_responder_restarts", "Number of times the ARP/NDP responder process "
                    "exited or hung and was replaced", registry=registry),
            Counter("nocloudlb_layer2_lease_expired", "Number of ARP/NDP requests for owned IPs not answered "
                    "because the daemon had not renewed the layer-2 lease in time (frozen or stalled)",
                    registry=registry),
            Gauge("nocloudlb_layer2_lease_remaining_seconds", "Seconds left before the ARP/NDP responder stops "
                  "answering unless the daemon renews its lease (+Inf: no deadline yet)", registry=registry),
            Gauge("nocloudlb_layer2_interface_unusable", "1 for each interface an L2Advertisement names (or used "
                  "for VIPs) that this node cannot announce on, by reason (missing, down, enslaved, noCarrier, ...)",
                  ["iface", "reason"], registry=registry),
        )
    return _by_registry[key][1]
