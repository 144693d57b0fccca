"""Running ``nft``: one place that starts it, reads its exit status and distrusts its output.

``apply`` runs ``nft -f -`` (one transaction: all of the script or none of it), ``check`` the same
with ``-c`` (the kernel validates the batch and commits nothing), ``counters`` reads ``nft -j list
counters``. A non-zero exit, a timeout or a missing binary raise ``NftError`` with nft's own message
(cut to ``MESSAGE_MAX`` characters). Output nft does not print on success (anything on stdout of
``-f``, anything on stderr of a run that exited 0, JSON that does not parse or has not the shape of
``nft -j``) is counted and logged as ``nftUnexpectedOutput`` (at most once per ``LOG_EVERY`` seconds
with the count), and is never a failure by itself: the exit status is nft's answer.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from typing import Any

from ..logs import event

MESSAGE_MAX = 500
LOG_EVERY = 60.0


class NftError(RuntimeError):
    """nft did not apply (or check) a script; the message is nft's (or why it could not run)."""


class NftTool:
    def __init__(self, path: str, log: logging.Logger, timeout: float = 30.0) -> None:
        self.path = path
        self.log = log
        self.timeout = timeout
        self.runs = 0
        self.unexpected = 0  # runs whose output was not what nft prints
        self._lock = threading.Lock()
        self._logged_at = -1e9

    def apply(self, script: str) -> None:
        self._script(script, check=False)

    def check(self, script: str) -> None:
        self._script(script, check=True)

    def counters(self, family: str, table: str) -> dict[str, dict[str, int]]:
        """Counter name -> {packets, bytes} of one table ({} when nft fails or prints something else)."""
        try:
            proc = self._run(["-j", "list", "counters", "table", family, table], None)
        except NftError:
            return {}
        if proc.returncode != 0:
            return {}
        try:
            return _parse_counters(proc.stdout)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self._unexpected(f"nft -j list counters table {family} {table}", proc.stdout, str(exc))
            return {}

    # -- internals --------------------------------------------------------------------------
    def _script(self, script: str, check: bool) -> None:
        args = ["-c", "-f", "-"] if check else ["-f", "-"]
        proc = self._run(args, script)
        if proc.returncode != 0:
            raise NftError(_cut(proc.stderr.strip() or proc.stdout.strip() or f"nft exited with {proc.returncode}"))
        if proc.stdout.strip() or proc.stderr.strip():
            self._unexpected("nft " + " ".join(args), proc.stdout + proc.stderr, "nft printed output on success")

    def _run(self, args: list[str], script: str | None) -> subprocess.CompletedProcess[str]:
        with self._lock:
            self.runs += 1
        try:
            return subprocess.run([self.path, *args], input=script if script is not None else "", capture_output=True,
                                  text=True, errors="replace", timeout=self.timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise NftError(f"nft did not finish within {self.timeout:g}s") from exc
        except OSError as exc:
            raise NftError(f"cannot run {self.path}: {exc}") from exc

    def _unexpected(self, what: str, output: str, why: str) -> None:
        with self._lock:
            self.unexpected += 1
            count = self.unexpected
            due = time.monotonic() - self._logged_at >= LOG_EVERY
            if due:
                self._logged_at = time.monotonic()
        if due:
            event(self.log, "nftUnexpectedOutput", f"{what}: {why}; ignored (the exit status decides)",
                  logging.WARNING, output=_cut(output.strip(), 200), count=count)


def _cut(text: str, limit: int = MESSAGE_MAX) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_counters(text: str) -> dict[str, dict[str, int]]:
    doc: Any = json.loads(text or '{"nftables": []}')
    out: dict[str, dict[str, int]] = {}
    for item in doc["nftables"]:
        c = item.get("counter")
        if c:
            out[str(c["name"])] = {"packets": int(c.get("packets", 0)), "bytes": int(c.get("bytes", 0))}
    return out
