"""The speaker's status document and metrics snapshot (issue 23: one job out of daemon.py).

``StatusReport`` reads every part and decides nothing:

- ``status(req)``: the control socket's ``status`` (``nocloudlb status``, speaker_info): this node and
  its version (``version``, ``wireVersion``: the speaker's and its wire protocol's), the members as
  gossip and their metadata show them (each with the version it publishes; "" and null for a member
  whose speaker predates publishing it), the modes' status with their VIP rows shown
  once at the top (statusview.select_vips: selected by ``req``), the config, labels, what this node
  published, gossip, health, heartbeats, quorum and witness, the ARP sysctls, the fail-closed
  exclusion and the steps' failures;
- ``metrics_snapshot()``: what metrics.py's collector exports (announced VIPs, config state, members,
  kinship counters, conflicts, quorum, step errors, fail closed);
- ``rows()``: the layer-2 mode's VIP rows with the L2 layer's live state overlaid.

Every VIP row carries ``protocol``: a VIP that only the BGP mode serves is a BGP row (no single
owner: announced by every eligible node; statusview.merge_bgp). ``{"announcers": true}`` in the
request adds to each row's ``bgp`` the nodes that should announce it, computed from the published
view with the BGP decision of every live member (``nocloudlb status --cluster``, speaker_info).
"""

from __future__ import annotations

from typing import Any

import kinship

from . import WIRE_VERSION, __version__
from .config import now_iso
from .configstate import ConfigState
from .failclosed import FailClosed
from .l2.mode import L2View, VipRow
from .runtime import Runtime, mode_rows
from .views import Views


