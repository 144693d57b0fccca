"""The config in use and its reloads (issue 23: one job out of the speaker's daemon.py).

``ConfigState`` holds what a speaker runs from: the config (``cfg``), the gossip keyring read from its
key file (``keys``) and the metadata codec made from it (``codec``), with the file's ``ConfigHolder``.

- ``load()``: read the file again (config.ConfigHolder) and run the checks beyond the schema
  (configcheck.check_extra); a file that fails them is refused whole, the last good config kept;
- ``apply(cfg, first)``: use a loaded config: the settings read once at start (``RESTART_FIELDS``) keep
  their running values and are listed as ``restartPending``; a new codec, the health checks configured;
- ``reload()``: the decision thread's SIGHUP or control-socket reload, logged ``configUnchanged``,
  ``configLoaded`` or ``configStale``; ``reload_and_wait()`` is the control socket's side of it;
- ``use_keys()`` / ``poll_key_file()``: gossip and heartbeats take the key file's keyring together, also
  when the file changes without a reload.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

import kinship

from . import logs
from .config import ConfigHolder, KeyFileWatch, SpeakerConfig
from .configcheck import check_extra, health_specs, label_keys, local_services
from .membership import KeyFileError, read_key_file
from .metadata import MetaCodec
from .runtime import Runtime

log = logging.getLogger("nocloudlb.speaker")

#: Settings read once at start: a reload keeps the running values and says a restart is needed.
RESTART_FIELDS = ("node_name", "bind", "join", "profile", "overrides", "socket", "metrics_bind", "state_dir",
                  "handover_grace", "announce_rate", "announce_burst", "start_settle",
                  "flow_rate", "flow_burst", "witness")  # mode: bgp (flow_*) (read when the BGP mode starts)


class ConfigState:
    def __init__(self, config_path: str, rt: Runtime) -> None:
        self.holder = ConfigHolder(config_path)
        self.rt = rt  # health (configured), heartbeat and membership (keys), post
        self.cfg: SpeakerConfig | None = None
        self.keys: list[str] | None = None
        self.codec: MetaCodec | None = None
        self.restart_pending: list[str] = []
        self._last_good_at = ""
        self._previous_local: list[str] | None = None  # Local-policy services of the config run before this one
        self._key_watch: KeyFileWatch | None = None  # memberlist.keyFile as last read (None: no key file)
        self._reloaded = threading.Condition()
        self._reload_count = 0
        self._last_reload: dict[str, Any] = {}

    def status(self) -> dict[str, Any]:
        """The status document's ``config``: the holder's state and the settings waiting for a restart."""
        return self.holder.status() | {"restartPending": self.restart_pending}

    def load(self) -> tuple[bool, SpeakerConfig | None]:
        ok, cfg = self.holder.reload()
        # the key file's identity before it is read: a change made meanwhile is seen by the next poll
        watch = KeyFileWatch(cfg.key_file) if ok and cfg is not None and cfg.key_file else None
        if (ok and cfg is not None and self.holder.unchanged and cfg is self.cfg
                and not any(p.password_file for p in cfg.parsed.bgp_peers)):
            # the very file in use (digest first): only the key file may have changed beside it
            # (files it names beside the key file, BGPPeer passwordFile, are read again below)
            if cfg.key_file:
                self._key_watch = watch
                try:
                    self.keys = read_key_file(cfg.key_file)
                except KeyFileError as exc:
                    with self.holder._lock:
                        self.holder.state, self.holder.errors = "error", [str(exc)]
                    return False, self.cfg
            return ok, cfg
        if ok and cfg is not None:
            keys, extra = check_extra(cfg)
            if extra:
                # refuse the whole file: keep the last good config, as for a schema error
                with self.holder._lock:
                    self.holder.current = self.cfg
                    self.holder.state, self.holder.errors = "error", extra
                    self.holder.last_good_at = self._last_good_at
                return False, self.cfg
            self.keys, self._key_watch = keys, watch
        return ok, cfg

    def apply(self, cfg: SpeakerConfig, first: bool) -> None:
        prev = self.cfg
        if prev is not None:
            # settings read once at start keep their running values until the next restart
            changed = [f for f in RESTART_FIELDS if getattr(prev, f) != getattr(cfg, f)]
            cfg = replace(cfg, **{f: getattr(prev, f) for f in changed})
            self.restart_pending = sorted(set(self.restart_pending) | set(changed))
            if changed:
                logs.event(log, "configRestartNeeded", "these settings keep their running values until the "
                           "next restart", logging.WARNING, settings=changed)
        self.cfg = cfg
        self._last_good_at = self.holder.last_good_at
        previous = self._previous_local
        if prev is not None and local_services(prev.parsed) != local_services(cfg.parsed):
            previous = self._previous_local = local_services(prev.parsed)
        self.codec = MetaCodec(local_services(cfg.parsed), label_keys(cfg.parsed), cfg.digest, previous=previous)
        assert self.rt.health is not None
        self.rt.health.configure(health_specs(cfg.parsed)[0])
        if prev is not None:
            self.use_keys(self.keys)
        logs.event(log, "configLoaded", path=cfg.path, digest=cfg.digest, pools=len(cfg.parsed.pools),
                   services=len(cfg.parsed.services), l2Advertisements=len(cfg.parsed.l2_advertisements),
                   first=first)

    def use_keys(self, keys: list[str] | None) -> None:
        """Gossip and heartbeats take the key file's keyring together: the first key signs and encrypts,
        every key verifies and decrypts, a key the file no longer lists is refused from now on."""
        if keys is None:
            return  # no key file: switching a running node between keyed and unkeyed needs a restart
        self.keys = keys
        if self.rt.heartbeat is not None:
            self.rt.heartbeat.set_keys(keys)
        if self.rt.membership is not None and keys != self.rt.membership.keys:
            try:
                self.rt.membership.set_keys(keys)
            except (kinship.KinshipError, ValueError, TimeoutError) as exc:
                logs.event(log, "memberlistKeysFailed", str(exc), logging.ERROR)

    def poll_key_file(self) -> None:
        """A key file changed without a SIGHUP (config.KeyFileWatch: one stat, at most every 0.5 s) is
        read and used at once; one that cannot be read is refused once, the keys in use kept."""
        watch = self._key_watch
        if watch is None or not watch.changed(time.monotonic()):
            return
        self._key_watch = KeyFileWatch(watch.path)  # before the read: a change made meanwhile is seen next
        try:
            keys = read_key_file(watch.path)
        except KeyFileError as exc:
            logs.event(log, "keyFileRefused", f"{exc}; gossip and heartbeats keep the keys in use",
                       logging.ERROR, path=watch.path)
            return
        if keys != self.keys:
            logs.event(log, "keyFileChanged", "the key file changed: gossip and heartbeats use its keys now",
                       path=watch.path, keys=len(keys))
            self.use_keys(keys)

    def reload_and_wait(self, timeout: float = 10.0) -> dict[str, Any]:
        """The control socket's reload: run by the decision thread; answers with its outcome (errors,
        and the settings that keep their running values until a restart)."""
        with self._reloaded:
            seen = self._reload_count
            self.rt.post("reload")
            if not self._reloaded.wait_for(lambda: self._reload_count != seen, timeout):
                return {"ok": True, "queued": True}
            return dict(self._last_reload, queued=True)

    def reload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": False, "error": "the reload failed; see the log (stepFailed, step reload)"}
        try:
            out = self._reload()
            return out
        finally:  # an exception goes on to the loop's barrier; the waiting control request gets told
            with self._reloaded:
                self._last_reload = out
                self._reload_count += 1
                self._reloaded.notify_all()

    def _reload(self) -> dict[str, Any]:
        ok, cfg = self.load()
        if ok and cfg is not None and cfg is self.cfg and self.holder.unchanged:
            logs.event(log, "configUnchanged", "the file is the one in use; nothing to apply", digest=cfg.digest)
            self.use_keys(self.keys)
        elif ok and cfg is not None:
            self.apply(cfg, first=False)
            self.rt.post()
        else:
            logs.event(log, "configStale", "the new config is refused; the last good one keeps being served",
                       logging.ERROR, errors=self.holder.errors, lastGoodAt=self.holder.last_good_at)
        return {"ok": ok, "config": self.holder.status() | {"restartPending": self.restart_pending},
                "restartPending": self.restart_pending}
