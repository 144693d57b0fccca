# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check inventory and ``-e`` variables against a role's argument spec, on the controller.

The spec is the role's own ``meta/argument_specs.yml`` (its ``options``, with real
``options`` of their own for lists of mappings and mappings). Values are converted with
Ansible's own type checks (``ansible.module_utils.common.validation``, the functions
``ArgumentSpecValidator`` uses), so what passes here passes the role's built-in argument
validation too; the walk and the messages are ours, because Ansible's name neither the
item nor a close match:

- every message names the variable, the item (index and its ``name``), the key and the value,
  e.g. ``nocloudlb_services[1] (name: web): ports[0]: 'http' is not a port number (1-65535)``;
- an unknown key is refused with the closest known one (``did you mean 'address'?``);
- the documented short forms are accepted: one string (or number, or mapping) where a list
  is expected is a one-item list (``ips: 198.51.100.7``, ``ports: 443``);
- no Python type name and no traceback: values are shown as plain YAML-like literals.

What an argument spec cannot say (a port is a number or a mapping, the health check
forms, port ranges) is in ``FORMS`` below, keyed by the option's path. Only the controller
imports this file (the action plugin nocloud.loadbalancer.vars_check); the daemon never does.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ansible.module_utils.common.validation import (
    check_type_bool,
    check_type_dict,
    check_type_float,
    check_type_int,
)

from .healthcheck import parse_health_check

#: The value shown in a message is cut to this many characters.
SHOW_MAX = 80
#: difflib's similarity cutoff for "did you mean".
CLOSE = 0.6
#: Variables whose value no message shows.
SECRETS = frozenset({"nocloudlb_gossip_key", "keepalived_auth_pass", "router_password"})


class Problem(Exception):
    """One refused value; ``where`` is filled in by the walk."""


def native(value: Any) -> Any:
    """Plain Python values (Ansible's tagged str/int/... and its lazy containers become
    str/int/..., dict, list), so that messages show no internal type name."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Mapping):
        return {native(k): native(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [native(v) for v in value]
    return str(value)


def show(value: Any) -> str:
    """A value as the user wrote it, roughly: strings quoted, mappings and lists in flow style."""
    if value is None:
        text = "null (nothing)"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value)
    elif isinstance(value, str):
        text = "'" + value.replace("'", "''") + "'"
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    elif isinstance(value, list):
        text = "[" + ", ".join(show(v) for v in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= SHOW_MAX else text[:SHOW_MAX - 3] + "..."


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``word`` (difflib), case-insensitively; None if none is close."""
    known = list(known)
    lowered = {k.lower(): k for k in known}
    hit = difflib.get_close_matches(str(word).lower(), list(lowered), n=1, cutoff=CLOSE)
    return lowered[hit[0]] if hit else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    hit = closest(word, known)
    return f" (did you mean '{hit}'?)" if hit else ""


# -- conversions (Ansible's, with our words) -----------------------------------------------------------

def _to_str(value: Any) -> str:
    if isinstance(value, (dict, list)) or value is None:
        raise Problem(f"{show(value)} is not a string")
    return str(value)


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise Problem(f"{show(value)} is not a whole number")
    try:
        return int(check_type_int(value))
    except (TypeError, ValueError):
        raise Problem(f"{show(value)} is not a whole number") from None


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise Problem(f"{show(value)} is not a number")
    try:
        return float(check_type_float(value))
    except (TypeError, ValueError):
        raise Problem(f"{show(value)} is not a number") from None


def _to_bool(value: Any) -> bool:
    try:
        return bool(check_type_bool(value))
    except (TypeError, ValueError):
        raise Problem(f"{show(value)} is not a boolean (true or false)") from None


def _to_dict(value: Any) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            return dict(check_type_dict(value))
        except (TypeError, ValueError):
            pass
    raise Problem(f"{show(value)} is not a mapping")


SCALARS: dict[str, Callable[[Any], Any]] = {
    "str": _to_str, "path": _to_str, "int": _to_int, "float": _to_float, "bool": _to_bool,
    "dict": _to_dict, "raw": lambda v: v,
}


# -- the walk -----------------------------------------------------------------------------------------

def item_label(item: Any) -> str:
    """`` (name: web)`` for an item with a name (or a document with metadata.name), else ''."""
    if not isinstance(item, dict):
        return ""
    name = item.get("name")
    kind = item.get("kind")
    if name is None and isinstance(item.get("metadata"), dict):
        name = item["metadata"].get("name")
    parts = []
    if isinstance(kind, str):
        parts.append(f"kind: {kind}")
    if isinstance(name, (str, int)) and not isinstance(name, bool):
        parts.append(f"name: {name}")
    return f" ({', '.join(parts)})" if parts else ""


