"""JSON logs on stderr: one object per line, with MetalLB's event names.

Every record carries ``ts`` (ISO 8601, UTC), ``level``, ``logger`` and ``event``; extra
fields passed with :func:`event` are added as keys. Records from other libraries (kinship's
protocol thread among them) come out in the same shape with ``event`` = ``log``.

Writing is off the threads that log (the daemon's ``setup``): a record is taken at event time
(its time, its message and fields are fixed then) and queued; one writer thread formats and
writes the queue in order, many lines per write. A decision that logs one event per VIP (10,000
``serviceAnnounced`` after a takeover) hands them over as one :class:`Batch`, each entry with its
own event time, so the decision thread pays an append per VIP instead of formatting and writing
a line. What the logs promise is unchanged: every event is written, in the order it happened,
with the time it happened. :func:`flush` waits until everything logged so far is written (the
daemon flushes when it stops; an ``atexit`` hook flushes at any interpreter exit, the loop's error
paths included). Without ``setup`` (library use, tests with ``caplog``) everything is written
synchronously, as plain ``logging`` does.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import json
import logging
import queue
import sys
import threading
import time
from typing import Any

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_SKIP = _RESERVED | {"event", "fields"}
_LEVELS = {lvl: logging.getLevelName(lvl).lower() for lvl in (logging.DEBUG, logging.INFO, logging.WARNING,
                                                              logging.ERROR, logging.CRITICAL)}
#: the writer writes at most this many lines at once
WRITE_CHUNK = 2000
#: queued items above which a logging thread waits for the writer (back-pressure, as a blocking write gave)
QUEUE_LIMIT = 50_000


class _Stamp:
    """``ts`` text for a record time; the second's text is cached (most records share their second)."""

    __slots__ = ("_head", "_sec")

    def __init__(self) -> None:
        self._sec = -1
        self._head = ""

    def __call__(self, created: float) -> str:
        sec = int(created)
        if sec != self._sec:
            self._head = _dt.datetime.fromtimestamp(sec, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
            self._sec = sec
        return f"{self._head}.{int((created - sec) * 1000):03d}+00:00"


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._stamp = _Stamp()
        self._stamp_lock = threading.Lock()

    def stamp(self, created: float) -> str:
        with self._stamp_lock:
            return self._stamp(created)

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.stamp(record.created),
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
            if key not in _SKIP and key not in out:
                out[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str, separators=(",", ":"))

    def line(self, logger: str, created: float, level: int, name: str, fields: dict[str, Any]) -> str:
        """The line ``format`` gives for an :func:`event` without a message (a Batch entry)."""
        out: dict[str, Any] = {"ts": self.stamp(created), "level": _LEVELS.get(level) or
                               logging.getLevelName(level).lower(), "logger": logger, "event": name}
        for key, value in fields.items():
            out.setdefault(key, value)
        return json.dumps(out, default=str, separators=(",", ":"))


class _Flush:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class _BatchItem:
    __slots__ = ("entries", "logger")

    def __init__(self, logger: logging.Logger, entries: list[tuple[float, int, str, dict[str, Any]]]) -> None:
        self.logger = logger
        self.entries = entries


_STOP = object()


class BackgroundHandler(logging.Handler):
    """The root handler of the daemon: queues records; its writer thread formats and writes them in order.

    On the writer thread itself (a :class:`Batch` turned into records for other handlers' sake)
    a record is formatted straight into the pending lines."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self.stream = stream
        self.setFormatter(JsonFormatter())
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending: list[str] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()
        self._ident = self._thread.ident

    # -- the logging threads ------------------------------------------------------------------
    def handle(self, record: logging.LogRecord) -> bool:
        if not self.filter(record):
            return False
        if threading.get_ident() == self._ident:
            self._pending.append(self.format(record))
            return True
        if self._stopped:  # after stop (late atexit logging): write at once
            self._write([self.format(record)])
            return True
        # fix what may change after now: the message (its args) and the exception's text (the record's
        # time, fields and extras are fixed at creation)
        if record.args:
            record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatter.formatException(record.exc_info)  # type: ignore[union-attr]
        self._put(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)

    def put_batch(self, logger: logging.Logger, entries: list[tuple[float, int, str, dict[str, Any]]]) -> None:
        if self._stopped or threading.get_ident() == self._ident:
            for created, level, name, fields in entries:
                _replay(logger, created, level, name, fields)
            return
        self._put(_BatchItem(logger, entries))

    def _put(self, item: Any) -> None:
        self._queue.put(item)
        if self._queue.qsize() > QUEUE_LIMIT:
            self.flush(timeout=5.0)

    def flush(self, timeout: float | None = 10.0) -> bool:  # type: ignore[override]
        """Wait until everything queued before this call is written; False on timeout."""
        if self._stopped or threading.get_ident() == self._ident or not self._thread.is_alive():
            return True
        mark = _Flush()
        self._queue.put(mark)
        return mark.done.wait(timeout)

    def close(self) -> None:
        """Write what is queued, stop the writer; later records are written at once."""
        if not self._stopped and self._thread.is_alive() and threading.get_ident() != self._ident:
            self._queue.put(_STOP)
            self._thread.join(timeout=10.0)
        self._stopped = True
        super().close()

    # -- the writer thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < WRITE_CHUNK:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            marks: list[_Flush] = []
            stop = False
            for item in items:
                try:
                    if isinstance(item, logging.LogRecord):
                        self._pending.append(self.format(item))
                    elif isinstance(item, _BatchItem):
                        self._batch(item)
                    elif isinstance(item, _Flush):
                        marks.append(item)
                    elif item is _STOP:
                        stop = True
                except Exception:  # noqa: BLE001 - one bad record never stops the writer
                    self._pending.append(json.dumps({"ts": "", "level": "error", "logger": "nocloudlb.logs",
                                                     "event": "logFormatFailed", "msg": repr(item)[:300]}))
                if len(self._pending) >= WRITE_CHUNK:
                    self._write(self._pending)
                    self._pending = []
            self._write(self._pending)
            self._pending = []
            for mark in marks:
                mark.done.set()
            if stop:
                self._stopped = True
                return

    def _batch(self, item: _BatchItem) -> None:
        logger = item.logger
        if _only_me(logger, self):  # the daemon's case: nothing else sees these records, format them directly
            fmt: JsonFormatter = self.formatter  # type: ignore[assignment]
            pending = self._pending
            for created, level, name, fields in item.entries:
                pending.append(fmt.line(logger.name, created, level, name, fields))
        else:
            for created, level, name, fields in item.entries:
                _replay(logger, created, level, name, fields)

    def _write(self, lines: list[str]) -> None:
        if not lines:
            return
        try:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # stderr gone (closed, broken pipe): nothing to write to
            pass


def _only_me(logger: logging.Logger, handler: logging.Handler) -> bool:
    """True when ``handler`` alone gets ``logger``'s records, with no filter on the way."""
    found: list[logging.Handler] = []
    lg: logging.Logger | None = logger
    while lg is not None:
        if lg.filters:
            return False
        found.extend(lg.handlers)
        lg = lg.parent if lg.propagate else None
    return found == [handler] and not handler.filters


def _replay(logger: logging.Logger, created: float, level: int, name: str, fields: dict[str, Any]) -> None:
    """A Batch entry as the record :func:`event` would have made at ``created``."""
    record = logger.makeRecord(logger.name, level, __file__, 0, "", (), None,
                               extra={"event": name, "fields": fields})
    record.created = created
    record.msecs = (created - int(created)) * 1000
    logger.handle(record)


_handler: BackgroundHandler | None = None


def setup(level: str | int = "info", stream: Any = None, background: bool = True) -> None:
    """Send every logger to ``stream`` (stderr) as JSON lines; ``background``: written by the writer
    thread (see the module docstring), otherwise by the thread that logs."""
    global _handler  # noqa: PLW0603 - one root handler per process
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, BackgroundHandler):
            old.close()
    _handler = None
    handler: logging.Handler
    if background:
        handler = _handler = BackgroundHandler(stream or sys.stderr)
    else:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


