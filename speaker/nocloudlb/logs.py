"""JSON logs on stderr: one object per line, with MetalLB's event names.

Every record carries ``ts`` (ISO 8601, UTC), ``level``, ``logger`` and ``event``; extra
fields passed with :func:`event` are added as keys. Records from other libraries (kinship's
protocol thread among them) come out in the same shape with ``event`` = ``log``.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from typing import Any

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        out["event"] = getattr(record, "event", None) or "log"
        msg = record.getMessage()
        if msg:
            out["msg"] = msg
        if isinstance(fields, dict):
            for key, value in fields.items():
                out.setdefault(key, value)
        for key, value in vars(record).items():
            if key not in _RESERVED and key not in ("event", "fields") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def setup(level: str | int = "info", stream: Any = None) -> None:
    """Send every logger to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


def event(logger: logging.Logger, name: str, msg: str = "", level: int = logging.INFO, **fields: Any) -> None:
    """Log the event ``name`` with ``fields`` as JSON keys."""
    logger.log(level, msg, extra={"event": name, "fields": fields})
