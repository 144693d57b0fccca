# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of nocloud.loadbalancer.vars_check (documented in plugins/modules/vars_check.py).

Runs on the controller only: it reads variables, never executes anything on a host, so a
play can refuse a bad inventory or a bad ``-e`` before any host is contacted.
"""

from __future__ import annotations

import json
import os

import yaml
from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.utils.vars import load_extra_vars
from ansible_collections.nocloud.loadbalancer.plugins.module_utils._varspec import (
    PLAYBOOK_VARIABLES,
    VarSpec,
    closest,
    native,
    unknown_variables,
)

ROLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")

ARGS = {
    "roles": {"type": "list", "elements": "str", "default": ["speaker"]},
    "hosts": {"type": "list", "elements": "str"},
    "extra_vars": {"type": "dict", "default": {}},
}


def role_specs(role: str) -> dict:
    """Every entry point's options of one of the collection's roles."""
    path = os.path.join(ROLES_DIR, role, "meta", "argument_specs.yml")
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise AnsibleError(f"vars_check: cannot read the argument spec of role {role}: {exc}") from None
    return {ep: (spec or {}).get("options") or {} for ep, spec in (data.get("argument_specs") or {}).items()}


def known_names() -> set[str]:
    """Every variable a role or playbook of the collection reads."""
    names = set(PLAYBOOK_VARIABLES)
    for role in sorted(os.listdir(ROLES_DIR)):
        if os.path.isfile(os.path.join(ROLES_DIR, role, "meta", "argument_specs.yml")):
            for options in role_specs(role).values():
                names.update(options)
    return names


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        validation = ArgumentSpecValidator(ARGS).validate(dict(self._task.args))
        if validation.error_messages:
            return dict(result, failed=True, msg="vars_check: " + "; ".join(validation.error_messages))
        args = validation.validated_parameters

        options: dict = {}
        for role in args["roles"]:
            for name, spec in role_specs(role).get("main", {}).items():
                options.setdefault(name, spec)
        extra_spec = dict(args["extra_vars"] or {})
        known = known_names() | set(extra_spec)
        hosts = args["hosts"] if args["hosts"] is not None else list(task_vars.get("ansible_play_hosts_all") or [])
        try:
            given = {str(k) for k in load_extra_vars(self._loader)}
        except AnsibleError:
            given = set()

        errors: dict[str, list[str]] = {}
        warnings: dict[str, list[str]] = {}
        skipped: dict[str, list[str]] = {}
        checker = VarSpec(options)
        seen: dict[tuple[str, str], list[str]] = {}
        me = task_vars.get("inventory_hostname")
        hostvars = task_vars.get("hostvars") or {}
        for host in hosts:
            if host != me and host not in hostvars:
                errors.setdefault(f"{host} is not a host of the inventory", [])
                continue
            view = task_vars if host == me else hostvars[host]
            names = [str(n) for n in view]
            for name in sorted(n for n in names if n in options):
                try:
                    value = self._templar.template(view[name]) if view is task_vars else view[name]
                    key = (name, json.dumps(native(value), sort_keys=True, default=str))
                    if key not in seen:  # group_vars: every host has the same value, checked once
                        seen[key] = checker.check(name, value)[1]
                    found = seen[key]
                except Exception:  # pylint: disable=broad-exception-caught
                    # templated from something not known yet (facts, a later task): checked by the role
                    skipped.setdefault(name, []).append(host)
                    continue
                for text in found:
                    errors.setdefault(("-e " if name in given else "") + text, []).append(host)
            for text in unknown_variables(names, known):
                warnings.setdefault(text, []).append(host)

        extra_checker = VarSpec(extra_spec, forms={})
        for name, spec in extra_spec.items():
            if name not in task_vars:
                if spec.get("required"):
                    hint = [g for g in given if g not in known and closest(g, [name])]
                    seen = f"; -e {hint[0]} was given: did you mean {name}?" if hint else ""
                    about = f" ({spec['description']})" if spec.get("description") else ""
                    errors.setdefault(f"-e {name} is required{about}{seen}", [])
                continue
            try:
                value = self._templar.template(task_vars[name])
                _out, found = extra_checker.check(name, value)
            except Exception:  # pylint: disable=broad-exception-caught
                continue
            for text in found:
                errors.setdefault(("-e " if name in given else "") + text, [])
        for name in sorted(given - known):
            if name.startswith("ansible_"):
                continue
            if not hosts and name.startswith("nocloudlb_"):
                warnings.setdefault(unknown_variables([name], known)[0], [])
            hit = closest(name, sorted(set(extra_spec) | set(options)))
            if hit and not name.startswith("nocloudlb_"):
                warnings.setdefault(f"-e {name} is not a variable of this playbook, ignored (did you mean {hit}?)", [])

        def lines(found: dict[str, list[str]]) -> list[str]:
            out = []
            for text, where in found.items():
                partial = where and len(hosts) > 1 and len(set(where)) < len(hosts)
                out.append(text + (f" (on {', '.join(sorted(set(where)))})" if partial else ""))
            return out

        result.update(changed=False, checked_hosts=hosts, errors=lines(errors),
                      skipped={k: sorted(set(v)) for k, v in skipped.items()})
        if warnings:
            result["warnings"] = lines(warnings)
        if errors:
            result["failed"] = True
            result["msg"] = ("The variables are not valid (checked on the controller, nothing was changed):\n"
                             + "\n".join(f"- {line}" for line in result["errors"]))
        else:
            result["msg"] = f"the variables of {len(hosts)} host(s) and the -e variables are valid"
        return result
