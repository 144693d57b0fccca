#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drain or undrain a nocloudlb node through its speaker's control socket."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_drain
short_description: Move a node's VIPs away before maintenance, and back after
version_added: "0.1.0"
description:
  - Sets (C(state=drained)) or clears (C(state=undrained)) the drain label
    C(node.kubernetes.io/exclude-from-external-load-balancers) on the target node through
    its speaker's control socket. The label is persisted by the speaker, so a drained node
    stays drained across restarts and reboots, and it is gossiped at once to the cluster.
  - A drained node is no candidate in any VIP's election (MetalLB's rule), so the next node
    in each VIP's order takes over and sends gratuitous ARP / unsolicited NA while the
    drained node still holds the VIP on C(lo) and keeps serving connections that reach it.
  - With C(state=drained) the module waits until every VIP the node led is led by another
    node in the cluster's status, then until another member confirms it from its own view (it
    sees the drain label on this node and another leader for each of those VIPs; the speaker
    asks a live peer over the gossip layer), and optionally (O(confirm_with_probe)) until an ARP/NDP
    probe from the node gets its answer from another MAC. Then it waits O(grace_period)
    seconds so clients whose ARP cache still points at the node finish their requests.
  - Before it sets the label it checks that another live, undrained member exists; it fails
    with a clear message instead of leaving VIPs without an owner. If the VIPs still have no
    new owner after O(timeout) (for example no other node matches the advertisements' node
    selectors or has a healthy backend), it clears the label again and fails, naming the VIPs
    and the reasons.
  - With C(state=undrained) it waits until the node's speaker no longer reports any VIP
    withheld because of the drain and announces every VIP the election gives back to it.
options:
  state:
    description: Whether the node should be drained or serve again.
    type: str
    choices: [drained, undrained]
    default: drained
  socket:
    description: Path of the speaker's control socket on the node.
    type: path
    default: /run/nocloudlb/speaker.sock
  timeout:
    description: Seconds to wait for the VIPs to move (or come back) before failing.
    type: float
    default: 60.0
  grace_period:
    description:
      - Seconds to keep the drained node serving after its VIPs moved, before the module
        returns (and the play goes on to stop or restart things). Clients whose ARP/NDP
        cache still names the node reach it meanwhile.
    type: float
    default: 0.0
  confirm_with_probe:
    description:
      - Also confirm each move on the wire - probe the VIP over ARP (IPv4) or NDP (IPv6)
        from the node with C(nocloudlb probe) and require an answer from a MAC that is not
        one of this node's.
    type: bool
    default: false
  probe_command:
    description: The C(nocloudlb) CLI used for O(confirm_with_probe).
    type: path
    default: /opt/nocloudlb/venv/bin/nocloudlb
  rollback_on_timeout:
    description: Clear the drain label again when the VIPs found no new owner in time.
    type: bool
    default: true
  poll_interval:
    description: Seconds between status reads while waiting.
    type: float
    default: 0.2
extends_documentation_fragment:
  - nocloud.loadbalancer.attributes
attributes:
  check_mode:
    support: full
    details: Reports what would change (and which VIPs would move) without setting the label.
  diff_mode:
    support: full
    details: Shows the node's labels before and after.
notes:
  - Runs on the node to drain (the socket is local). Use C(serial) in the play so that one
    node at a time is drained, as C(playbooks/rolling_restart.yml) does.
seealso:
  - module: nocloud.loadbalancer.speaker_info
  - module: nocloud.loadbalancer.vip_owner_info
author:
  - nocloud.loadbalancer developers (@nocloud)
"""

EXAMPLES = r"""
- name: Move this node's VIPs to other nodes, confirm on the wire, let clients finish
  nocloud.loadbalancer.node_drain:
    state: drained
    confirm_with_probe: true
    grace_period: 5

- name: Take the VIPs back after maintenance
  nocloud.loadbalancer.node_drain:
    state: undrained
"""

RETURN = r"""
node:
  description: The node's name in the cluster.
  returned: success
  type: str
drained:
  description: Whether the node carries the drain label now.
  returned: success
  type: bool
labels:
  description: The node's labels after the change.
  returned: success
  type: dict
moved:
  description:
    - For C(state=drained), VIP -> the node that leads it now.
    - In check mode, the VIPs that would move, each with null.
  returned: success
  type: dict
  sample: {"198.51.100.200": "n2"}
probed:
  description: For O(confirm_with_probe), VIP -> the MACs that answered after the move.
  returned: when confirm_with_probe
  type: dict
confirmed_by:
  description: For C(state=drained), the member whose view confirmed the drain (null when the speaker
    could not be asked, or no VIP moved).
  returned: when state=drained and a change was made
  type: str
  sample: n2
