"""In-process speakers for tests of the decision path (no test here).

A real ``Speaker`` (real config loading, real kinship membership on loopback, real health
checker, control socket) whose layer-2 side effects are recorded instead of sent: raw sockets
and addresses on ``lo`` of the machine running the tests are out of bounds, so the announcer
and the delivery module are stand-ins that write every call into one journal, in order. What
reaches the wire is tested in tests/netns with real speakers.

Peers are real kinship members (``Membership``) publishing metadata built with the speaker's
own codec, so the speaker decodes them exactly as it decodes another speaker.
"""

from __future__ import annotations

import base64
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from nocloudlb.daemon import Speaker
from nocloudlb.membership import Membership, MembershipSettings, generate_key

# the documents, the VIP choice and the waiting come from the one speaker test harness
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "netns"))
from speaker_harness import pool_docs, service_doc, spread_vips, wait_for  # noqa: E402

__all__ = ["Harness", "Journal", "RecordingAnnouncer", "RecordingDelivery", "alive", "announcer_of", "decided",
           "mac_field", "pool_docs", "run_loop", "service_doc", "vips_led", "wait_for"]


def free_ports(n: int, avoid: Iterable[int] = ()) -> list[int]:
    """``n`` distinct gossip ports on 127.0.0.1, each free for TCP and UDP with the next port (the heartbeats'
    ``port + 1``) free for UDP too, and none next to a port of ``avoid`` (ports handed out before and perhaps
    not bound yet). Chosen below the kernel's ephemeral range (32768-60999): a port the kernel handed out as
    free for UDP alone was once taken for TCP (a client's source port) before kinship bound it ("Address
    already in use"). Each pytest-xdist worker draws from a range of its own (gw0 20000-22999, gw1
    23000-25999, ...), so two workers never pick the same port between its check and its bind."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    k = int(worker[2:]) % 4 if worker[2:].isdigit() else 0
    low = 20000 + 3000 * k
    rng = random.Random()
    taken = set(avoid)
    out: list[int] = []
    while len(out) < n:
        port = rng.randrange(low, low + 2998)
        if taken & {port - 1, port, port + 1}:
            continue
        try:
            for p, kind in ((port, socket.SOCK_STREAM), (port, socket.SOCK_DGRAM), (port + 1, socket.SOCK_DGRAM)):
                with socket.socket(socket.AF_INET, kind) as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        out.append(port)
        taken.add(port)
    return out


def free_port(avoid: Iterable[int] = ()) -> int:
    return free_ports(1, avoid)[0]


def vips_led(nodes: list[str], per_node: int = 2) -> dict[str, str]:
    """ip -> leader among ``nodes`` (hash order), ``per_node`` VIPs for each (``spread_vips``)."""
    return spread_vips(nodes, per_node)


class Journal(list):
    """Every side effect, in order: ("announce", {ip: ifaces}, skip), ("handOff", [ips], seconds), ("lo", {ips}),
    ("reannounce", [ips])."""

    def announced(self) -> dict[str, list[str]]:
        last = [e for e in self if e[0] == "announce"]
        return dict(last[-1][1]) if last else {}

    def ever_announced(self) -> set[str]:
        return {ip for e in self if e[0] == "announce" for ip in e[1]}


class RecordingAnnouncer:
    """The L2Announcer's interface; records calls. ``fail`` makes set_announced raise (once per call)."""

    MAC = "02:00:00:00:aa:01"

    def __init__(self, journal: Journal, node_name: str, logger: logging.Logger,
                 is_peer_mac: Callable[[bytes], bool] | None = None, **_kw: Any) -> None:
        self.journal = journal
        self.node_name = node_name
        self.is_peer_mac = is_peer_mac
        self.current: dict[str, list[str]] = {}
        self.fail = 0
        self.times: list[tuple[float, dict]] = []
        self.ifaces = ["eth0"]
        self.handoffs: dict[str, float] = {}  # ip -> when its hand-off began (no bound: a record only)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def set_announced(self, vips: dict[str, list[str]], skip_check: Any = (),
                      hand_off: Mapping[str, Any] | None = None, hand_off_seconds: float = 2.5,
                      take: Any = ()) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError("injected failure")
        self.current = {ip: list(v) for ip, v in vips.items()}
        for ip in self.current:
            self.handoffs.pop(ip, None)  # given back: announced again
        now = time.monotonic()
        self.handoffs.update({ip: now for ip in hand_off or {} if ip not in self.current})
        self.times.append((now, dict(self.current)))
        self.journal.append(("announce", dict(self.current), set(skip_check)))
        if hand_off:
            self.journal.append(("handOff", sorted(hand_off), hand_off_seconds))

    def end_handoffs(self) -> None:
        self.handoffs.clear()

    def handing_off(self) -> dict[str, float]:
        now = time.monotonic()
        return {ip: round(now - since, 3) for ip, since in self.handoffs.items()}

    def reannounce(self, ips: Any) -> list[str]:
        done = [ip for ip in ips if ip in self.current]
        self.journal.append(("reannounce", done))
        return done

    def stats(self) -> dict:
        return {"interfaces": list(self.ifaces), "macs": dict.fromkeys(self.ifaces, self.MAC),
                "vips": {ip: {"state": "announcing", "interfaces": list(self.ifaces)} for ip in self.current}}

    def conflicts(self) -> list[dict]:
        return []


