"""Talking to the node's FRR: write frr.conf, check and apply it with frr-reload.py, ask bgpd.

``FrrControl`` runs every FRR command through ``prefix`` (empty on a node; a test that drives
the FRR of a lab host passes its ``nsenter`` command line and ``root`` = ``/proc/PID/root``).
``query`` asks bgpd on its vty socket with a deadline, so a hung bgpd is seen as hung instead
of blocking the caller (vtysh has no timeout of its own).
"""

from __future__ import annotations

import grp
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..state import atomic_write

RELOAD = "/usr/lib/frr/frr-reload.py"


class FrrError(RuntimeError):
    """An FRR command failed or did not answer in time."""


@dataclass
class FrrControl:
    conf: str = "/etc/frr/frr.conf"
    rundir: str = "/run/frr"
    reload_tool: str = RELOAD
    vtysh: str = "vtysh"
    prefix: list[str] = field(default_factory=list)
    root: str = ""  # the host's root as this process sees it ("" = "/")
    group: str = "frr"
    workdir: str = ""  # frr-reload's --rundir (its temp files); "" = FRR's /var/run/frr (root only)

    def path(self, p: str) -> str:
        return self.root + p if self.root else p

    def run(self, args: list[str], timeout: float = 30.0, input_text: str | None = None) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.prefix + args, capture_output=True, text=True, timeout=timeout,
                                  input=input_text, check=False)
        except subprocess.TimeoutExpired as exc:
            raise FrrError(f"{args[0]}: no answer within {timeout:g} s") from exc
        except OSError as exc:
            raise FrrError(f"{args[0]}: {exc}") from exc

    def _gid(self) -> int:
        with open(self.path("/etc/group"), encoding="utf-8") as fh:
            for line in fh:
                parts = line.strip().split(":")
                if len(parts) >= 3 and parts[0] == self.group:
                    return int(parts[2])
        if not self.root:
            return grp.getgrnam(self.group).gr_gid
        raise FrrError(f"group {self.group!r} not found")

    def write(self, text: str, path: str | None = None) -> str:
        """Write ``text`` atomically to ``path`` (default: frr.conf), mode 0640 group frr. Returns the path.

        Unprivileged (the unit), the frr role's setgid /etc/frr gives the group when chown may not.
        """
        target = path or self.conf
        try:
            gid: int | None = self._gid()
        except (OSError, FrrError, KeyError):
            gid = None  # no frr group: 0640 still keeps others out
        atomic_write(Path(self.path(target)), text.encode("utf-8"), 0o640, gid)
        return target

    def staged(self) -> str:
        """Where a candidate config is written before it is tested (beside frr.conf, same rights)."""
        return os.path.join(os.path.dirname(self.conf), "frr.conf.nocloudlb-new")

    def _reload_args(self, action: str, path: str) -> list[str]:
        args = ["python3", self.reload_tool, action, "--stdout"]
        if self.workdir:
            args += ["--rundir", self.workdir]
        return args + [path]

    def test(self, path: str, timeout: float = 60.0) -> str:
        """``frr-reload.py --test``: parses the file and prints the changes; raises FrrError when it refuses."""
        proc = self.run(self._reload_args("--test", path), timeout=timeout)
        if proc.returncode != 0:
            raise FrrError(f"frr-reload --test refused the config (exit {proc.returncode}): "
                           f"{_tail(proc.stdout + proc.stderr)}")
        return proc.stdout

    def reload(self, path: str, timeout: float = 60.0) -> str:
        proc = self.run(self._reload_args("--reload", path), timeout=timeout)
        if proc.returncode != 0:
            raise FrrError(f"frr-reload --reload failed (exit {proc.returncode}): {_tail(proc.stdout + proc.stderr)}")
        return proc.stdout

    def configure(self, lines: list[str], timeout: float = 5.0) -> None:
        """Run configuration ``lines`` in one vtysh call (``configure terminal`` first)."""
        args = [self.vtysh, "-c", "configure terminal"]
        for line in lines:
            args += ["-c", line]
        proc = self.run(args, timeout=timeout)
        if proc.returncode != 0 or "% " in proc.stdout:
            raise FrrError(f"vtysh: {_tail(proc.stdout + proc.stderr)}")

    def forwarding(self) -> tuple[bool, bool]:
        """The node's IPv4 and IPv6 forwarding switches (read in its network namespace)."""
        proc = self.run(["cat", "/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"],
                        timeout=5.0)
        values = proc.stdout.split()
        if proc.returncode != 0 or len(values) != 2:
            raise FrrError(f"cannot read the forwarding switches: {proc.stderr.strip()}")
        return values[0] == "1", values[1] == "1"

    def query(self, command: str, daemon: str = "bgpd", timeout: float = 1.0) -> str:
        """One command on ``daemon``'s vty socket, answered within ``timeout`` or FrrError."""
        deadline = time.monotonic() + timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            try:
                sock.connect(self.path(os.path.join(self.rundir, daemon + ".vty")))
                sock.sendall(command.encode() + b"\0")
                buf = b""
                while not (len(buf) >= 4 and buf[-4:-1] == b"\0\0\0"):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    sock.settimeout(left)
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise FrrError(f"{daemon}: closed the connection")
                    buf += chunk
            except TimeoutError as exc:
                raise FrrError(f"{daemon}: no answer within {timeout:g} s") from exc
            except OSError as exc:
                raise FrrError(f"{daemon}: {exc}") from exc
        finally:
            sock.close()
        if buf[-1] != 0:
            raise FrrError(f"{daemon}: {command!r} failed (status {buf[-1]}): {buf[:-4].decode(errors='replace')}")
        return buf[:-4].decode(errors="replace")

    def query_json(self, command: str, daemon: str = "bgpd", timeout: float = 1.0) -> Any:
        text = self.query(command, daemon, timeout)
        try:
            return json.loads(text) if text.strip() else {}
        except ValueError as exc:
            raise FrrError(f"{daemon}: {command!r} did not return JSON: {text[:200]!r}") from exc


def _tail(text: str, lines: int = 12) -> str:
    return " | ".join(line for line in text.strip().splitlines()[-lines:] if line.strip())