regained:
  description: For C(state=undrained), the VIPs this node leads again.
  returned: success
  type: list
  elements: str
elapsed:
  description: Seconds spent waiting for the VIPs to move (or come back), grace period excluded.
  returned: success
  type: float
"""

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils import control_client  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.election import DRAIN_LABEL  # noqa: E402

LIVE = ("alive", "suspect")


class SpeakerError(Exception):
    pass


def request(path: str, payload: dict, timeout: float = 5.0) -> dict:
    """control_client.request with the errors a user of this module can act on."""
    try:
        answer = control_client.request(path, payload, timeout)
    except FileNotFoundError:
        raise SpeakerError(f"socket: {path} does not exist; is nocloudlb-speaker.service running here?") from None
    except (OSError, ValueError) as exc:
        raise SpeakerError(f"socket: cannot talk to the speaker at {path}: {exc}") from None
    if answer.get("ok") is False:
        raise SpeakerError(f"the speaker refused {payload}: {answer.get('error')}")
    return answer


def leaders(status: dict) -> dict:
    return {v["ip"]: v.get("leader") for v in status.get("vips") or []}


def my_macs() -> set[str]:
    macs = set()
    for name in os.listdir("/sys/class/net"):
        try:
            with open(f"/sys/class/net/{name}/address") as fh:
                macs.add(fh.read().strip().lower())
        except OSError:
            continue
    return macs


def probe(command: str, ip: str) -> list[str]:
    """MACs answering ARP/NDP for ip, via `nocloudlb probe IP --json` (empty on failure)."""
    try:
        out = subprocess.run([command, "probe", ip, "--timeout", "0.5", "--json"], capture_output=True,
                             text=True, timeout=10, check=False).stdout
        answers = json.loads(out)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []
    if isinstance(answers, dict):
        answers = answers.get("answers", [])
    return sorted({str(a.get("mac", "")).lower() for a in answers if isinstance(a, dict)} - {""})


def confirm_from_peer(path: str, me: str, owned: list, deadline: float, poll: float) -> dict:
    """Wait until another member sees the drain label on this node and another leader for each of
    ``owned`` (the speaker asks a live peer over the gossip layer: ``peerView``). Returns the peer's
    answer, {"skipped": True} when the speaker cannot ask (older speaker), or {"error": why}."""
    last = "no answer"
    while True:
        try:
            answer = control_client.request(path, {"cmd": "peerView", "ips": list(owned)}, 5.0)
        except (OSError, ValueError) as exc:
            answer = {"ok": False, "error": f"socket: {exc}"}
        if answer.get("ok") is False and "unknown cmd" in str(answer.get("error")):
            return {"skipped": True}
        if answer.get("ok"):
            peer = answer.get("peer")
            still = sorted(ip for ip in owned if (answer.get("leaders") or {}).get(ip) in (None, me))
            if DRAIN_LABEL not in (answer.get("labels") or {}):
                last = f"{peer} does not see the drain label on {me} (its labels there: {answer.get('labels')})"
            elif still:
                last = f"{peer} still sees {me} (or nobody) leading {', '.join(still)}"
            else:
                return answer
        else:
            last = str(answer.get("error"))
            if not owned and "no other live member" in last:
                return {"skipped": True}  # nothing to hand over and nobody to ask: a one-node cluster
        if time.monotonic() > deadline:
            return {"error": last}
        time.sleep(poll)


def drain(module: AnsibleModule, path: str, status: dict) -> dict:
    p = module.params
    me = status.get("node")
    labels = dict(status.get("labels") or {})
    owned = sorted(ip for ip, leader in leaders(status).items() if leader == me)
    result = {"node": me, "moved": {}, "regained": [], "elapsed": 0.0}
    if DRAIN_LABEL in labels:
        return dict(result, changed=False, drained=True, labels=labels)
    after = dict(labels, **{DRAIN_LABEL: "true"})
    result.update(changed=True, drained=True, labels=after,
                  diff={"before": {"labels": labels}, "after": {"labels": after}})
    others = [m.get("name") for m in status.get("members") or []
              if m.get("name") != me and m.get("state") in LIVE and DRAIN_LABEL not in (m.get("labels") or {})]
    if owned and not others:
        seen = [(m.get("name"), m.get("state")) for m in status.get("members") or []]
        module.fail_json(msg=f"cannot drain {me}: it leads {', '.join(owned)} and no other member is alive and "
                             f"undrained (members: {seen}); its VIPs would have no owner", **result)
    if module.check_mode:
        result["moved"] = {ip: None for ip in owned}
        return result

    request(path, {"cmd": "label", "set": {DRAIN_LABEL: "true"}})
    start = time.monotonic()
    deadline = start + p["timeout"]
    mine = my_macs() if p["confirm_with_probe"] else set()
    probed: dict[str, list[str]] = {}
    pending = set(owned)
    current = status
    while pending:
        current = request(path, {"cmd": "status", "vips": "all"})
        now_leaders = leaders(current)
        for ip in sorted(pending):
            leader = now_leaders.get(ip)
            if leader in (None, me):
                continue
            if p["confirm_with_probe"]:
                macs = probe(p["probe_command"], ip)
                probed[ip] = macs
                if not macs or set(macs) & mine:
                    continue
            result["moved"][ip] = leader
            pending.discard(ip)
        if not pending:
            break
        if time.monotonic() > deadline:
            why = {v["ip"]: f"leader={v.get('leader')} reason={v.get('reason') or '-'}"
                   for v in current.get("vips") or [] if v.get("ip") in pending}
            rolled = ""
            if p["rollback_on_timeout"]:
                request(path, {"cmd": "label", "unset": [DRAIN_LABEL]})
                rolled = "; the drain label was cleared again, the node serves them as before"
                result.update(drained=False, labels=labels)
            module.fail_json(msg=f"timeout after {p['timeout']:g}s draining {me}: no other node took over "
                                 f"{', '.join(sorted(pending))} ({why}); is another node eligible (advertisement "
                                 f"node selectors, Local-policy health, drain labels)?{rolled}",
                             probed=probed, **result)
        time.sleep(p["poll_interval"])
    confirmed = confirm_from_peer(path, me, owned, deadline, p["poll_interval"])
    if confirmed.get("error"):
        rolled = ""
        if p["rollback_on_timeout"]:
            request(path, {"cmd": "label", "unset": [DRAIN_LABEL]})
            rolled = "; the drain label was cleared again, the node serves them as before"
            result.update(drained=False, labels=labels)
        module.fail_json(msg=f"draining {me} is not confirmed by another member: {confirmed['error']}{rolled}",
                         **result)
    result["confirmed_by"] = confirmed.get("peer")
    result["elapsed"] = round(time.monotonic() - start, 3)
    if p["confirm_with_probe"]:
        result["probed"] = probed
    result["labels"] = current.get("labels") or after
    if p["grace_period"] > 0:
        time.sleep(p["grace_period"])
    return result


def undrain(module: AnsibleModule, path: str, status: dict) -> dict:
    p = module.params
    me = status.get("node")
    labels = dict(status.get("labels") or {})
    result = {"node": me, "moved": {}, "regained": [], "elapsed": 0.0}
    if DRAIN_LABEL not in labels:
        return dict(result, changed=False, drained=False, labels=labels)
    after = {k: v for k, v in labels.items() if k != DRAIN_LABEL}
    result.update(changed=True, drained=False, labels=after,
                  diff={"before": {"labels": labels}, "after": {"labels": after}})
    if module.check_mode:
        return result
    request(path, {"cmd": "label", "unset": [DRAIN_LABEL]})
    start = time.monotonic()
    while True:
        current = request(path, {"cmd": "status", "vips": "all"})
        vips = current.get("vips") or []
        withheld = [v["ip"] for v in vips if v.get("reason") == "drained"]
        waiting = [v["ip"] for v in vips if v.get("leader") == me and not v.get("announcing")]
        if DRAIN_LABEL not in (current.get("labels") or {}) and not withheld and not waiting:
            break
        if time.monotonic() - start > p["timeout"]:
            module.fail_json(msg=f"timeout after {p['timeout']:g}s undraining {me}: still withheld {withheld}, "
                                 f"led but not announced {waiting}", **result)
        time.sleep(p["poll_interval"])
    result["regained"] = sorted({v["ip"] for v in vips if v.get("leader") == me})
    result["labels"] = current.get("labels") or after
    result["elapsed"] = round(time.monotonic() - start, 3)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["drained", "undrained"], "default": "drained"},
            "socket": {"type": "path", "default": "/run/nocloudlb/speaker.sock"},
            "timeout": {"type": "float", "default": 60.0},
            "grace_period": {"type": "float", "default": 0.0},
            "confirm_with_probe": {"type": "bool", "default": False},
            "probe_command": {"type": "path", "default": "/opt/nocloudlb/venv/bin/nocloudlb"},
            "rollback_on_timeout": {"type": "bool", "default": True},
            "poll_interval": {"type": "float", "default": 0.2},
        },
        supports_check_mode=True,
    )
    for name in ("timeout", "grace_period", "poll_interval"):
        if module.params[name] < 0:
            module.fail_json(msg=f"{name}: must be >= 0, got {module.params[name]}")
    path = module.params["socket"]
    try:
        status = request(path, {"cmd": "status", "vips": "all"})
        if module.params["state"] == "drained":
            result = drain(module, path, status)
        else:
            result = undrain(module, path, status)
    except SpeakerError as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