class RecordingDelivery:
    """``nocloudlb.l2.delivery``'s interface; records what would be on lo. ``fail`` makes the sync raise."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.fail = 0
        self.on_lo: set[str] = set()

    def prepare_host(self) -> dict:
        return {}

    def sync_lo_vips(self, ips: Any, state_file: Any = None) -> dict:
        if self.fail:
            self.fail -= 1
            self.journal.append(("loFailed", set(ips)))
            raise OSError("injected: cannot add an address to lo")
        self.on_lo = set(ips)
        self.journal.append(("lo", set(ips)))
        return {"added": [], "removed": []}


class Harness:
    """Builds speakers and peers on loopback; ``close()`` stops all of them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.speakers: list[Speaker] = []
        self.peers: list[Membership] = []
        self.ports: dict[str, int] = {}
        self.keys = [generate_key()]  # the cluster's gossip key: every speaker's key file, every peer's keyring
        self._signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

    def port(self, name: str) -> int:
        if name not in self.ports:
            self.ports[name] = free_port(self.ports.values())
        return self.ports[name]

    def config(self, name: str, resources: list[dict], labels: dict | None = None, join: list[str] = (),
               **extra: Any) -> dict:
        d = self.tmp / name
        d.mkdir(exist_ok=True)
        key_file = self.key_file(name)
        if not key_file.exists():
            self.set_keys(name, self.keys)
        doc = {"node": {"name": name, "labels": labels or {}},
               "memberlist": {"bind": f"127.0.0.1:{self.port(name)}",
                              "join": [f"127.0.0.1:{self.port(n)}" for n in join], "profile": "fast",
                              "keyFile": str(key_file)},
               "stateDir": str(d / "state"), "socket": str(d / "speaker.sock"), "metrics": {"bind": ""},
               "logLevel": "info", "resources": resources}
        doc.update(extra)
        return doc

    def key_file(self, name: str) -> Path:
        return self.tmp / name / "memberlist.key"

    def set_keys(self, name: str, keys: list[str]) -> Path:
        """Write ``keys`` (the first one primary) into ``name``'s key file; a reload or a change of the
        file makes the running speaker take them."""
        path = self.key_file(name)
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(k + "\n" for k in keys))
        return path

    def write(self, name: str, doc: dict) -> Path:
        path = self.tmp / name / "config.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def speaker(self, name: str, resources: list[dict], join: list[str] = (), labels: dict | None = None,
                **extra: Any) -> Speaker:
        path = self.write(name, self.config(name, resources, labels, join, **extra))
        journal = Journal()
        delivery = RecordingDelivery(journal)
        sp = Speaker(str(path), announcer_factory=lambda *a, **k: RecordingAnnouncer(journal, *a, **k),
                     delivery=delivery)
        sp.journal = journal  # type: ignore[attr-defined]
        sp.delivery = delivery  # type: ignore[attr-defined]
        ok, cfg = sp._load()
        assert ok and cfg is not None, sp.holder.errors
        self.speakers.append(sp)
        sp._start(cfg)
        return sp

    def peer(self, name: str, meta: dict[str, str], join: list[str]) -> Membership:
        settings = MembershipSettings(name, f"127.0.0.1:{self.port(name)}",
                                      [f"127.0.0.1:{self.port(n)}" for n in join], list(self.keys), "fast")
        m = Membership(settings, on_change=lambda: None, logger=logging.getLogger(f"test.{name}"))
        m.start(meta)
        self.peers.append(m)
        return m

    def close(self) -> None:
        for sp in self.speakers:
            try:
                sp._shutdown()
            except Exception:  # noqa: BLE001, S110 - best effort
                pass
        for m in self.peers:
            m.leave(timeout=0.3)
        for sig, handler in self._signals.items():
            signal.signal(sig, handler)


def announcer_of(sp: Speaker) -> RecordingAnnouncer:
    return sp.announcer


def alive(sp: Speaker, names: set[str]) -> bool:
    assert sp.membership is not None
    return {m.name for m in sp.membership.members() if m.state == "alive"} >= names


def mac_field(*macs: str) -> str:
    """The ``m`` metadata field: base64 of 6-byte MACs."""
    return base64.b64encode(b"".join(bytes.fromhex(m.replace(":", "")) for m in macs)).decode()


def run_loop(sp: Speaker) -> tuple[threading.Thread, dict]:
    """Run the speaker's decision loop in a thread; the result dict gets "code" or "error"."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["code"] = sp._loop()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, out


def decided(sp: Speaker, names: set[str], timeout: float = 10.0) -> None:
    """Wait until ``sp`` sees ``names`` alive and has joined, then decide as its loop would: once (which hands
    the heartbeats the members), again once the heartbeats count a majority (a node never counts itself one
    before it knows the configured members)."""
    wait_for(lambda: {m.name for m in sp.membership.members() if m.state == "alive"} == names, timeout, "join")
    wait_for(sp.membership.first_join_done.is_set, timeout, "first join")
    sp.reconcile()
    wait_for(sp.quorum, timeout, "quorum")
    sp.reconcile()
