"""BgpMode: the speaker's BGP mode (the Mode interface of notes/MODES.md).

``apply`` runs on the decision thread and does only pure work: ``bgp_decision`` (core) and
``render`` (Jinja2), then hands the text to the worker thread and returns. The worker:

- withdrawals first and at once: prefixes that left the desired config are removed
  (``no network ...``) before anything else, never debounced, on bgpd's vty socket (one
  session, well under a millisecond; the same lines vtysh would pass on, so the running config
  that frr-reload diffs later is the same); what the socket cannot remove goes through one
  ``vtysh`` call, so a withdrawal is never lost to a socket problem;
- then the whole config: written beside frr.conf, ``frr-reload.py --test``, ``--reload``, and
  only then frr.conf itself is replaced (0640 root:frr). Additions wait ``debounce`` seconds so
  a burst of changes costs one reload. frr-reload changes only the lines that differ, so a
  session whose neighbour lines did not change is not reset;
- a refused or failed reload is logged (``frrReloadFailed``, passwords redacted), the last good
  config is put back (reload of the file that was last applied) and the new one retried every
  ``retry`` seconds.

The watch thread asks bgpd on its vty socket every ``watch_interval`` seconds (0.1) with a
``watch_timeout`` deadline (0.35 s): per-peer session state, uptime and prefixes sent (status, metrics,
``sessionUp``/``sessionDown`` events). When bgpd does not answer (hung or dead), bfdd would still
answer BFD and the routers would keep this node until the hold time; so the watch drops this
node's outgoing BFD packets (an nftables table of its own), the routers' BFD sessions go down
and they drop the node at BFD speed. When bgpd answers again the table is removed. The
trade-off of the short deadline: a bgpd that is merely slow for 0.35 s (a long config load, a
machine starved of CPU) is taken out the same way, and comes back at its next answer; with BFD
100 ms x 3 a frozen bgpd is out of the routers' tables within interval + deadline + the nft call +
0.3 s, about 0.8 s (the goal is 1 s).

``withdraw_all`` (drain of the whole node, shutdown, unknown view) removes every network in the
calling thread, so that the routes are gone from the routers before the process exits.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from nocloudlb.core.bgp import BgpDecision, bgp_decision
from nocloudlb.core.election import NodeView
from nocloudlb.core.schema import BGPPeer, Config

from .. import logs
from ..backoff import Backoff, backoff_metrics
from .flows import DEFAULT_RATE, OFF_LABEL, FlowHandover
from .frr import FrrControl, FrrError
from .reconcile import Diff, PeerView, Reconciler, advertised_command, advertised_prefixes
from .render import Rendered, forwarding_needed, peer_families, peer_wants, redact, render, strip_networks

log = logging.getLogger("nocloudlb.bgp")

WATCH_TABLE = "nocloudlb_bgp_watch"
# BFD control (single hop 3784, multihop 4784) and echo (3785)
WATCH_RULES = f"""table inet {WATCH_TABLE} {{
  chain out {{
    type filter hook output priority 0; policy accept;
    udp dport {{ 3784, 3785, 4784 }} drop
  }}
}}
"""

_metrics: dict[int, dict[str, Any]] = {}


def bgp_metrics(registry: CollectorRegistry | None = REGISTRY) -> dict[str, Any]:
    """MetalLB's BGP metrics under our prefix, registered once per registry."""
    key = id(registry)
    if key not in _metrics:
        _metrics[key] = {
            "session_up": Gauge("nocloudlb_bgp_session_up", "BGP session state (1 is up, 0 is down)", ["peer"],
                                registry=registry),
            "announced": Gauge("nocloudlb_bgp_announced_prefixes_total", "Number of prefixes currently being "
                               "advertised on the BGP session", ["peer"], registry=registry),
            "updates": Gauge("nocloudlb_bgp_updates_total", "Number of BGP UPDATE messages sent", ["peer"],
                             registry=registry),
            "frr_healthy": Gauge("nocloudlb_bgp_frr_healthy", "bgpd answers within the watch deadline (1) or "
                                 "not (0, the node's BFD is blocked)", registry=registry),
            "reload_failures": Gauge("nocloudlb_bgp_reload_failures", "Consecutive failed FRR reloads",
                                     registry=registry),
            "repairs": Counter("nocloudlb_bgp_reconcile_repairs", "Differences found between what bgpd "
                               "advertised to a peer and the decision, and repaired", ["peer"], registry=registry),
            "session_down": Counter("nocloudlb_bgp_session_down", "Established BGP sessions that went down "
                                    "(a reset by either side, a hold timer, BFD)", ["peer"], registry=registry),
        }
    return _metrics[key]


