"""Runtime state persisted in stateDir: the labels set with ``nocloudlb label``.

Writes are atomic (temp file in the same directory, fsync, rename, fsync of the directory)
so a crash leaves either the old or the new file, never a torn one; a drained node stays
drained after a restart.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

LABELS_FILE = "labels.json"


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
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class LabelStore:
    """Runtime label overrides: ``set`` values and ``unset`` keys (which hide static labels)."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / LABELS_FILE
        self.set: dict[str, str] = {}
        self.unset: list[str] = []
        self.load()

    def load(self) -> None:
        try:
            raw: Any = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.path}: cannot read runtime labels: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"{self.path}: expected a JSON object, got {type(raw).__name__}")
        self.set = {str(k): str(v) for k, v in (raw.get("set") or {}).items()}
        self.unset = [str(k) for k in (raw.get("unset") or [])]

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
        body = json.dumps({"set": new_set, "unset": sorted(new_unset)}, indent=1, sort_keys=True)
        atomic_write(self.path, body.encode() + b"\n", 0o644)
        self.set, self.unset = new_set, new_unset