def _join(where: str, key: str) -> str:
    if not where:
        return key
    return f"{where}: {key}" if where.endswith(")") else f"{where}.{key}"


def _pattern(path: list[str]) -> str:
    return ".".join(path).replace(".[]", "[]")


class VarSpec:
    """Variables checked against one argument spec's ``options`` (merged from several roles)."""

    def __init__(self, options: Mapping[str, Any], forms: Mapping[str, Callable[[Any, Any], Any]] | None = None):
        self.options = dict(options)
        self.forms = dict(FORMS if forms is None else forms)

    def check(self, name: str, value: Any) -> tuple[Any, list[str]]:
        """(normalized value, errors) for the variable ``name``; errors are whole sentences.
        The value of a secret (SECRETS) is never shown."""
        errors: list[str] = []
        out = self._option(native(value), self.options[name], name, [name], None, errors)
        if name in SECRETS and errors:
            errors = [f"{name}: not a {self.options[name].get('type', 'str')} (the value is not shown, it is a secret)"]
        return out, errors

    def _option(self, value: Any, spec: Mapping[str, Any], where: str, path: list[str], parent: Any,
                errors: list[str]) -> Any:
        kind = spec.get("type", "str")
        form = self.forms.get(_pattern(path))
        if value is None and kind != "raw":
            if spec.get("required"):
                errors.append(f"{where}: is required, got nothing (null)")
            return None
        try:
            if kind == "list":
                return self._list(value, spec, where, path, errors)
            if kind == "dict" and spec.get("options"):
                return self._mapping(_to_dict(value), spec["options"], where, path, errors)
            if form is not None:
                value = form(value, parent)
            else:
                value = SCALARS.get(kind, SCALARS["raw"])(value)
            self._choices(value, spec)
        except Problem as exc:
            errors.append(f"{where}: {exc}")
        return value

    @staticmethod
    def _choices(value: Any, spec: Mapping[str, Any]) -> None:
        choices = spec.get("choices")
        if choices and value not in choices:
            listed = ", ".join(str(c) for c in choices)
            raise Problem(f"{show(value)} is not one of {listed}{did_you_mean(str(value), [str(c) for c in choices])}")

    def _list(self, value: Any, spec: Mapping[str, Any], where: str, path: list[str], errors: list[str]) -> list:
        elements = spec.get("elements", "raw")
        if isinstance(value, dict) and (elements == "dict" or self.forms.get(_pattern([*path, "[]"]))):
            raise Problem(f"{show(value)} is a single mapping, not a list: write it as a one-item list (- {{...}})")
        if isinstance(value, dict):
            raise Problem(f"{show(value)} is not a list")
        if isinstance(value, str) and elements == "dict":
            keys = ", ".join(sorted(spec.get("options") or {}))
            raise Problem(f"{show(value)} is not a list of mappings" + (f" (keys {keys})" if keys else ""))
        items = value if isinstance(value, list) else [value]  # one value: a one-item list
        out = []
        for index, item in enumerate(items):
            here = f"{where}[{index}]{item_label(item) if elements == 'dict' else ''}"
            sub_path = [*path, "[]"]
            form = self.forms.get(_pattern(sub_path))
            try:
                if form is not None:
                    out.append(form(item, None))
                elif elements == "dict":
                    if not isinstance(item, dict):
                        keys = ", ".join(sorted(spec.get("options") or {}))
                        raise Problem(f"{show(item)} is not a mapping" + (f" (keys {keys})" if keys else ""))
                    out.append(self._mapping(item, spec.get("options") or {}, here, sub_path, errors)
                               if spec.get("options") else item)
                else:
                    converted = SCALARS.get(elements, SCALARS["raw"])(item)
                    self._choices(converted, spec)
                    out.append(converted)
            except Problem as exc:
                errors.append(f"{here}: {exc}")
        return out

    def _mapping(self, value: dict, options: Mapping[str, Any], where: str, path: list[str],
                 errors: list[str]) -> dict:
        out: dict[str, Any] = {}
        meant = set()
        for key in value:
            if key not in options:
                known = ", ".join(sorted(options))
                meant.add(closest(str(key), options))
                errors.append(f"{where}: unknown key '{key}'{did_you_mean(str(key), options)}; "
                              f"the known keys are {known}")
        for key, spec in options.items():
            if key in value:
                out[key] = self._option(value[key], spec, _join(where, key), [*path, key], value, errors)
            elif spec.get("required") and key not in meant:  # not twice for one misspelt key
                errors.append(f"{where}: {key} is required")
        return out


