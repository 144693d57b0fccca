"""Additions as a delta: when the new config differs from the one FRR runs only in its ``network``
lines, the added networks go to bgpd's vty socket as ``network`` lines (one session, no process,
the path withdrawals take) instead of a frr-reload of the whole file, which reads and diffs the
whole running config and costs seconds at thousands of networks. Anything else (a neighbour, a
prefix list or route-map, the ASN, BFD, timers, an address family) is structural and reloads.

``additions`` decides (pure); ``DeltaApplier.apply`` sends the lines and reports whether bgpd
took every one: a refused line, a socket that is gone or a bgpd that does not answer makes the
caller fall back to the full reload."""

from __future__ import annotations

import logging
import time

from .. import logs
from .frr import FrrControl, FrrError
from .render import Rendered, strip_networks
from .state import BgpState, Nets, has_any, minus, union
from .withdraw import Withdrawer

log = logging.getLogger("nocloudlb.bgp")


def structure(text: str) -> str:
    """A rendered frr.conf without its ``network`` lines: what must be equal for a delta to do."""
    return strip_networks(text, None)


def additions(running: Rendered | None, desired: Rendered, announced: Nets) -> Nets | None:
    """The networks to add to FRR when ``desired`` differs from ``running`` (the config FRR runs,
    reloaded or reached by deltas) only in its ``network`` lines: those of ``desired`` that FRR
    does not have (``announced``, which the caller knows to be exact), possibly none. None when
    anything else differs (structural: a full reload) or nothing runs yet."""
    if running is None or structure(running.text) != structure(desired.text):
        return None
    return minus(desired.networks, announced)


def switches_differ(text: str, live: tuple[bool, bool] | None) -> bool:
    """The forwarding switches ``text`` renders (``no ip forwarding`` / ``no ipv6 forwarding`` when
    off) are not the node's ``live`` ones (None: unknown, taken as equal). The render keeps a switch
    as it is unless the data plane needs it on; a delta leaves zebra's switches alone, so turning one
    on is a reload's job."""
    if live is None:
        return False
    lines = set(text.splitlines())
    return (("no ip forwarding" not in lines) != live[0]) or (("no ipv6 forwarding" not in lines) != live[1])


def add_lines(nets: Nets) -> list[str]:
    """The ``network`` lines (in their router and address-family contexts) adding ``nets``."""
    lines: list[str] = []
    for (vrf, asn), fams in nets.items():
        blocks = [(family, prefixes) for family, prefixes in fams.items() if prefixes]
        if not blocks:
            continue
        lines.append(f"router bgp {asn}" + (f" vrf {vrf}" if vrf else ""))
        for family, prefixes in blocks:
            lines.append(f"address-family {family} unicast")
            lines += [f"network {p}" for p in prefixes]
            lines.append("exit-address-family")
        lines.append("exit")
    return lines


def prefix_count(nets: Nets) -> int:
    return sum(len(ps) for fams in nets.values() for ps in fams.values())


class DeltaApplier:
    """Sends the additions of a network-only change to bgpd, then writes frr.conf."""

    def __init__(self, frr: FrrControl, state: BgpState, withdrawer: Withdrawer) -> None:
        self.frr = frr
        self.state = state
        self.withdrawer = withdrawer
        self.last_vty_seconds = 0.0  # the last delta's vty session (the rest is this process's own work)

    def apply(self, desired: Rendered) -> str:
        """Add what ``desired`` announces and FRR lacks (the caller checked that nothing else
        differs). Returns "applied" (FRR runs ``desired``), "dropped" (a newer config withdraws
        some of its networks: nothing sent, the worker goes on with the newer one) or "failed"
        (the caller must reload instead)."""
        st = self.state
        with st.frr_lock:
            with st.cond:
                newest = st.desired
                if newest is not desired and newest is not None and has_any(minus(desired.networks, newest.networks)):
                    return "dropped"  # a newer config withdraws some of these (drain, withdraw_all)
                adds = minus(desired.networks, st.announced)  # under the lock: no withdrawal runs meanwhile
            count = prefix_count(adds)
            self.last_vty_seconds = 0.0
            if count:
                t0 = time.monotonic()
                try:
                    answers = self.frr.configure_vty(add_lines(adds), timeout=2.0 + 0.005 * count)
                    self.last_vty_seconds = time.monotonic() - t0
                    refused = [(line, status, text.strip()) for line, status, text in answers if status != 0]
                    if refused:
                        raise FrrError(f"bgpd refused {len(refused)} line(s), first {refused[0][0]!r} "
                                       f"(status {refused[0][1]}): {refused[0][2][:200]}")
                except FrrError as exc:
                    with st.cond:  # bgpd may hold some of them: counted, so a later withdrawal removes them
                        st.announced = union(st.announced, adds)
                        st.announced_sure = False  # and the next change reloads: FRR may lack some
                    logs.event(log, "frrDeltaFailed", "the network lines did not all reach bgpd: reloading the "
                               "whole config instead", logging.WARNING, error=str(exc)[:500], prefixes=count)
                    return "failed"
            # then frr.conf, so that a bgpd that starts reads what bgpd now runs
            self.withdrawer.write_disk(desired.text)
            with st.cond:  # before the lock goes: a withdrawal waiting for it sees these networks
                st.announced = union(st.announced, adds)
        return "applied"
