"""Delivery of VIP traffic: every VIP a node may serve sits on ``lo``; the kernel must never answer for it.

This is the LVS-DR real-server recipe. With ``arp_ignore=1`` the kernel answers ARP only
for addresses configured on the interface the request came in on, and with
``arp_announce=2`` it never uses a VIP as the sender address of its own ARP requests; so
a /32 on ``lo`` is accepted as a local destination but stays invisible to ARP, and only
the elected speaker answers for it, from userspace. (With ``arp_ignore=0``, every node
holding the VIP answers: the double-owner bug.)

IPv6 needs no switch: Linux answers a Neighbor Solicitation only for an address on the
interface it arrived on (unless proxy_ndp has an entry for it), so a /128 on ``lo`` gets
no NA from the kernel. Failover moves no address: every candidate holds all of them.

The sysctls are checked again on every reconcile (``verify_host``, cheap: two reads of
/proc/sys): if something lowered them (a sysctl reload, a network manager, an operator),
they are set back at once, logged as ``arpSysctlReset``, counted in
``nocloudlb_arp_sysctl_resets_total``, shown in ``nocloudlb_arp_sysctl_ok_bool`` and in the
status (``sysctl_status``). A stricter value (``arp_ignore=2`` or ``8``) is never lowered.
If one is wrong and cannot be set back (``arp_unsafe``), the layer-2 mode fails closed: the kernel
would answer for every IPv4 VIP on lo, so none stays there or is announced, and the node publishes
itself excluded (the drain label) until the sysctl is right again (``failClosed`` in the status).

Addresses this module adds are recorded in a state file (and IPv4 ones carry the label
``lo:nocloudlb``), so ``sync_lo_vips`` only ever removes addresses it added itself.

At size (issue 10: 10,000 VIPs) the addresses are read with one ``ip -json addr show dev lo`` and
changed with one ``ip -batch`` run (pyroute2's dump and one request per address took seconds);
without the ``ip`` command, or for a handful of changes, pyroute2 does it.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ..state import atomic_write, report_corrupt, set_aside
from .addresses import canonical_ips
from .addresses import parse as parse_ip

SYSCTLS = {
    "net.ipv4.conf.all.arp_ignore": "1",
    "net.ipv4.conf.all.arp_announce": "2",
}
LABEL = "lo:nocloudlb"
DEFAULT_STATE_FILE = "/run/nocloudlb/lo-vips.json"
IFA_F_NODAD = 0x02


def _sysctl_path(key: str, root: str = "/proc/sys") -> Path:
    return Path(root, *key.split("."))


def prepare_host(sysctls: dict[str, str] | None = None, root: str = "/proc/sys") -> dict[str, dict[str, str]]:
    """Set ``arp_ignore=1`` / ``arp_announce=2`` for all interfaces (the kernel uses the maximum of
    ``all`` and the interface's own value, so ``all`` covers every interface).

    Returns ``{key: {"old": ..., "new": ...}}`` for what changed. A value that is already
    right is left alone, so an unprivileged daemon works when the role set the sysctls; if
    a wrong value cannot be written, raises PermissionError naming the sysctl and values.
    """
    changed: dict[str, dict[str, str]] = {}
    for key, want in (sysctls or SYSCTLS).items():
        path = _sysctl_path(key, root)
        old = path.read_text().strip()
        if _at_least(old, want):
            continue  # already right, or stricter: never lowered
        try:
            path.write_text(want + "\n")
        except PermissionError:
            raise PermissionError(
                f"cannot set sysctl {key}={want} (currently {old}): run with privileges that may write "
                f"{path} or set it beforehand (the speaker role does)"
            ) from None
        changed[key] = {"old": old, "new": want}
    return changed


def _at_least(have: str, want: str) -> bool:
    try:
        return int(have) >= int(want)
    except ValueError:
        return False


class SysctlGuard:
    """Checks the ARP sysctls on every reconcile, sets back a lowered one, and keeps the record."""

    def __init__(self, sysctls: dict[str, str] | None = None, root: str = "/proc/sys",
                 logger: logging.Logger | None = None, registry: Any = "default") -> None:
        self.sysctls = dict(sysctls or SYSCTLS)
        self.root = root
        self.log = logger or logging.getLogger("nocloudlb.l2")
        self.ok = True
        self.resets = 0
        self.last_reset: dict[str, Any] | None = None
        self.error = ""
        self.unsafe = False  # wrong or unreadable after this check: the layer-2 mode fails closed
        self._lock = threading.Lock()
        self._gauge = self._counter = None
        if registry is not None:
            from prometheus_client import REGISTRY, Counter, Gauge  # noqa: PLC0415

            reg = REGISTRY if registry == "default" else registry
            self._gauge = Gauge("nocloudlb_arp_sysctl_ok_bool", "0 if arp_ignore/arp_announce were found below "
                                "the values that keep the kernel from answering ARP for VIPs on lo", registry=reg)
            self._counter = Counter("nocloudlb_arp_sysctl_resets", "Times a lowered arp_ignore/arp_announce "
                                    "was found and set back", registry=reg)
            self._gauge.set(1)

    def verify(self) -> bool:
        """Read each sysctl; set back any below its value. True when all were right (nothing to do)."""
        from ..logs import event  # noqa: PLC0415

        found_ok, errors = True, []
        for key, want in self.sysctls.items():
            path = _sysctl_path(key, self.root)
            try:
                have = path.read_text().strip()
            except OSError as exc:
                found_ok = False
                errors.append(f"cannot read {key}: {exc.strerror or exc}")
                continue
            if _at_least(have, want):
                continue
            found_ok = False
            try:
                path.write_text(want + "\n")
            except OSError as exc:
                errors.append(f"{key} is {have} (must be >= {want}) and cannot be set: {exc.strerror or exc}")
                event(self.log, "arpSysctlWrong", "the kernel may answer ARP for VIPs on lo", logging.ERROR,
                      sysctl=key, value=have, want=want, error=str(exc.strerror or exc))
                continue
            with self._lock:
                self.resets += 1
                self.last_reset = {"sysctl": key, "old": have, "new": want,
                                   "at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
            if self._counter is not None:
                self._counter.inc()
            event(self.log, "arpSysctlReset", "a lowered ARP sysctl was set back (something changed it)",
                  logging.ERROR, sysctl=key, old=have, new=want)
        with self._lock:
            self.ok, self.error, self.unsafe = found_ok, "; ".join(errors), bool(errors)
        if self._gauge is not None:
            self._gauge.set(1 if found_ok else 0)
        return found_ok

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"ok": self.ok, "failClosed": self.unsafe, "resets": self.resets, "lastReset": self.last_reset,
                    "error": self.error,
                    "want": {k: f">={v}" for k, v in self.sysctls.items()}}


_guard: SysctlGuard | None = None


def verify_host() -> bool:
    """The daemon's per-reconcile check of the ARP sysctls (see SysctlGuard.verify); True if nothing was wrong."""
    global _guard
    if _guard is None:
        _guard = SysctlGuard()
    return _guard.verify()


def arp_unsafe() -> bool:
    """True when the last check found an ARP sysctl wrong (or unreadable) and could not set it back."""
    return _guard is not None and _guard.unsafe


def sysctl_status() -> dict[str, Any]:
    """``status()["arpSysctls"]``: ok at the last check, resets so far, the last reset, any error."""
    return _guard.status() if _guard is not None else {}


def check_host(root: str = "/proc/sys") -> list[str]:
    """Problems that would let the kernel answer ARP for VIPs on lo (empty list: all good)."""
    problems = []
    for key, want in SYSCTLS.items():
        have = _sysctl_path(key, root).read_text().strip()
        if int(have) < int(want):
            problems.append(f"sysctl {key} is {have}, must be {want}")
    return problems


def _sort_key(ip: str) -> tuple[int, bytes]:
    _text, packed, version = parse_ip(ip)  # (version, packed): the order of (version, int(address))
    return (version, packed)


def _read_state(path: Path) -> set[str]:
    """The addresses this module added (the record). A corrupt record is set aside (``stateFileCorrupt``)
    and starts empty: every sync raised on it before, so no VIP got on lo and none was announced. Only
    IPv4 labels identify our addresses then: IPv6 ones added before stay on lo when no longer wanted
    (harmless there, the kernel never answers NDP for them). No drain: the record decides no owner."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
        managed = data["managed"] if isinstance(data, dict) else None
        if not isinstance(managed, list):
            raise ValueError(f"expected an object with a list 'managed', got {type(data).__name__}"
                             + (f" whose 'managed' is {type(managed).__name__}" if isinstance(data, dict) else ""))
        bad = next((ip for ip in managed if not isinstance(ip, str)), None)
        if bad is not None:
            raise TypeError(f"'managed' holds {bad!r}, not an address string")
        return {parse_ip(ip)[0] for ip in managed}
    except FileNotFoundError:
        return set()
    except (ValueError, KeyError, TypeError) as exc:
        report_corrupt(set_aside(path, f"{type(exc).__name__}: {exc}"), "the record of the addresses added to "
                       "lo starts empty: IPv6 VIPs added before may stay on lo when no longer wanted", drained=False)
        return set()


def _write_state(path: Path, managed: set[str]) -> None:
    atomic_write(path, json.dumps({"managed": sorted(managed, key=_sort_key)}).encode())


def lo_addresses() -> dict[str, str]:
    """Addresses on lo (host-scope 127/8 and ::1 included) -> IPv4 label or ''."""
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname="lo")[0]
        return {str(ipaddress.ip_address(a.get("IFA_ADDRESS"))): a.get("IFA_LABEL") or ""
                for a in ipr.get_addr(index=idx)}


BATCH_MIN = 16  # changes from which one ``ip -batch`` run replaces requests one by one
IP_TIMEOUT = 300.0


def _ip_cmd() -> str | None:
    return shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.access(p, os.X_OK)),
                                      None)


def _present_ip(ip_cmd: str) -> dict[str, str]:
    """Addresses on lo -> IPv4 label or '' (``ip -json``: fast at 10,000 addresses)."""
    out = subprocess.run([ip_cmd, "-json", "addr", "show", "dev", "lo"], capture_output=True, text=True,
                         check=True, timeout=IP_TIMEOUT).stdout
    links = json.loads(out or "[]")
    present: dict[str, str] = {}
    for link in links:
        for a in link.get("addr_info", []):
            if a.get("local"):
                present[parse_ip(a["local"])[0]] = a.get("label") or ""
    return present


def _batch(ip_cmd: str, lines: list[str]) -> str:
    """Run ``lines`` in one ``ip -force -batch -``; the first error it printed ('' when none)."""
    res = subprocess.run([ip_cmd, "-force", "-batch", "-"], input="".join(line + "\n" for line in lines),
                         capture_output=True, text=True, timeout=IP_TIMEOUT, check=False)
    if res.returncode == 0:
        return ""
    return next((ln for ln in res.stderr.splitlines() if ln.startswith("Error")), res.stderr.strip()[:200] or
                f"exit {res.returncode}")


def _sync_batch(ip_cmd: str, want: set[str], path: Path, managed: set[str]) -> dict[str, list[str]]:
    present = _present_ip(ip_cmd)
    managed |= {ip for ip, label in present.items() if label == LABEL}
    managed &= set(present) | want
    adds = [ip for ip in sorted(want, key=_sort_key) if ip not in present]
    dels = [ip for ip in sorted(managed - want, key=_sort_key) if ip in present]
    problem = ""
    if adds or dels:
        lines = [f"address del {ip}/{32 if ':' not in ip else 128} dev lo" for ip in dels]
        lines += [f"address add {ip}/32 dev lo label {LABEL}" if ":" not in ip else
                  f"address add {ip}/128 dev lo nodad" for ip in adds]
        error = _batch(ip_cmd, lines)
        if error:  # which ones took effect: read back (EEXIST from a racing writer is fine)
            now = _present_ip(ip_cmd)
            missing = [ip for ip in adds if ip not in now]
            stuck = [ip for ip in dels if ip in now]
            if missing or stuck:
                problem = (f"ip -batch on lo: {len(missing)} of {len(adds)} addresses not added"
                           f"{' (first ' + missing[0] + ')' if missing else ''}, {len(stuck)} of {len(dels)} "
                           f"not removed{' (first ' + stuck[0] + ')' if stuck else ''}: {error}")
            adds = [ip for ip in adds if ip in now]
            dels = [ip for ip in dels if ip not in now]
    managed |= set(adds)
    managed -= set(dels)
    _write_state(path, managed)
    if problem:
        raise OSError(problem)
    return {"added": adds, "removed": dels}


def sync_lo_vips(ips, state_file: str | os.PathLike = DEFAULT_STATE_FILE) -> dict[str, list[str]]:
    """Make the VIPs on lo exactly ``ips`` among the addresses this module manages.

    Adds each missing one as /32 (label ``lo:nocloudlb``) or /128 (nodad); removes the
    managed ones no longer wanted; never touches an address it did not add (an address
    the operator already had on lo is used as is and left in place).
    Returns ``{"added": [...], "removed": [...]}``.
    """
    want = set(canonical_ips(ips, "sync_lo_vips:"))
    path = Path(state_file)
    managed = _read_state(path)
    ip_cmd = _ip_cmd()
    if ip_cmd is not None and (len(want) >= BATCH_MIN or len(managed) >= BATCH_MIN):
        return _sync_batch(ip_cmd, want, path, managed)
    added: list[str] = []
    removed: list[str] = []
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname="lo")[0]
        present = {str(ipaddress.ip_address(a.get("IFA_ADDRESS"))): a.get("IFA_LABEL") or ""
                   for a in ipr.get_addr(index=idx)}
        managed |= {ip for ip, label in present.items() if label == LABEL}
        managed &= set(present) | want  # forget records of addresses someone else removed
        for ip in sorted(want, key=_sort_key):
            if ip in present:
                continue
            addr = ipaddress.ip_address(ip)
            try:
                if addr.version == 4:
                    ipr.addr("add", index=idx, address=ip, prefixlen=32, label=LABEL)
                else:
                    ipr.addr("add", index=idx, address=ip, prefixlen=128, IFA_FLAGS=IFA_F_NODAD)
            except NetlinkError as exc:
                if exc.code != 17:  # EEXIST: raced with another writer, fine
                    raise
            managed.add(ip)
            added.append(ip)
        for ip in sorted(managed - want, key=_sort_key):
            if ip in present:
                addr = ipaddress.ip_address(ip)
                try:
                    ipr.addr("del", index=idx, address=ip, prefixlen=32 if addr.version == 4 else 128)
                except NetlinkError as exc:
                    if exc.code != 99 and exc.code != 2:  # EADDRNOTAVAIL / ENOENT: already gone
                        raise
                removed.append(ip)
            managed.discard(ip)
    _write_state(path, managed)
    return {"added": added, "removed": removed}
