"""A restart of the speaker keeps its routes at the routers (issue 22 part 4); anything else withdraws.

``systemctl restart`` (the speaker role's handler after an upgrade or a config change,
``playbooks/rolling_restart.yml``) stops the speaker and starts it again, and while the stop runs
systemd holds a ``restart`` job for the unit. The stopping speaker asks for that job
(``restart_pending``): when there is one, the BGP mode leaves bgpd's ``network`` lines in place,
and the next speaker's first apply (a whole frr-reload, since it cannot be sure what bgpd has)
keeps the lines it still wants untouched, so the routers see no change. A stop withdraws as
before. ``guard`` runs after every stop (the unit's ``ExecStopPost``) and withdraws whatever bgpd
still has unless the stop was clean and a restart follows: a crash, ``kill -9``, the watchdog, a
stop that timed out or a start that failed all withdraw. A node that dies takes bgpd with it: the
routers drop it at BFD speed, as before.

``nocloudlb bgp-guard`` is ``guard``; the frr role's drop-in for the speaker unit runs it
(roles/frr/templates/speaker-frr.conf.j2).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from .. import logs
from ..backoff import Backoff
from .frr import FrrControl, FrrError
from .render import networks_in
from .state import BgpState, has_any
from .withdraw import Withdrawer

log = logging.getLogger("nocloudlb.bgp")

#: systemd job types that start the unit again once the stop is done
RESTART_JOBS = frozenset({"restart", "try-restart", "reload-or-restart", "try-reload-or-restart"})


def own_unit(cgroup: str = "/proc/self/cgroup") -> str:
    """The systemd service this process runs in ("" outside one), from its cgroup path
    (``0::/system.slice/nocloudlb-speaker.service``, or cgroup v1's ``name=systemd`` line)."""
    try:
        with open(cgroup, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        path = line.split(":", 2)[-1]
        unit = next((part for part in reversed(path.split("/")) if part.endswith(".service")), "")
        if unit:
            return unit
    return ""


def restarting(jobs_output: str, unit: str) -> bool:
    """Whether ``systemctl list-jobs --no-legend --plain UNIT``'s output holds a restart job for ``unit``
    (``JOB UNIT TYPE STATE`` per line)."""
    for line in jobs_output.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == unit and fields[2] in RESTART_JOBS:
            return True
    return False


def restart_pending(unit: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                    timeout: float = 2.0) -> bool:
    """Whether systemd will start ``unit`` again after this stop. False when it cannot tell (no unit,
    no systemctl, no answer in ``timeout``): the caller then withdraws."""
    if not unit:
        return False
    try:
        proc = run(["systemctl", "list-jobs", "--no-legend", "--plain", unit], capture_output=True, text=True,
                   timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and restarting(proc.stdout, unit)


def kept_on_stop(modes: list[Any], failing: str, unit: str | None = None,
                 pending: Callable[[str], bool] = restart_pending) -> set[str]:
    """The modes whose announcements outlive this stop: ``{"bgp"}`` when systemd starts the unit again
    after it (``pending(unit)``), the speaker is not failing closed (``failing``: why it is, or "")
    and the BGP mode applied its config, withdrew nothing and bgpd answers (``BgpMode.keeps_routes``);
    else none."""
    bgp = next((m for m in modes if m.name == "bgp"), None)
    if bgp is None or failing or bgp.failing or not bgp.mode.keeps_routes():
        return set()
    unit = own_unit() if unit is None else unit
    if not pending(unit):
        return set()
    logs.event(log, "bgpRoutesKept", "systemd restarts the speaker: bgpd keeps its networks for the next one",
               unit=unit)
    return {"bgp"}


def guard(env: Mapping[str, str] | None = None, frr: FrrControl | None = None, unit: str | None = None,
          pending: Callable[[str], bool] = restart_pending) -> int:
    """After a stop of the speaker: keep bgpd's networks only when the stop was clean
    (``SERVICE_RESULT=success``, which systemd gives ``ExecStopPost``) and a restart follows;
    otherwise withdraw every ``network`` line bgpd has (they are all the speaker's: it renders the
    whole frr.conf) and strip them from frr.conf. No bgpd: frr.conf is stripped all the same. Returns
    1 when a network could not be withdrawn."""
    env = os.environ if env is None else env
    result = env.get("SERVICE_RESULT", "")
    unit = own_unit() if unit is None else unit
    if result == "success" and pending(unit):
        logs.event(log, "bgpRoutesKept", "the speaker restarts: bgpd keeps its networks for the next one",
                   unit=unit)
        return 0
    frr = frr or FrrControl()
    try:
        text = frr.exec_vty("show running-config", timeout=3.0)
        source = "bgpd"
    except FrrError:
        try:
            with open(frr.path(frr.conf), encoding="utf-8") as fh:
                text, source = fh.read(), "frr.conf"
        except OSError:
            return 0  # neither bgpd nor frr.conf: nothing announced, nothing to strip
    nets = networks_in(text)
    if not has_any(nets):
        return 0
    state = BgpState(socket.gethostname())
    state.announced = nets
    Withdrawer(frr, state, Backoff("vtysh", base=0.5, ceiling=10.0)).withdraw(None)
    left = sorted(p for fams in state.announced.values() for ps in fams.values() for p in ps)
    logs.event(log, "bgpGuardWithdrew", "the speaker stopped without a restart to follow: its networks are withdrawn",
               logging.WARNING if result != "success" else logging.INFO, serviceResult=result or "unknown",
               source=source, prefixes=sorted(p for fams in nets.values() for ps in fams.values() for p in ps)[:50],
               left=left[:50])
    return 1 if left else 0
