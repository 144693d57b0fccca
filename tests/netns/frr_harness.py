"""Real FRR daemons (zebra, bgpd) in a host namespace of a segment (netns.py), without systemd.

FRR is not installed on the test machine; the lab's base image has it (FRR 8.4 with frr-reload.py,
``/var/cache/nocloudlb-lab/base-bookworm-*``, built by roles/lab/files/labctl.py). Each ``FrrHost``
is a holder process in the host's network namespace with a mount, PID and UTS namespace of its
own, chrooted into the image, with fresh tmpfs on ``/run``, ``/tmp``, ``/etc/frr`` and
``/var/log`` (the image itself is never written). The daemons are started with ``nsenter`` into
it, and ``control()`` is the ``FrrControl`` a node's speaker would have (commands through
``nsenter``, files through ``/proc/PID/root``), as the lab's tests drive a lab host's FRR.
``close()`` kills the holder (SIGKILL by its PID); unshare's ``--kill-child`` takes the
namespace's PID 1, and every daemon with it. No pytest dependency, so benchmarks use it too.
"""

from __future__ import annotations

import glob
import json
import os
import select
import signal
import subprocess
import time
from typing import Any

from netns import NetnsError, Segment
from nocloudlb.bgp.frr import FrrControl

CACHE = os.environ.get("NLAB_CACHE_ROOT", "/var/cache/nocloudlb-lab")

# $1 the image, $2 the hostname. Mounts are private to the holder's mount namespace.
HOLDER = r"""
set -e
R=$1
mount --make-rprivate /
hostname "$2"
mount -t proc proc "$R/proc"
mount -t tmpfs -o mode=755 tmpfs "$R/run"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
mount -t tmpfs -o mode=755 tmpfs "$R/etc/frr"
mount -t tmpfs -o mode=755 tmpfs "$R/var/log"
mount --rbind /dev "$R/dev"
exec chroot "$R" /bin/sh -c 'mkdir -p /run/frr && chown frr:frr /run/frr /etc/frr && chmod 2775 /etc/frr \
  && : > /etc/frr/vtysh.conf && echo ready && exec sleep infinity'
"""

BASE_CONF = "frr defaults traditional\nhostname {name}\nlog syslog informational\nservice integrated-vtysh-config\n!\n"


def frr_image() -> str | None:
    """A lab base image with FRR and frr-reload.py (bookworm's FRR 8.4 first), or None."""
    found = sorted(glob.glob(os.path.join(CACHE, "base-*", "usr", "lib", "frr", "frr-reload.py")),
                   key=lambda p: ("bookworm" not in p, p))
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(found[0])))) if found else None


class FrrHost:
    """zebra and bgpd in namespace ``ns`` of ``seg``, from ``image``."""

    def __init__(self, seg: Segment, ns: str, name: str, image: str) -> None:
        self.seg, self.ns, self.name = seg, ns, name
        self.proc = seg.popen(ns, ["unshare", "--mount", "--pid", "--uts", "--fork", "--kill-child",
                                   "sh", "-c", HOLDER, "holder", image, name])
        assert self.proc.stdout is not None
        ready, _w, _x = select.select([self.proc.stdout], [], [], 20)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            err = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
            self.close()
            raise NetnsError(f"{name}: the FRR holder did not start: {line!r} {err[-500:]}")
        self.pid = self._child()
        self.prefix = ["nsenter", "-t", str(self.pid), "-m", "-u", "-n", "-p", "-r", "-w"]
        self.root = f"/proc/{self.pid}/root"

    def _child(self) -> int:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children", encoding="ascii") as fh:
                    kids = fh.read().split()
            except OSError:
                kids = []
            if kids:
                return int(kids[0])
            time.sleep(0.02)
        raise NetnsError(f"{self.name}: the holder's namespace has no PID 1")

    def control(self, **kwargs: Any) -> FrrControl:
        return FrrControl(prefix=list(self.prefix), root=self.root, **kwargs)

    def run(self, argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.prefix + argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise NetnsError(f"{self.name}: {argv[:3]} failed (rc={proc.returncode}): {proc.stderr.strip()[-500:]}")
        return proc

    def start(self, conf: str = "") -> None:
        """Write frr.conf (``conf`` after the usual header) and start zebra and bgpd with it."""
        with open(self.root + "/etc/frr/frr.conf", "w", encoding="utf-8") as fh:
            fh.write(BASE_CONF.format(name=self.name) + conf)
        for daemon in ("zebra", "bgpd"):
            self.run([f"/usr/lib/frr/{daemon}", "-d", "-F", "traditional", "-A", "127.0.0.1",
                      "-f", "/etc/frr/frr.conf"])
        deadline = time.monotonic() + 10
        while not os.path.exists(self.root + "/run/frr/bgpd.vty"):
            if time.monotonic() > deadline:
                raise NetnsError(f"{self.name}: bgpd's vty socket did not appear")
            time.sleep(0.05)

    def vtysh(self, *commands: str, timeout: float = 60) -> str:
        argv = ["vtysh"]
        for c in commands:
            argv += ["-c", c]
        return self.run(argv, timeout=timeout).stdout

    def json(self, command: str, timeout: float = 60) -> Any:
        return json.loads(self.vtysh(command, timeout=timeout) or "{}")

    def received(self, peer: str, family: str = "ipv4") -> int:
        """Prefixes this host has received from ``peer`` (its summary's pfxRcd)."""
        peers = self.json(f"show bgp {family} unicast summary json").get("peers", {})
        return int(peers.get(peer, {}).get("pfxRcd", 0) or 0)

    def table(self, family: str = "ipv4") -> dict[str, Any]:
        """This host's BGP table for ``family`` (prefix -> paths)."""
        return self.json(f"show bgp {family} unicast json").get("routes", {})

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def router_lines(asn: int, peers: dict[str, int], families: tuple[str, ...] = ("ipv4",)) -> list[str]:
    """vtysh lines for a plain router: ``asn``, each peer address with its ASN, fast connect retry,
    no policy required, every peer activated in ``families``."""
    lines = ["configure terminal", f"router bgp {asn}", "no bgp ebgp-requires-policy", "no bgp default ipv4-unicast"]
    for addr, remote in peers.items():
        lines += [f"neighbor {addr} remote-as {remote}", f"neighbor {addr} timers connect 1"]
    for fam in families:
        lines.append(f"address-family {fam} unicast")
        lines += [f"neighbor {addr} activate" for addr in peers]
        lines.append("exit-address-family")
    return lines