def _router_lines(key: tuple[str, int], family: str, prefixes: list[str]) -> list[str]:
    vrf, asn = key
    return ([f"router bgp {asn}" + (f" vrf {vrf}" if vrf else ""), f"address-family {family} unicast"]
            + [f"no network {p}" for p in prefixes] + ["exit-address-family", "exit"])


class BgpMode:
    name = "bgp"

    def __init__(self, node: str, frr: FrrControl | None = None, *, debounce: float = 0.3, retry: float = 5.0,
                 watch_interval: float = 0.1, watch_timeout: float = 0.35, watch_failures: int = 1,
                 registry: CollectorRegistry | None = REGISTRY, flow_peers: list[str] | None = None,
                 flow_interval: float = 2.0, flow_rate: int = DEFAULT_RATE, flow_burst: int | None = None) -> None:
        self.node = node
        self.frr = frr or FrrControl()
        # point 8: the other nodes' addresses, for the flow handover (flows.py); none = off
        self.flows = FlowHandover(flow_peers or [], self._run, flow_rate, flow_burst)
        self.flow_interval = flow_interval
        self._flows_off = False  # the node label OFF_LABEL=off
        self.debounce = debounce
        self.retry = retry
        self.watch_interval = watch_interval
        self.watch_timeout = watch_timeout
        self.watch_failures = watch_failures
        self.metrics = bgp_metrics(registry)
        self._cond = threading.Condition()
        self._frr_lock = threading.Lock()  # one FRR change at a time (withdrawals, reloads)
        self._stop = False
        self._threads: list[threading.Thread] = []
        self._forwarding: tuple[bool, bool] | None = None
        self._decision = BgpDecision()
        self._config: Config | None = None
        self._desired: Rendered | None = None
        self._desired_at = 0.0
        self._applied: Rendered | None = None  # what FRR runs (last good)
        self._announced: dict[tuple[str, int], dict[str, list[str]]] = {}  # networks FRR has now
        self._good_path = ""
        self._withdrawn = False  # withdraw_all in force until the next apply
        self._reload_error = ""
        # every tool that can fail backs off (exponential, jitter, ceiling): frr-reload (and its
        # --test) from ``retry`` seconds, withdrawals (vty socket, then vtysh) from 0.5 s
        self.reload_backoff = Backoff("frr-reload", base=retry, ceiling=max(retry, 30.0))
        self.withdraw_backoff = Backoff("vtysh", base=0.5, ceiling=10.0)
        collector = backoff_metrics(registry)
        collector.add(self.reload_backoff)
        collector.add(self.withdraw_backoff)
        self._disk: str | None = None  # what this mode last wrote to frr.conf
        self._changed_at = 0.0  # the last reload or withdrawal (the reconcile looks closely after it)
        self.reconciler = Reconciler(self._advertised, self._repair)
        self.reconcile_interval = (0.5, 2.0)  # seconds between checks: for 10 s after a change, then
        self.reconcile_settle = 5.0  # a session's age before a prefix it lacks counts as missing
        self._reloads = 0
        self._last_reload_at = 0.0
        self._last_reload_seconds = 0.0
        self._sessions: dict[str, dict[str, Any]] = {}
        self._healthy: bool | None = None
        self._watch_error = ""
        self._blocked = False
        self._fails = 0
        # withdraw through bgpd's vty socket (vtysh only when it fails); the last withdrawal's
        # times (wall clock, for benchmarks) and path
        self.vty_withdraw = True
        self.last_withdraw: dict[str, Any] = {}

    # -- Mode interface -------------------------------------------------------------------
    def start(self) -> None:
        self._forwarding = self.frr.forwarding()
        self._unblock(force=True)  # a table a crashed speaker left behind
        for target, name in ((self._work, "bgp-reload"), (self._watch, "bgp-watch"), (self._flows, "bgp-flows"),
                             (self._reconcile, "bgp-reconcile")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _switches(self, parsed: Config) -> tuple[bool, bool]:
        """The forwarding lines to render: on where the node has it on or the data plane needs it."""
        live = self._forwarding or (True, True)
        need = forwarding_needed(parsed)
        return live[0] or need[0], live[1] or need[1]

    def apply(self, me: str, nodes: list[NodeView], parsed: Config) -> None:
        decision = bgp_decision(me, nodes, parsed)
        rendered = render(me, decision, parsed, self._switches(parsed))
        mine = next((n for n in nodes if n.name == me), None)
        with self._cond:
            self._decision, self._config = decision, parsed
            self._flows_off = mine is not None and (mine.labels or {}).get(OFF_LABEL) == "off"
            self._withdrawn = False
            if self._desired is None or rendered.text != self._desired.text:
                self._desired = rendered
                self._desired_at = time.monotonic()
                self._cond.notify_all()

    def withdraw_all(self) -> None:
        """Stop announcing everything now (this thread, bgpd's vty socket, vtysh if that fails); the
        sessions stay up."""
        with self._cond:
            self._withdrawn = True
            decision = BgpDecision(peers=self._decision.peers, routes={p.name: [] for p in self._decision.peers})
            if self._config is not None:
                self._desired = render(self.node, decision, self._config, self._switches(self._config))
                self._desired_at = time.monotonic()
            self._cond.notify_all()
        self._withdraw(None)

    def wait_sent(self, timeout: float = 1.0) -> bool:
        """Wait until bgpd has nothing left to advertise to any peer (``pfxSnt`` and ``outq`` 0 in its
        summary): after ``withdraw_all``, the withdrawal has left this node. bgpd holds a change about 50 ms
        before it sends it (its route queue), longer than the vty socket takes to hand it over; on
        shutdown ``close`` waits for it (at most ``timeout``), so the process never leaves first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                summary = self.frr.query_json("show bgp vrf all summary json", timeout=self.watch_timeout)
                peers = [p for afs in (summary or {}).values() if isinstance(afs, dict)
                         for af in afs.values() if isinstance(af, dict)
                         for p in (af.get("peers") or {}).values() if isinstance(p, dict)]
                sent = sum(_count(p.get("pfxSnt")) + _count(p.get("outq")) for p in peers)
                if sent == 0:
                    return True
            except FrrError:
                return False  # bgpd does not answer: nothing to wait for here (the watch blocks BFD)
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def lo_vips(self) -> set[str]:
        """VIPs this node may serve through BGP, from the last apply: the Mode hook for lo (the
        layer-2 mode holds them there, see modeset.ModeSet.other_lo)."""
        with self._cond:
            return set(self._decision.serve)

    def status(self) -> dict[str, Any]:
        with self._cond:
            routes = {name: [r.prefix for r in rs] for name, rs in self._decision.routes.items()}
            peers = []
            for p in self._decision.peers:
                s = self._sessions.get(p.name, {})
                peers.append({"name": p.name, "address": p.address or p.interface, "vrf": p.vrf, "myASN": p.my_asn,
                              "peerASN": p.peer_asn or p.dynamic_asn, "state": s.get("state", "unknown"),
                              "uptimeMsec": s.get("uptimeMsec", 0), "prefixesSent": s.get("prefixesSent", 0),
                              "sessionDowns": s.get("downs", 0),
                              "bfd": p.bfd_profile, "routes": routes.get(p.name, [])})
            pending = self._pending()
            return {
                "peers": peers,
                # per VIP, keyed by address; not "vips", which the speaker's status keeps for the
                # layer-2 rows (one owner per VIP), while in BGP every eligible node announces
                "bgpVips": {ip: {"announcing": a, "reason": r, "services": s}
                            for ip, (a, r, s) in sorted(self._decision.vips.items())},
                "withdrawn": self._withdrawn,
                "flowHandover": self.flows.status(),
                "frr": {"healthy": self._healthy, "error": self._watch_error, "bfdBlocked": self._blocked},
                "config": {"applied": self._applied is not None, "pending": pending, "error": self._reload_error,
                           "failures": self.reload_backoff.failures, "reloads": self._reloads,
                           "lastReloadSeconds": round(self._last_reload_seconds, 3),
                           "reload": self.reload_backoff.state(), "withdraw": self.withdraw_backoff.state()},
                "reconcile": self.reconciler.status(),
            }

    def close(self) -> None:
        with self._cond:
            withdrawn = self._withdrawn
            self._stop = True
            self._cond.notify_all()
        if withdrawn:
            self.wait_sent()
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []
        self._unblock()
        self.flows.clear()

    # -- flow handover (point 8): its own thread, nft and ip calls off the others' paths --------
    def _run(self, argv: list[str], stdin: str | None) -> str:
        proc = self.frr.run(argv, timeout=10.0, input_text=stdin)
        if proc.returncode != 0:
            raise FrrError(f"{' '.join(argv[:3])}: {(proc.stderr or proc.stdout).strip()[:300]}")
        return proc.stdout

    def _flows(self) -> None:
        if not self.flows.addresses:
            return
        served: set[str] | None = None
        next_at = 0.0
        while True:
            with self._cond:
                while (not self._stop and time.monotonic() < next_at
                       and served == (set() if self._flows_off else self._decision.serve)):
                    self._cond.wait(max(0.05, min(0.5, next_at - time.monotonic())))
                if self._stop:
                    return
                served = set() if self._flows_off else set(self._decision.serve)
            try:
                self.flows.refresh(served)
            except Exception as exc:  # noqa: BLE001 - one failure never stops the thread
                logs.event(log, "bgpFlowHandoverFailed", str(exc)[:500], logging.ERROR)
            next_at = time.monotonic() + self.flow_interval

    # -- reconcile: what bgpd advertised to each peer against the decision (reconcile.py) ------
    def _reconcile(self) -> None:
        next_at = time.monotonic()
        while True:
            with self._cond:
                fast = time.monotonic() - self._changed_at < 10.0
                next_at = max(next_at + self.reconcile_interval[0 if fast else 1], time.monotonic())
                while not self._stop and time.monotonic() < next_at:
                    self._cond.wait(next_at - time.monotonic())
                if self._stop:
                    return
                views = self._reconcile_views()
            if not views:
                continue
            try:
                self.reconciler.check(views)
            except FrrError as exc:
                log.debug("reconcile: bgpd did not tell: %s", exc)
            except Exception as exc:  # noqa: BLE001 - one failure never stops the thread
                logs.event(log, "bgpReconcileFailed", str(exc)[:500], logging.ERROR)

    def _reconcile_views(self) -> list[PeerView]:
        """The peers and families to check now (the caller holds the condition): none while a
        withdrawal is on its way or backs off, or bgpd does not answer; only Established sessions.

        While a reload is on its way or fails (backs off), what it would change is no difference
        yet: only a prefix bgpd advertises without holding its ``network`` line counts (a withdrawal
        bgpd lost), so a withdrawal is repaired whatever state the reload is in, and a reload that
        keeps failing never makes the reconcile escalate to a session reset."""
        if (self._healthy is not True or self._desired is None
                or _any(_minus(self._announced, self._desired.networks)) or self.withdraw_backoff.backing_off):
            return []
        pending = self._pending() or self.reload_backoff.backing_off
        wants = peer_wants(self._decision)
        views = []
        for p in self._decision.peers:
            session = self._sessions.get(p.name, {})
            if session.get("state") != "Established":
                continue
            nets = self._announced.get((p.vrf, p.my_asn), {})
            settled = _count(session.get("uptimeMsec")) >= self.reconcile_settle * 1000
            for fam in peer_families(p):
                want = frozenset() if self._withdrawn else frozenset(wants.get(p.name, {}).get(fam, ()))
                held = frozenset(nets.get(fam, ()))
                views.append(PeerView(p.name, p.address or p.interface, p.vrf, p.my_asn, fam,
                                      want | held if pending else want, held,
                                      missing_counts=settled and not pending))
        return views

    def _advertised(self, view: PeerView) -> set[str]:
        return advertised_prefixes(self.frr.query_json(advertised_command(view), timeout=2.0))

    def _repair(self, view: PeerView, step: int, found: Diff) -> None:
        """Repair a difference the reconciler confirmed (the steps: reconcile.py)."""
        self.metrics["repairs"].labels(view.name).inc()
        logs.event(log, "bgpReconcileRepair", "bgpd's advertisements to a peer differ from the decision",
                   logging.WARNING, peer=view.name, address=view.address, family=view.family, step=step,
                   **found.as_dict())
        if found.missing:
            with self._cond:
                self._applied = None  # frr-reload puts back any network bgpd lacks
                self._cond.notify_all()
        vrf = f" vrf {view.vrf}" if view.vrf else ""
        lonely = sorted(found.extra - view.networks)
        with self._frr_lock:
            if step == 1 and lonely:
                lines = [f"router bgp {view.asn}{vrf}", f"address-family {view.family} unicast"]
                for prefix in lonely:
                    lines += [f"network {prefix}", f"no network {prefix}"]
                self.frr.configure_vty(lines + ["exit-address-family", "exit"])
                if not (found.missing or found.extra & view.networks):
                    return
            hard = step >= 3
            self.frr.exec_vty(f"clear bgp{vrf} {view.address}" + ("" if hard else " soft out"))

    # -- worker: withdrawals now, the rest through frr-reload --------------------------------
    def _pending(self) -> bool:
        """A desired config FRR does not run yet: not reloaded, or networks a withdrawal removed
        that it must announce again (the caller holds the condition)."""
        return self._desired is not None and (self._applied is None or self._desired.text != self._applied.text
                                              or _any(_minus(self._desired.networks, self._announced)))

    def rendered(self) -> Rendered | None:
        """The config FRR runs (last good), for tests and status."""
        with self._cond:
            return self._applied

    def wait_applied(self, timeout: float = 30.0) -> bool:
        """Wait until the desired config is the applied one (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._due():
                    self._cond.wait(self._wait_time())
                if self._stop:
                    return
                desired = self._desired
            assert desired is not None
            self._withdraw(desired.networks)
            with self._cond:
                if not self._reload_due():
                    continue
                wait = self._desired_at + self.debounce - time.monotonic()
                if wait > 0 and not self.reload_backoff.backing_off and not self._stop:
                    self._cond.wait(wait)  # debounce: later changes join this reload
                    continue
                desired = self._desired
            assert desired is not None
            try:
                self._reload(desired)
            except Exception as exc:  # noqa: BLE001 - one failure never stops the worker
                logs.event(log, "frrReloadFailed", "unexpected error", logging.ERROR,
                           error=redact(str(exc), desired.secrets))

    def _due(self) -> bool:
        return self._withdraw_due() or self._reload_due()

    def _withdraw_due(self) -> bool:
        """Networks FRR has that the desired config dropped: now (never debounced), unless the
        last withdrawal failed and its back-off has not run out."""
        return (self._desired is not None and _any(_minus(self._announced, self._desired.networks))
                and self.withdraw_backoff.ready())

    def _reload_due(self) -> bool:
        if self._desired is None or not self.reload_backoff.ready():
            return False
        if self._applied is not None and self._desired.text == self._applied.text:
            # the same config, but networks withdrawn by vtysh since its reload (a drain undone
            # before the drained config was reloaded) must be announced again: reload it
            return _any(_minus(self._desired.networks, self._announced))
        return True

    def _wait_time(self) -> float:
        waits = [1.0]
        for b in (self.reload_backoff, self.withdraw_backoff):
            if b.backing_off:
                waits.append(b.remaining())
        return max(0.05, min(waits))

    def _withdraw(self, target: dict[tuple[str, int], dict[str, list[str]]] | None) -> None:
        """Remove now every network FRR has that ``target`` lacks (None: all): through bgpd's vty
        socket (one session, no process), and what that could not remove through vtysh."""
        with self._frr_lock:
            with self._cond:
                gone = _minus(self._announced, target or {})
            if not _any(gone):
                return
            t0 = time.monotonic()
            started = time.time()
            self._write_disk_without(gone)  # first: a bgpd that starts now reads the withdrawal
            via = "vty"
            left = gone
            if self.vty_withdraw:
                try:
                    left = self._withdraw_vty(gone)
                except FrrError as exc:
                    logs.event(log, "bgpWithdrawVtyFailed", "bgpd's vty socket failed: withdrawing through vtysh",
                               logging.WARNING, error=str(exc)[:300])
            if _any(left):
                via = "vtysh" if left is gone else "vty+vtysh"
                failed = self._withdraw_vtysh(left)
                if failed:
                    wait = self.withdraw_backoff.failed(failed[0])
                    logs.event(log, "bgpWithdrawFailed", "vtysh could not remove the networks", logging.ERROR,
                               failed=failed[:20], retryIn=round(wait, 3), failures=self.withdraw_backoff.failures)
                    return
            self.withdraw_backoff.succeeded()
            sent = time.time()
            with self._cond:
                self._announced = _minus(self._announced, gone)
                self._changed_at = time.monotonic()
                self.last_withdraw = {"at": started, "sent": sent, "seconds": round(time.monotonic() - t0, 4),
                                      "via": via, "prefixes": sum(len(ps) for fams in gone.values()
                                                                  for ps in fams.values())}
                self._cond.notify_all()
        logs.event(log, "bgpWithdrawn", node=self.node, seconds=round(time.monotonic() - t0, 4), via=via,
                   prefixes=sorted({p for fams in gone.values() for ps in fams.values() for p in ps}))

    def _withdraw_vty(self, gone: dict[tuple[str, int], dict[str, list[str]]]
                      ) -> dict[tuple[str, int], dict[str, list[str]]]:
        """``no network`` lines on bgpd's vty socket; returns what it did not remove (for vtysh).
        The same lines vtysh would pass to bgpd, so the running config (what frr-reload reads and
        diffs) is the same either way. FrrError when the socket cannot be used at all."""
        lines = _withdraw_lines(gone)
        count = sum(len(ps) for fams in gone.values() for ps in fams.values())
        answers = self.frr.configure_vty(lines, timeout=2.0 + 0.005 * count)
        left: dict[tuple[str, int], dict[str, list[str]]] = {}
        context_ok = True
        for line, status, text in answers:
            # a refused router bgp / address-family leaves bgpd in another node, where the
            # lines that follow mean something else or nothing: they all go to vtysh
            if line.startswith("router bgp"):
                context_ok = status == 0
            elif line.startswith("address-family"):
                context_ok = context_ok and status == 0
            if not line.startswith("no network "):
                continue
            if context_ok and (status == 0 or "Can't find" in text):
                continue  # removed, or already gone
            prefix = line.split()[2]
            for key, fams in gone.items():
                for family, prefixes in fams.items():
                    if prefix in prefixes:
                        left.setdefault(key, {}).setdefault(family, []).append(prefix)
        return left

    def _withdraw_vtysh(self, gone: dict[tuple[str, int], dict[str, list[str]]]) -> list[str]:
        """The same ``no network`` lines through one vtysh call; returns the prefixes it failed."""
        lines = _withdraw_lines(gone)
        try:
            self.frr.configure(lines, timeout=5.0)
        except FrrError:
            # vtysh stops at the first line it refuses (a network FRR no longer has): remove the
            # others one by one, so that one stale prefix never keeps the rest announced
            failed: list[str] = []
            for key, fams in gone.items():
                for family, prefixes in fams.items():
                    for prefix in prefixes:
                        if failed and "% " not in failed[-1]:
                            failed.append(f"{prefix}: not tried (vtysh cannot reach bgpd)")
                            continue  # one vtysh run per prefix only while bgpd answers
                        try:
                            self.frr.configure(_router_lines(key, family, [prefix]), timeout=5.0)
                        except FrrError as one:
                            if "Can't find" not in str(one):
                                failed.append(f"{prefix}: {one}")
            return failed
        return []

    def _reload(self, desired: Rendered) -> None:
        t0 = time.monotonic()
        desired = self._with_live_switches(desired)
        staged = self.frr.staged()
        try:
            # --test only reads FRR's running config: outside the lock, so a withdrawal waits at
            # most for the --reload itself (only this thread writes the staged file)
            self.frr.write(desired.text, staged)
            self.frr.test(staged)
            with self._frr_lock:
                with self._cond:
                    newest = self._desired
                if newest is not desired and newest is not None and _any(_minus(desired.networks, newest.networks)):
                    return  # a newer config withdraws some of these (drain, withdraw_all): never re-announce them
                # frr.conf is the decision before bgpd hears it (a bgpd (re)start reads the same),
                # and the file reloaded: from another file frr-reload would `vtysh write` the
                # running config over it
                self._write_disk(desired.text)
                try:
                    self.frr.reload(self.frr.conf if self._disk == desired.text else staged)
                except FrrError:
                    with self._cond:  # FRR may hold part of it: the next round withdraws what it must
                        self._announced = _union(self._announced, desired.networks)
                    raise
                with self._cond:  # before the lock goes: a withdrawal waiting for it sees these networks
                    self._announced = desired.networks
        except (FrrError, OSError) as exc:
            error = redact(str(exc), desired.secrets)
            wait = self.reload_backoff.failed(error)
            with self._cond:
                self._reload_error = error
                self._cond.notify_all()  # what FRR may have taken of it and the decision dropped: withdraw now
            self.metrics["reload_failures"].set(self.reload_backoff.failures)
            # no going back to the last good file: it would announce again what this config withdrew
            logs.event(log, "frrReloadFailed", "the new FRR config is refused; FRR keeps what it runs, withdrawals "
                       "still go to bgpd at once", logging.ERROR, error=error,
                       failures=self.reload_backoff.failures, retryIn=round(wait, 3))
            return
        seconds = time.monotonic() - t0
        self.reload_backoff.succeeded()
        with self._cond:
            recovered = self._reload_error != ""
            self._applied = desired
            self._reload_error = ""
            self._reloads += 1
            self._last_reload_at = time.time()
            self._last_reload_seconds = seconds
            self._changed_at = time.monotonic()
            self._cond.notify_all()
        self.metrics["reload_failures"].set(0)
        logs.event(log, "frrReloaded", node=self.node, seconds=round(seconds, 3), recovered=recovered,
                   prefixes=sorted({p for fams in desired.networks.values() for ps in fams.values() for p in ps}))

    def _with_live_switches(self, desired: Rendered) -> Rendered:
        """``desired`` rendered again if the forwarding switches changed since it was rendered (the
        data plane turned forwarding on): a reload never sets them back."""
        try:
            live = self.frr.forwarding()
        except FrrError as exc:
            logs.event(log, "forwardingUnreadable", str(exc), logging.WARNING)
            return desired
        with self._cond:
            if live == self._forwarding or self._config is None or desired is not self._desired:
                self._forwarding = live
                return desired
            self._forwarding = live
            decision = self._decision
            if self._withdrawn:
                decision = BgpDecision(peers=decision.peers, routes={p.name: [] for p in decision.peers})
            again = render(self.node, decision, self._config, self._switches(self._config))
            if again.networks != desired.networks:
                return desired  # never announce through a re-render what the decision has not
            self._desired = again
            return again

    def _write_disk(self, text: str) -> None:
        try:
            self.frr.write(text)  # frr.conf: what FRR reads when it (re)starts
            self._disk = text
        except OSError as exc:
            logs.event(log, "frrConfWriteFailed", str(exc), logging.ERROR)

    def _write_disk_without(self, gone: dict[tuple[str, int], dict[str, list[str]]]) -> None:
        """frr.conf without the ``network`` lines of ``gone`` (the caller holds ``_frr_lock``)."""
        base = self._disk if self._disk is not None else (self._applied.text if self._applied else None)
        if base is None:
            try:
                with open(self.frr.path(self.frr.conf), encoding="utf-8") as fh:
                    base = fh.read()
            except OSError:
                return
        text = strip_networks(base, gone)
        if text != base:
            self._write_disk(text)

    # -- watch: sessions, and bgpd's health -------------------------------------------------
    def _watch(self) -> None:
        ticks = 0
        next_at = time.monotonic()
        while True:
            # a fixed pace, whatever wakes the condition (every change notifies it)
            next_at = max(next_at + self.watch_interval, time.monotonic())
            with self._cond:
                while not self._stop and time.monotonic() < next_at:
                    self._cond.wait(next_at - time.monotonic())
                if self._stop:
                    return
            try:
                self._watch_once(ticks)
            except Exception as exc:  # noqa: BLE001 - one failure never stops the watch
                logs.event(log, "bgpWatchFailed", str(exc), logging.ERROR)
            ticks += 1

    def _watch_once(self, ticks: int) -> None:
        try:
            summary = self.frr.query_json("show bgp vrf all summary json", timeout=self.watch_timeout)
        except FrrError as exc:
            self._unanswered(exc)
            return
        self._fails = 0
        self._watch_error = ""
        if self._healthy is not True:
            if self._healthy is False:
                logs.event(log, "frrHealthy", "bgpd answers again: BFD restored, its config checked now")
                self.reload_backoff.succeeded()
                self.withdraw_backoff.succeeded()
                with self._cond:
                    self._applied = None  # a bgpd that restarted: frr-reload puts back what it lacks
                    self._cond.notify_all()
            self._healthy = True
            self.metrics["frr_healthy"].set(1)
            self._unblock()
        updates: dict[str, int] = {}
        if ticks % max(1, round(2.0 / max(self.watch_interval, 0.01))) == 0:  # about every 2 s
            try:
                # the same deadline: a bgpd that hangs during this question is seen now, not
                # one question later
                updates = _updates_sent(self.frr.query_json("show bgp vrf all neighbors json",
                                                            timeout=self.watch_timeout))
            except FrrError as exc:
                self._unanswered(exc)
                return
        self._sessions_from(summary, updates)

    def _unanswered(self, exc: FrrError) -> None:
        self._fails += 1
        self._watch_error = str(exc)
        if self._fails >= self.watch_failures and self._healthy is not False:
            self._healthy = False
            self.metrics["frr_healthy"].set(0)
            self._block()
            logs.event(log, "frrUnhealthy", "bgpd does not answer: blocking this node's BFD so routers drop "
                       "it now", logging.ERROR, error=str(exc))

    def _sessions_from(self, summary: Any, updates: dict[str, int]) -> None:
        found: dict[tuple[str, str], dict[str, Any]] = {}
        if isinstance(summary, dict):
            for vrf_name, afs in summary.items():
                if not isinstance(afs, dict):
                    continue
                for af in afs.values():
                    if not isinstance(af, dict):
                        continue
                    for addr, p in (af.get("peers") or {}).items():
                        vrf = "" if vrf_name == "default" else vrf_name
                        cur = found.setdefault((vrf, addr), {"state": p.get("state", "unknown"),
                                                             "uptimeMsec": p.get("peerUptimeMsec", 0),
                                                             "prefixesSent": 0})
                        cur["prefixesSent"] += int(p.get("pfxSnt", 0) or 0)
        with self._cond:
            peers: list[BGPPeer] = list(self._decision.peers)
        sessions: dict[str, dict[str, Any]] = {}
        for p in peers:
            s = found.get((p.vrf, p.address or p.interface), {"state": "unknown", "uptimeMsec": 0,
                                                              "prefixesSent": 0})
            prev = self._sessions.get(p.name, {})
            s["updatesSent"] = updates.get(p.address or p.interface, prev.get("updatesSent", 0))
            sessions[p.name] = s
            up = s["state"] == "Established"
            was = prev.get("state") == "Established"
            s["downs"] = prev.get("downs", 0) + (1 if was and not up else 0)
            if up != was and (prev or up):
                if was:
                    self.metrics["session_down"].labels(p.name).inc()
                logs.event(log, "sessionUp" if up else "sessionDown", peer=p.name, address=p.address or p.interface,
                           state=s["state"], node=self.node, downs=s["downs"],
                           level=logging.INFO if up else logging.WARNING)
            self.metrics["session_up"].labels(p.name).set(1 if up else 0)
            self.metrics["announced"].labels(p.name).set(s["prefixesSent"])
            self.metrics["updates"].labels(p.name).set(s["updatesSent"])
        with self._cond:
            self._sessions = sessions

    def _block(self) -> None:
        try:
            proc = self.frr.run(["nft", "-f", "-"], timeout=5.0, input_text=WATCH_RULES)
            if proc.returncode != 0:
                raise FrrError(proc.stderr.strip())
            self._blocked = True
        except FrrError as exc:
            logs.event(log, "bfdBlockFailed", str(exc), logging.ERROR)

    def _unblock(self, force: bool = False) -> None:
        if not (self._blocked or force):
            return
        try:
            self.frr.run(["nft", "delete", "table", "inet", WATCH_TABLE], timeout=5.0)
            self._blocked = False
        except FrrError as exc:
            logs.event(log, "bfdUnblockFailed", str(exc), logging.ERROR)


def _minus(a: dict[tuple[str, int], dict[str, list[str]]],
           b: dict[tuple[str, int], dict[str, list[str]]]) -> dict[tuple[str, int], dict[str, list[str]]]:
    """Networks of ``a`` that ``b`` does not have, per router and family."""
    out: dict[tuple[str, int], dict[str, list[str]]] = {}
    for key, fams in a.items():
        other = b.get(key, {})
        out[key] = {}
        for fam, ps in fams.items():
            keep = set(other.get(fam, ()))  # once per family: linear in the number of prefixes
            out[key][fam] = [p for p in ps if p not in keep]
    return out


def _union(a: dict[tuple[str, int], dict[str, list[str]]],
           b: dict[tuple[str, int], dict[str, list[str]]]) -> dict[tuple[str, int], dict[str, list[str]]]:
    out: dict[tuple[str, int], dict[str, list[str]]] = {}
    for nets in (a, b):
        for key, fams in nets.items():
            for fam, ps in fams.items():
                have = out.setdefault(key, {}).setdefault(fam, [])
                have.extend(p for p in ps if p not in have)
    return out


def _count(value: Any) -> int:
    """A count from FRR's JSON ("N/A" and the like: 0)."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _any(nets: dict[tuple[str, int], dict[str, list[str]]]) -> bool:
    return any(ps for fams in nets.values() for ps in fams.values())


def _updates_sent(neighbors: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    if not isinstance(neighbors, dict):
        return out
    for vrf in neighbors.values():
        if not isinstance(vrf, dict):
            continue
        for addr, n in vrf.items():
            if isinstance(n, dict) and isinstance(n.get("messageStats"), dict):
                out[addr] = int(n["messageStats"].get("updatesSent", 0) or 0)
    return out


def _withdraw_lines(gone: dict[tuple[str, int], dict[str, list[str]]]) -> list[str]:
    """The ``no network`` lines (with their router and address-family lines) removing ``gone``."""
    lines: list[str] = []
    for key, fams in gone.items():
        for family, prefixes in fams.items():
            if prefixes:
                lines += _router_lines(key, family, prefixes)
    return lines
