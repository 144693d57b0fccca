"""The announcer's transmit side: each interface's probes, gratuitous frames and multicast joins
leave through its token bucket (``rate`` frames/s, ``burst`` at most), the ``urgent`` queue (a
takeover's first round, joins) before the other, so a takeover of thousands of VIPs is spread out
on the segment and a re-announcement backlog never delays it.

Part of the announcer (announcer.py), run by its event loop with its lock held. Gratuitous frames
wait, in order, while the answering lease has run out (leasegate.py); frames of an address
withdrawn or re-scheduled meanwhile are dropped without spending a token.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from .leasegate import LeaseGate
from .lifecycle import Lifecycle
from .links import Links
from .mcast import Groups
from .tables import Iface
from .vips import VipTable

# Tokens a multicast join or leave takes from the pacing bucket (a gratuitous frame takes 1). The kernel
# does not send a report per join: it puts one 20-byte record per changed group into MLDv2 state-change
# reports of up to ~70 records each, sent twice (robustness), so 1/32 of a frame a join. At one token a
# join, a takeover of 3,300 IPv6 VIPs spent 0.66 s of tokens on joins before its first NA.
MCAST_COST = 1.0 / 32


class Pacer:
    """Sends what the interfaces' queues hold, as fast as their token buckets allow."""

    def __init__(self, metrics: Any, links: Links, table: VipTable, lifecycle: Lifecycle, groups: Groups,
                 lease: LeaseGate, counts: dict[str, Counter], *, rate: float, burst: int) -> None:
        self.metrics = metrics
        self.links = links
        self.table = table
        self.lifecycle = lifecycle
        self.groups = groups
        self.lease = lease
        self.counts = counts
        self.rate = rate
        self.burst = burst
        self.takes = 0  # planned takes announced, then answered (lifecycle.py)

    @staticmethod
    def held(iface: Iface) -> bool:
        """The next frame to leave ``iface`` is a gratuitous one (it waits while the lease has run out)."""
        head = (iface.urgent or iface.queue)[0]
        return head[3] in ("gratuitous", "take")

    def wait(self, timeout: float, now: float) -> float:
        """``timeout`` cut to when the next token of an interface with frames to send comes."""
        no_lease = not self.lease.valid()  # gratuitous frames wait for the renewal (it wakes the loop)
        for iface in self.links.ifaces.values():
            if (iface.queue or iface.urgent) and not (no_lease and self.held(iface)):
                timeout = min(timeout, max(0.0, (1.0 - iface.tokens) / self.rate))
        return timeout

    def transmit(self) -> None:
        now = time.monotonic()
        leased = self.lease.valid()
        for iface in self.links.ifaces.values():
            iface.tokens = min(float(self.burst), iface.tokens + (now - iface.refilled) * self.rate)
            iface.refilled = now
            budget = 512  # frames per loop pass, so receiving is never starved
            while (iface.urgent or iface.queue) and iface.tokens >= 1.0 and budget > 0:
                if not leased and self.held(iface):
                    head = (iface.urgent or iface.queue)[0]
                    if self.table.current(head[0], head[1]) is not None:
                        break  # no lease: claim nothing on the wire; kept, in order, for the next renewal
                ip, gen, frame, kind, series = (iface.urgent or iface.queue).popleft()
                if kind == "mcast":
                    if self.groups.reconcile(iface, frame):
                        budget -= 1
                        iface.tokens -= MCAST_COST
                        iface.sent["mcast"] += 1
                    continue
                vip = self.table.current(ip, gen)
                if vip is None or vip.state != ("checking" if kind == "probe" else "announcing"):
                    continue  # withdrawn (or check abandoned) meanwhile: drop without spending a token
                if kind != "probe" and series != vip.series:
                    iface.dropped += 1
                    continue  # superseded by a newer schedule (reannounce): its own frames are queued
                if kind == "take":
                    budget -= 1
                    iface.tokens -= len(frame)
                    self._take(iface, vip, frame)
                    continue
                budget -= 1
                iface.tokens -= 1.0
                ok = self.links.send(iface, frame)
                if kind == "probe":
                    vip.probes_pending -= 1
                    if vip.probes_pending <= 0:
                        self.lifecycle.probe_sent(vip, time.monotonic())
                if ok and kind == "gratuitous":
                    self._sent_gratuitous(iface, ip, 1)
                elif ok:
                    iface.sent[kind] += 1

    def _take(self, iface: Iface, vip: Any, frames: list[bytes]) -> None:
        """A planned take's round (lifecycle.py): announced, then answered, by the responder child (``T``) or,
        while this thread answers in its place, here; a round of an address answered already is sent as is."""
        if iface.name in vip.taking:
            vip.taking.discard(iface.name)
            ok = self.table.take(vip, iface, frames)
            self.takes += 1
        else:
            sent = [self.links.send(iface, f) for f in frames]  # every frame, even after a failed one
            ok = all(sent)
        if ok:
            self._sent_gratuitous(iface, vip.ip, len(frames))

    def _sent_gratuitous(self, iface: Iface, ip: str, n: int) -> None:
        iface.sent["gratuitous"] += n
        self.counts["gratuitous_sent"][ip] += n
        self.metrics.gratuitous_sent.labels(ip).inc(n)
