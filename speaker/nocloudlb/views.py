"""What this node publishes and how it sees every member (issue 23: one job out of daemon.py).

``Views`` keeps the two sides of the metadata a speaker gossips (metadata.MetaCodec):

- ``meta()``: this node's metadata now: its labels (node.labels with the runtime ones, state.LabelStore),
  the drain label when a mode cannot serve (its ``meta`` hook says ``exclude``) or a failure persists
  (``fail_reason``, failclosed.py), the healthy Local-policy services (unknown health is not health)
  and the MACs the modes answer from;
- ``publish()``: hand it to gossip (and the heartbeats, so that a drain reaches peers at once) when it
  changed; a failure is kept in ``meta_error`` and the node decides from ``last_meta``, the last
  metadata kinship accepted: ``published()`` is this node as its peers see it;
- ``node_views()``: the published view handed to the modes: every member from its metadata (a meta the
  heartbeats pushed first wins), this node from what it published; members the heartbeats suspect or
  that say they have no quorum count as unreachable; a peer on another config digest is logged
  ``configMismatch`` once per digest. It also hands the heartbeats their peers (``heartbeat_peers``);
- ``peers``: the members' decoded metadata from the last view (``member_macs()``: their MACs;
  ``led_off_wire(member, ip)``: it said it leads the VIP without answering it (its conflict check
  runs, or another MAC answers), read from the last metadata seen, also after the member is gone,
  since that is when its VIPs are taken).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import kinship

from nocloudlb.core.election import DRAIN_LABEL, NodeView

from . import logs
from .configstate import ConfigState
from .membership import split_addr
from .metadata import PeerInfo
from .runtime import Runtime

log = logging.getLogger("nocloudlb.speaker")


class Views:
    def __init__(self, rt: Runtime, config: ConfigState, fail_reason: Callable[[], str]) -> None:
        self.rt = rt  # membership, heartbeat, health, labels, modes, steps, quorum
        self.config = config  # cfg and codec in use
        self.fail_reason = fail_reason  # why this node publishes itself excluded for failing ("" when not)
        self.last_meta: dict[str, str] = {}  # the metadata kinship accepted last: what peers see
        self._pushed: dict[str, str] | None = None  # the metadata last handed to the heartbeats (``push``)
        self.meta_error = ""
        self.peers: dict[str, PeerInfo] = {}
        self._peer_configs: dict[str, str] = {}
        self._last_seen: dict[str, PeerInfo] = {}  # every member's last decoded metadata, gone ones too

    def my_labels(self) -> dict[str, str]:
        assert self.config.cfg is not None and self.rt.labels is not None
        return self.rt.labels.apply(self.config.cfg.node_labels)

    def meta(self) -> dict[str, str]:
        assert self.config.codec is not None and self.rt.health is not None
        macs: list[bytes] = []
        off_wire: list[str] = []
        labels = self.my_labels()
        for m in self.rt.modes:
            meta = m.hook("meta") or {}
            macs.extend(meta.get("macs", []))
            off_wire.extend(meta.get("offWire", []))
            if meta.get("exclude"):  # a mode cannot serve safely (l2: ARP sysctls): peers elect others
                labels = {**labels, DRAIN_LABEL: ""}
        if self.fail_reason():  # a failure persists (loop or mode): peers take over by a planned move
            labels = {**labels, DRAIN_LABEL: ""}
        # unknown health is not health: only the Local-policy services move away
        _ok, healthy = self.rt.steps.run("health", self.rt.health.healthy, default=frozenset())
        return self.config.codec.encode(labels, healthy, macs, off_wire)

    def member_macs(self) -> dict[str, tuple[bytes, ...]]:
        """Member -> the MACs it published (the members' VIP-interface MACs), this node excluded."""
        return {name: info.macs for name, info in dict(self.peers).items() if info.macs}

    def led_off_wire(self, member: str, ip: str) -> bool:
        """``member`` said (in its last metadata seen) it leads ``ip`` without answering it."""
        info = self._last_seen.get(member)
        return info is not None and info.leads_off_wire(ip)

    def published(self) -> PeerInfo | None:
        """This node as its peers see it: the metadata kinship accepted last, decoded."""
        if self.config.codec is None or not self.last_meta:
            return None
        return self.config.codec.decode(self.last_meta)

    def node_views(self) -> list[NodeView]:
        """The published view: every member from its metadata, this node from what it published."""
        assert self.config.cfg is not None and self.config.codec is not None
        me = self.config.cfg.node_name
        mine = self.published()
        views = [NodeView(me, dict(mine.labels) if mine else {}, "alive", mine.healthy if mine else frozenset())]
        peers: dict[str, PeerInfo] = {}
        members = self.rt.membership.members() if self.rt.membership else []
        hb = self.rt.heartbeat.view() if self.rt.heartbeat is not None else None
        if self.rt.heartbeat is not None:
            self.rt.steps.run("heartbeatPeers", self.heartbeat_peers, members)
        for m in members:
            if m.name == me:
                continue
            # a meta pushed by heartbeat (a drain) is what the member published, sooner than gossip
            info = self.config.codec.decode(hb.metas.get(m.name) or m.meta if hb else m.meta)
            peers[m.name] = info
            state = m.state
            if hb is not None and (m.name in hb.suspected or m.name in hb.no_quorum) and state in ("alive", "suspect"):
                # heartbeats stopped, or it says it has no quorum: not eligible (l2/mode.py forwards toward it)
                state = "unreachable"
            views.append(NodeView(m.name, info.labels, state, info.healthy))
        for name, info in peers.items():
            digest = info.config_hash
            if digest and digest != self.config.cfg.digest and self._peer_configs.get(name) != digest:
                logs.event(log, "configMismatch", "a peer runs another config version", logging.WARNING,
                           node=name, theirs=digest, ours=self.config.cfg.digest)
        self._peer_configs = {n: i.config_hash for n, i in peers.items()}
        self.peers = peers
        self._last_seen.update(peers)
        return views

    def heartbeat_peers(self, members: list) -> None:
        assert self.rt.heartbeat is not None and self.config.cfg is not None
        offset = self.rt.heartbeat.port - split_addr(self.config.cfg.bind)[1]
        peers = {}
        for m in members:
            if m.name == self.config.cfg.node_name or m.state not in ("alive", "suspect"):
                continue
            try:
                host, port = split_addr(m.addr)
            except ValueError:
                continue  # no port to offset: no heartbeat for it
            peers[m.name] = ((host, port + offset), m.state)
        self.rt.heartbeat.set_peers(peers)
        if self.rt.quorum is not None:
            self.rt.heartbeat.set_quorum_basis(*self.rt.quorum.basis(members))

    def push(self) -> None:
        """Hand the published metadata to the heartbeats too, so peers get it at once (a drain), not a gossip
        round later. Called after the modes applied it: a peer that hears of this node's drain takes its
        VIPs at once, and this node's hand-off must be armed by then (else both answer until it decides)."""
        if self.rt.heartbeat is not None and self.last_meta and self.last_meta is not self._pushed:
            self.rt.heartbeat.set_meta(self.last_meta)
            self._pushed = self.last_meta

    def publish(self) -> None:
        assert self.rt.membership is not None
        meta = self.meta()
        if meta == self.last_meta:
            return
        try:
            self.rt.membership.set_meta(meta)
            self.last_meta = meta
            self.meta_error = ""
        except kinship.MetaTooLarge:
            self.meta_error = "metadata larger than 512 bytes"
            logs.event(log, "metadataTooLarge", "labels used by node selectors do not fit in 512 bytes; "
                       "deciding from the last published state", logging.ERROR,
                       labels=sorted(self.config.codec.label_keys if self.config.codec else []))
        except (kinship.KinshipError, TimeoutError) as exc:
            self.meta_error = str(exc)[:300]
            logs.event(log, "metadataFailed", f"{exc}; deciding from the last published state", logging.WARNING)