def unknown_variables(names: Iterable[str], known: Iterable[str], prefix: str = "nocloudlb_") -> list[str]:
    """Warnings for names with ``prefix`` that no role or playbook knows, with the closest known name."""
    known = set(known)
    out = []
    for name in sorted(set(names)):
        if name.startswith(prefix) and name not in known:
            out.append(f"unknown variable {name}, ignored{did_you_mean(name, sorted(known))}")
    return out


# -- what an argument spec cannot say -------------------------------------------------------------------

PORT_KEYS = ("port", "protocol", "name")
PROTOCOLS = ("TCP", "UDP", "SCTP")


def _port_number(value: Any) -> int:
    try:
        port = _to_int(value)
    except Problem:
        port = 0
    if not 1 <= port <= 65535:
        raise Problem(f"{show(value)} is not a port number (1-65535)")
    return port


def _service_port(value: Any, _parent: Any) -> Any:
    """One of a service's ``ports``: a number, or a mapping with port, protocol, name."""
    if not isinstance(value, dict):
        try:
            _to_int(value)
        except Problem:
            raise Problem(f"{show(value)} is not a port number (1-65535) or a mapping with "
                          f"{', '.join(PORT_KEYS)}") from None
        return _port_number(value)
    for key in value:
        if key not in PORT_KEYS:
            raise Problem(f"unknown key '{key}'{did_you_mean(str(key), PORT_KEYS)}; the known keys are "
                          f"{', '.join(PORT_KEYS)}")
    if "port" not in value:
        raise Problem(f"{show(value)} has no port")
    out = dict(value)
    try:
        out["port"] = _port_number(value["port"])
    except Problem as exc:
        raise Problem(f"port: {exc}") from None
    protocol = value.get("protocol", "TCP")
    if protocol not in PROTOCOLS:
        raise Problem(f"protocol: {show(protocol)} is not one of {', '.join(PROTOCOLS)}"
                      f"{did_you_mean(str(protocol), PROTOCOLS)}")
    return out


HEALTH_CHECK_KEYS = ("type", "host", "port", "path", "command", "interval", "timeout", "rise", "fall")


def _service_ports(parent: Any) -> list[tuple[int, str]]:
    ports = parent.get("ports") if isinstance(parent, dict) else None
    ports = ports if isinstance(ports, list) else [ports] if ports is not None else []
    out = []
    for p in ports:
        try:
            got = _service_port(p, None)
        except Problem:
            continue
        out.append((got, "TCP") if isinstance(got, int) else (got["port"], str(got.get("protocol", "TCP"))))
    return out


def _health_check(value: Any, parent: Any, with_host: bool = True) -> Any:
    """A health check: ``tcp://HOST:PORT``, ``http(s)://HOST:PORT/PATH``, ``exec:CMD`` or a mapping."""
    if isinstance(value, dict):
        for key in value:
            if key not in HEALTH_CHECK_KEYS or (key == "host" and not with_host):
                known = [k for k in HEALTH_CHECK_KEYS if with_host or k != "host"]
                raise Problem(f"unknown key '{key}'{did_you_mean(str(key), known)}; the known keys are "
                              f"{', '.join(known)}")
    elif not isinstance(value, str):
        raise Problem(f"{show(value)} is not a health check (tcp://HOST:PORT, http://HOST:PORT/PATH, "
                      "exec:COMMAND or a mapping)")
    ports = _service_ports(parent) if with_host else [(65535, "TCP")]
    try:
        parse_health_check(value, ports)
    except ValueError as exc:
        raise Problem(f"{show(value)}: {exc}") from None
    return value


def _backends_health_check(value: Any, parent: Any) -> Any:
    if isinstance(value, str) and "://" in value:
        host = value.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
        if host:
            raise Problem(f"{show(value)}: the check runs against each server; leave the host out "
                          "(e.g. tcp://:8080)")
    return _health_check(value, parent, with_host=False)


def _server_port(value: Any, _parent: Any) -> int:
    return _port_number(value)


FORMS: dict[str, Callable[[Any, Any], Any]] = {
    "nocloudlb_services[].ports[]": _service_port,
    "nocloudlb_services[].health_check": _health_check,
    "nocloudlb_services[].backends.health_check": _backends_health_check,
    "nocloudlb_services[].backends.servers[].port": _server_port,
    "nocloudlb_memberlist_port": lambda v, _p: _port_number(v),
}


#: Variables the playbooks read (or register) besides the roles' options: not unknown.
PLAYBOOK_VARIABLES = frozenset({
    "nocloudlb_hosts", "nocloudlb_router_hosts", "nocloudlb_frr",
    "nocloudlb_drain", "nocloudlb_drain_found", "nocloudlb_router_view", "nocloudlb_site_status",
    "nocloudlb_restart_status",
})
