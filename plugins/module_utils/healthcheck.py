# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``nocloud.io/health-check`` forms and Go-style durations, parsed.

Both the Service annotation (``schema``) and the Backends' healthCheck (``backends``) read
checks with ``parse_health_check``; it lives here, below both, so neither imports the other
back (schema reads Backends through ``backends.parse_backends_spec``).
"""

from __future__ import annotations

import json
import re
import shlex
import urllib.parse
from typing import Any

from .pools import _q, parse_ip

HEALTH_CHECK_DEFAULTS = {"interval": 2.0, "timeout": 1.0, "rise": 2, "fall": 3}
HEALTH_CHECK_TYPES = ("tcp", "http", "https", "exec")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_DURATION_UNITS = {
    "ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
}


def parse_duration(text: Any) -> float:
    """Go's time.ParseDuration ("90s", "1m30s", "500ms"), in seconds. Raises ValueError with Go's wording."""
    if isinstance(text, bool) or not isinstance(text, str):
        raise ValueError(f"time: invalid duration {_q(text)}")
    s = text
    sign = 1.0
    if s[:1] in "+-" and s:
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"time: invalid duration {_q(text)}")
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if not m or m.group(1) in ("", "."):
            if re.match(r"[0-9.]+$", s[pos:]):
                raise ValueError(f"time: missing unit in duration {_q(text)}")
            raise ValueError(f"time: invalid duration {_q(text)}")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def parse_health_check(value: Any, ports: list[tuple[int, str]] | None = None) -> dict:
    """Parse the ``nocloud.io/health-check`` Service annotation.

    Accepted forms (the value is a string, as annotations are; a mapping is
    accepted too):

    - ``tcp://HOST:PORT`` - connect succeeds = healthy;
    - ``http://HOST:PORT/PATH`` or ``https://...`` - a 2xx/3xx answer = healthy;
    - ``exec:COMMAND ARGS`` - exit status 0 = healthy;
    - a JSON object ``{"type": "tcp|http|https|exec", "host": ..., "port": ...,
      "path": ..., "command": [...], "interval": 2, "timeout": 1, "rise": 2, "fall": 3}``.

    HOST defaults to 127.0.0.1, PORT to the service's first port, PATH to ``/``.
    Returns a dict with keys type, host, port, path, command, interval,
    timeout (seconds), rise, fall (consecutive results to turn healthy/unhealthy).
    Raises ValueError naming the problem.
    """
    ports = ports or []
    default_port = ports[0][0] if ports else None
    spec: dict[str, Any]
    if isinstance(value, dict):
        spec = dict(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                loaded = json.loads(text)  # starts with "{": an object or an error
            except ValueError as exc:
                raise ValueError(f"invalid JSON {_q(text)}: {exc}") from None
            spec = loaded
        elif text.startswith("exec:"):
            try:
                words = shlex.split(text[5:])
            except ValueError as exc:
                raise ValueError(f"invalid command {_q(text[5:])}: {exc}") from None
            spec = {"type": "exec", "command": words}
        else:
            url = urllib.parse.urlsplit(text)
            if url.scheme not in ("tcp", "http", "https"):
                raise ValueError(
                    f"unsupported health check {_q(text)}: use tcp://HOST:PORT, http(s)://HOST:PORT/PATH, "
                    "exec:COMMAND or a JSON object"
                )
            try:
                port = url.port
            except ValueError:
                raise ValueError(f"invalid port in {_q(text)}") from None
            spec = {"type": url.scheme, "host": url.hostname or "127.0.0.1"}
            if port is not None:
                spec["port"] = port
            if url.scheme != "tcp":
                spec["path"] = (url.path or "/") + (f"?{url.query}" if url.query else "")
            elif url.path not in ("", "/"):
                raise ValueError(f"a tcp health check takes no path, got {_q(text)}")
    else:
        raise ValueError(f"must be a string, got {value!r}")

    known = {"type", "host", "port", "path", "command", "interval", "timeout", "rise", "fall"}
    unknown = sorted(str(k) for k in spec if k not in known)
    if unknown:
        raise ValueError(f"unknown field {_q(unknown[0])} (known: {', '.join(sorted(known))})")
    kind = spec.get("type")
    if kind not in HEALTH_CHECK_TYPES:
        raise ValueError(f"type: {_q(kind)} is not one of {', '.join(HEALTH_CHECK_TYPES)}")
    result: dict[str, Any] = {"type": kind, "host": None, "port": None, "path": None, "command": None}
    if kind == "exec":
        command = spec.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
            raise ValueError(f"command: must be a non-empty list of strings, got {command!r}")
        result["command"] = command
    else:
        host = spec.get("host") or "127.0.0.1"
        try:
            parse_ip(str(host))
        except ValueError:
            if not _DNS1123_SUBDOMAIN.match(str(host)):
                raise ValueError(f"host: invalid host {_q(host)}") from None
        port = spec.get("port", default_port)
        if port is None:
            raise ValueError("port: no port given and the service has no ports")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"port: invalid port {port!r}, must be in 1-65535 range")
        result["host"] = str(host)
        result["port"] = port
        if kind in ("http", "https"):
            path = spec.get("path") or "/"
            if not isinstance(path, str) or not path.startswith("/"):
                raise ValueError(f"path: must start with '/', got {path!r}")
            result["path"] = path
    for name in ("interval", "timeout"):
        v = spec.get(name, HEALTH_CHECK_DEFAULTS[name])
        if isinstance(v, str):
            try:
                v = parse_duration(v)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(f"{name}: must be a positive number of seconds, got {v!r}")
        result[name] = float(v)
    if result["timeout"] > result["interval"]:
        raise ValueError(f"timeout {result['timeout']:g}s must not exceed interval {result['interval']:g}s")
    for name in ("rise", "fall"):
        v = spec.get(name, HEALTH_CHECK_DEFAULTS[name])
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: must be an integer >= 1, got {v!r}")
        result[name] = v
    return result