def flush(timeout: float = 10.0) -> bool:
    """Wait until every record logged so far is written (True), or ``timeout`` s (False)."""
    h = _handler
    return True if h is None else h.flush(timeout)


def shutdown() -> None:
    """Write what is queued and stop the writer thread; later records are written synchronously."""
    h = _handler
    if h is not None:
        h.close()


atexit.register(shutdown)


def event(logger: logging.Logger, name: str, msg: str = "", level: int = logging.INFO, **fields: Any) -> None:
    """Log the event ``name`` with ``fields`` as JSON keys."""
    logger.log(level, msg, extra={"event": name, "fields": fields})


class Batch:
    """Events of one pass (one per VIP) handed to the writer at once by :meth:`send`.

    Each entry keeps the time :meth:`event` was called; entries are written in the order added,
    after everything logged before :meth:`send`. Without the background writer each event is
    logged at once."""

    __slots__ = ("_enabled", "_entries", "_handler", "logger")

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._handler = _handler if _handler is not None and not _handler._stopped else None
        self._entries: list[tuple[float, int, str, dict[str, Any]]] = []
        self._enabled: dict[int, bool] = {}

    def event(self, name: str, level: int = logging.INFO, **fields: Any) -> None:
        if self._handler is None:
            event(self.logger, name, "", level, **fields)
            return
        on = self._enabled.get(level)
        if on is None:
            on = self._enabled[level] = self.logger.isEnabledFor(level)
        if on:
            self._entries.append((time.time(), level, name, fields))

    def send(self) -> None:
        if self._entries and self._handler is not None:
            self._handler.put_batch(self.logger, self._entries)
        self._entries = []

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.send()