class StatusReport:
    def __init__(self, rt: Runtime, config: ConfigState, views: Views, fail: FailClosed) -> None:
        self.rt = rt
        self.config = config
        self.views = views
        self.fail = fail

    def rows(self) -> tuple[list[VipRow], L2View]:
        """The layer-2 mode's VIP rows with the L2 layer's live state overlaid, and that state."""
        if self.rt.l2 is None:
            return [], L2View({}, {}, known=False)
        return self.rt.l2.rows()

    def status(self, req: dict | None = None) -> dict[str, Any]:
        """The status document; ``req`` selects the VIP rows (statusview.select_vips: all of them up to
        STATUS_ROWS, else a summary unless asked; filters by ip, service, owner, ...)."""
        from .statusview import select_vips, vip_summary  # noqa: PLC0415

        cfg = self.config.cfg
        me = cfg.node_name if cfg else ""
        members = []
        if self.rt.membership is not None and self.config.codec is not None:
            mine = self.views.published()
            for m in self.rt.membership.members():
                if m.name == me:
                    labels = self.views.my_labels()
                    published = dict(mine.labels) if mine else {}
                    members.append({"name": m.name, "addr": m.addr, "state": m.state, "labels": labels,
                                    "publishedLabels": published, "configDigest": self.views.last_meta.get("c", ""),
                                    "version": __version__, "wireVersion": WIRE_VERSION})
                    continue
                info = self.views.peers.get(m.name) or self.config.codec.decode(m.meta)
                members.append({"name": m.name, "addr": m.addr, "state": m.state, "labels": info.labels,
                                "publishedLabels": info.labels, "configDigest": m.meta.get("c", ""),
                                "macs": [":".join(f"{b:02x}" for b in mac) for mac in sorted(info.macs)],
                                "version": info.version, "wireVersion": info.wire})
        modes = {m.name: m.status() for m in self.rt.modes}
        all_vips = self._vip_rows(modes, announcers=bool((req or {}).get("announcers")))
        for st in modes.values():  # the rows are shown once, at the top (selected), not again per mode
            if isinstance(st.get("vips"), list):
                st["vips"] = len(st["vips"])
        vips, shown = select_vips(all_vips, req or {})
        conflicts = [c for st in modes.values() for c in st.get("conflicts", [])]
        mine = self.views.published()
        ml = self.rt.membership
        return {
            "node": me,
            "version": __version__,
            "wireVersion": WIRE_VERSION,
            "ready": self.rt.ready,
            "profile": cfg.profile if cfg else "",
            "members": members,
            "vips": vips,
            "vipsShown": shown,
            "vipSummary": vip_summary(all_vips),
            "modes": modes,
            "config": self.config.status(),
            "conflicts": sorted(conflicts, key=lambda c: c["ip"]),
            "labels": self.views.my_labels() if cfg and self.rt.labels else {},
            "published": {"labels": dict(mine.labels) if mine else {},
                          "healthy": sorted(mine.healthy) if mine else [], "error": self.views.meta_error},
            "memberlist": {"state": "closed" if self.rt.closed else (ml.join_state if ml else "starting"),
                           "error": ml.join_error if ml else "",
                           "keyIds": ml.key_ids() if ml else [],
                           "encrypted": bool(ml and ml.settings.keys)},
            "health": self.rt.health.status() if self.rt.health else {},
            "connectionSync": self.rt.connsync.status() if self.rt.connsync is not None else {"enabled": False},
            "heartbeat": self.rt.heartbeat.status() if self.rt.heartbeat else {},
            "quorum": self.rt.has_quorum() if self.config.cfg is not None else False,
            "witness": self.rt.quorum.status() if self.rt.quorum is not None else None,
            "arpSysctls": getattr(self.rt.delivery, "sysctl_status", dict)(),  # edges (issue 8 defect 8)
            "failClosed": self.fail.status(),
            "steps": self.rt.steps.status(),
            "stateFiles": [self.rt.labels.corrupt] if self.rt.labels is not None and self.rt.labels.corrupt else [],
            "time": now_iso(),
            "metricsBind": cfg.metrics_bind if cfg else "",  # firsthour: `nocloudlb status --cluster` asks members here
        }

    def _vip_rows(self, modes: dict[str, dict], announcers: bool = False) -> list[dict[str, Any]]:
        """Every mode's VIP rows, with the BGP mode's part merged in (statusview.merge_bgp)."""
        from .statusview import merge_bgp  # noqa: PLC0415

        rows = [v for st in modes.values() for v in mode_rows(st)]
        bgp = modes.get("bgp")
        if not isinstance(bgp, dict) or not bgp.get("bgpVips"):
            return merge_bgp(rows, None)
        parsed = self.config.cfg.parsed if self.config.cfg else None

        def pool_of(ip: str) -> str:
            pool = parsed.pool_for_ip(ip) if parsed is not None else None
            return pool.name if pool is not None else ""

        return merge_bgp(rows, bgp, pool_of, self.bgp_announcers() if announcers else None)

    def bgp_announcers(self) -> dict[str, list[str]]:
        """VIP -> the live members that should announce it through BGP: each one's BGP decision over the
        published view (the view every speaker decides from). On request only: members x services."""
        from .core.bgp import bgp_decision  # noqa: PLC0415
        from .core.election import LIVE_STATES  # noqa: PLC0415

        if self.config.cfg is None or self.rt.membership is None or self.config.codec is None:
            return {}
        nodes = self.views.node_views()
        out: dict[str, list[str]] = {}
        for n in nodes:
            if n.state not in LIVE_STATES:
                continue
            for ip, (announced, _reason, _services) in bgp_decision(n.name, nodes, self.config.cfg.parsed).vips.items():
                if announced:
                    out.setdefault(ip, []).append(n.name)
        return out

    def metrics_snapshot(self) -> dict[str, Any]:
        modes = {m.name: m.status() for m in self.rt.modes}
        counts: dict[str, int] = {}
        stats: dict[str, int] = {}
        if self.rt.membership is not None:
            for m in self.rt.membership.members():
                counts[m.state] = counts.get(m.state, 0) + 1
            try:
                stats = self.rt.membership.stats()
            except kinship.KinshipError:
                stats = {}
        return {
            "announced": self._announced(modes),
            "config_ok": self.config.holder.state == "ok",
            "config_stale": self.config.holder.state != "ok" and self.config.cfg is not None,
            "members": counts,
            "kinship": stats,
            "conflicts": sum(len(st.get("conflicts", [])) for st in modes.values()),
            "quorum": self.rt.has_quorum() if self.config.cfg is not None else False,
            "step_errors": self.rt.steps.snapshot(),
            "fail_closed": bool(self.fail.noted),
        }

    def _announced(self, modes: dict[str, dict]) -> list[dict[str, str]]:
        """One entry per VIP and service this node announces, per protocol (layer2, bgp)."""
        node = self.config.cfg.node_name if self.config.cfg else ""
        out = []
        for v in self._vip_rows(modes):
            protocol = v.get("protocol") or "layer2"
            if v.get("announcing"):
                out.append({"ip": v["ip"], "node": node, "service": v["service"], "protocol": protocol})
            if protocol != "bgp" and (v.get("bgp") or {}).get("announcing"):
                out.append({"ip": v["ip"], "node": node, "service": v["service"], "protocol": "bgp"})
        return out
