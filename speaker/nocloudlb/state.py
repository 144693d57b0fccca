"""Runtime state persisted in stateDir: the labels set with ``nocloudlb label``.

Writes are atomic (temp file in the same directory, fsync, rename, fsync of the directory)
so a crash leaves either the old or the new file, never a torn one; a drained node stays
drained after a restart.

A state file that is corrupt all the same (edited by hand, a disk error, a file from elsewhere) never
crash-loops the daemon: ``set_aside`` renames it ``NAME.corrupt-<UTC time>`` beside itself and logs
``stateFileCorrupt`` (level error: path, where it went, why). For ``labels.json`` the node then starts
*drained*, since the lost file may have held a drain: the drain label is written to a new file (or
held in memory when the directory cannot be written) and the operator undrains with
``nocloudlb label unset node.kubernetes.io/exclude-from-external-load-balancers`` once checked.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from nocloudlb.core.election import DRAIN_LABEL

from . import logs

LABELS_FILE = "labels.json"
log = logging.getLogger("nocloudlb.speaker")


def atomic_write(path: Path, data: bytes, mode: int = 0o644, gid: int | None = None) -> None:
    """Write ``data`` to ``path`` through a temp file and a rename; ``gid``: also give the file that
    group (when this process may not, the file keeps its default group: ``mode`` still applies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", dir=path.parent)  # 0600 until chmod
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if gid is not None:
            try:
                os.chown(tmp, -1, gid)
            except OSError:
                pass  # not a member of that group (or no such group here): the mode still keeps others out
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def set_aside(path: Path, reason: str) -> dict[str, Any]:
    """Rename the corrupt state file ``path`` to ``NAME.corrupt-<UTC time>`` in its directory; returns the
    record for ``report_corrupt`` and the status (path, setAside: "" when the rename failed, reason, at)."""
    at = _dt.datetime.now(_dt.UTC)
    target = path.with_name(f"{path.name}.corrupt-{at:%Y%m%dT%H%M%SZ}")
    n = 1
    while target.exists():  # two in the same second: keep both
        target = path.with_name(f"{path.name}.corrupt-{at:%Y%m%dT%H%M%SZ}-{n}")
        n += 1
    record: dict[str, Any] = {"path": str(path), "setAside": str(target), "reason": reason[:500],
                              "at": at.isoformat(timespec="seconds").replace("+00:00", "Z")}
    try:
        os.rename(path, target)
        _fsync_dir(path.parent)
    except OSError as exc:
        record["setAside"], record["error"] = "", f"cannot rename it: {exc.strerror or exc}"
    return record


def report_corrupt(record: dict[str, Any], consequence: str, **fields: Any) -> None:
    """Log ``stateFileCorrupt`` (level error) for a ``set_aside`` record."""
    where = f"set aside as {record['setAside']}" if record["setAside"] else f"left in place ({record.get('error')})"
    logs.event(log, "stateFileCorrupt", f"the state file {record['path']} is corrupt ({record['reason'][:300]}): "
               f"{where}; {consequence}", logging.ERROR, **record, **fields)


def _labels_problem(raw: Any) -> str:
    """What makes ``raw`` (labels.json parsed) unusable, "" when it is good."""
    from .config import runtime_label_problem  # noqa: PLC0415 - the config module imports more

    if not isinstance(raw, dict):
        return f"expected a JSON object, got {type(raw).__name__}"
    set_, unset = raw.get("set") or {}, raw.get("unset") or []
    if not isinstance(set_, dict):
        return f"'set' must be an object of label: value, got {type(set_).__name__}"
    if not isinstance(unset, list):
        return f"'unset' must be a list of label keys, got {type(unset).__name__}"
    for key, value in set_.items():
        if not isinstance(value, str):
            return f"'set' label {key!r}: value {value!r} is not a string"
        problem = runtime_label_problem(key, value)
        if problem:
            return f"'set': {problem}"
    for key in unset:
        problem = runtime_label_problem(key) if isinstance(key, str) else f"key {key!r} is not a string"
        if problem:
            return f"'unset': {problem}"
    return ""


class LabelStore:
    """Runtime label overrides: ``set`` values and ``unset`` keys (which hide static labels)."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / LABELS_FILE
        self.set: dict[str, str] = {}
        self.unset: list[str] = []
        self.corrupt: dict[str, Any] = {}  # the stateFileCorrupt record when the file was set aside at load
        self.load()

    def load(self) -> None:
        """Read the file; a corrupt one is set aside and the node starts drained (module docstring).
        Only an unreadable file (permissions, I/O error) still raises: it cannot be judged."""
        try:
            text = self.path.read_bytes().decode("utf-8")
            raw: Any = json.loads(text)
        except FileNotFoundError:
            return
        except ValueError as exc:  # not UTF-8, not JSON
            problem = f"not JSON: {exc}"
        except OSError as exc:
            raise ValueError(f"{self.path}: cannot read runtime labels: {exc}") from exc
        else:
            problem = _labels_problem(raw)
            if not problem:
                self.set = dict(raw.get("set") or {})
                self.unset = list(raw.get("unset") or [])
                return
        self._start_drained(problem)

    def _start_drained(self, problem: str) -> None:
        self.set, self.unset = {}, []
        self.corrupt = set_aside(self.path, problem)
        consequence = ("the node starts drained, since the file may have held a drain: check it, then undrain "
                       f"with `nocloudlb label unset {DRAIN_LABEL}`")
        try:
            self.update({DRAIN_LABEL: "true"})
        except OSError as exc:  # the directory cannot be written: drained in memory all the same
            self.set = {DRAIN_LABEL: "true"}
            consequence += f" (drained in memory only: cannot write {self.path}: {exc.strerror or exc})"
            self.corrupt["persisted"] = False
        self.corrupt["drained"] = True
        report_corrupt(self.corrupt, consequence)

    def apply(self, static: dict[str, str]) -> dict[str, str]:
        """The node's effective labels: static ones, minus unset keys, plus set ones."""
        set_, unset = self.set, self.unset
        labels = {k: v for k, v in static.items() if k not in unset}
        labels.update(set_)
        return labels

    def update(self, set_: dict[str, str] | None = None, unset: list[str] | None = None) -> None:
        # build new containers and swap them in: readers on other threads never see a half update
        new_set, new_unset = dict(self.set), list(self.unset)
        for key, value in (set_ or {}).items():
            new_set[key] = value
            if key in new_unset:
                new_unset.remove(key)
        for key in unset or []:
            new_set.pop(key, None)
            if key not in new_unset:
                new_unset.append(key)
        self._write(new_set, new_unset)

    def drop(self, key: str) -> None:
        """Forget the runtime value of ``key`` (a static label of that key shows again: not an unset)."""
        self._write({k: v for k, v in self.set.items() if k != key}, list(self.unset))

    def _write(self, new_set: dict[str, str], new_unset: list[str]) -> None:
        body = json.dumps({"set": new_set, "unset": sorted(new_unset)}, indent=1, sort_keys=True)
        atomic_write(self.path, body.encode() + b"\n", 0o644)
        self.set, self.unset = new_set, new_unset
