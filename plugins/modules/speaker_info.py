#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a node's nocloudlb speaker status from its control socket."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: speaker_info
short_description: Read a nocloudlb speaker's status from its control socket
version_added: "0.1.0"
description:
  - Asks the C(nocloudlb speaker) running on the target node for its status over the
    control socket (a Unix stream socket speaking one JSON object per line).
  - Returns the cluster as this node sees it - members and their state and labels, every
    VIP with its elected leader, whether this node announces it and why not, the
    configuration state (last good configuration kept after a refused reload), detected
    address conflicts and the node's runtime labels (for example the drain label).
  - Read-only; the speaker's own word. To see who answers on the wire, use
    M(nocloud.loadbalancer.vip_owner_info).
options:
  socket:
    description: Path of the speaker's control socket on the node.
    type: path
    default: /run/nocloudlb/speaker.sock
  timeout:
    description: Seconds to wait for the connection and the answer.
    type: float
    default: 5.0
extends_documentation_fragment:
  - nocloud.loadbalancer.attributes
  - nocloud.loadbalancer.attributes.READ_ONLY
notes:
  - Runs on the node itself (the socket is local); it needs only Python's standard library.
  - Fails with a clear message when the socket is missing (speaker not running) or the
    speaker answers with an error.
seealso:
  - module: nocloud.loadbalancer.node_drain
  - module: nocloud.loadbalancer.vip_owner_info
author:
  - nocloud.loadbalancer developers (@nocloud)
"""

EXAMPLES = r"""
- name: Read the speaker's view of the cluster
  nocloud.loadbalancer.speaker_info:
  register: speaker

- name: Show who leads each VIP
  ansible.builtin.debug:
    msg: "{{ speaker.leaders }}"

- name: Wait until the speaker runs a good configuration
  nocloud.loadbalancer.speaker_info:
  register: speaker
  until: speaker.ready and speaker.config.state == 'ok'
  retries: 30
  delay: 2

- name: Fail when another host answers for one of our addresses
  ansible.builtin.assert:
    that: speaker.conflicts | length == 0
"""

RETURN = r"""
status:
  description: >-
    The speaker's whole answer to the C({"cmd": "status", "vips": "all", "announcers": true}) request,
    unchanged.
  returned: success
  type: dict
node:
  description: The node's name in the cluster.
  returned: success
  type: str
  sample: n1
ready:
  description: Whether the speaker has loaded a configuration and joined the cluster.
  returned: success
  type: bool
profile:
  description: The membership timing profile in use (C(lan) or C(fast)).
  returned: success
  type: str
members:
  description: Cluster members as this node sees them.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: Member (node) name.
      type: str
    addr:
      description: Gossip address.
      type: str
    state:
      description: C(alive), C(suspect), C(dead) or C(left).
      type: str
    labels:
      description: The member's labels, static and runtime.
      type: dict
    version:
      description:
        - The member's speaker version as its gossip metadata publishes it.
        - Empty for a member whose speaker predates publishing it (absent when this node's speaker does).
      type: str
    wireVersion:
      description:
        - The number of the wire protocol the member speaks, null when it publishes none.
        - Members of two versions interoperate during a rolling upgrade (docs/speaker.md, "Wire compatibility").
      type: int
vips:
  description: Every VIP of the configuration with its leader and this node's role.
  returned: success
  type: list
  elements: dict
  contains:
    ip:
      description: The address.
      type: str
    service:
      description: The service key C(namespace/name).
      type: str
    pool:
      description: The address pool the VIP comes from.
      type: str
    protocol:
      description:
        - C(layer2), or C(bgp) for a VIP only BGP serves (announced by every eligible node, no leader).
      type: str
    leader:
      description: The node elected to announce it (layer 2), or null when no node is eligible or the VIP is BGP's.
      type: str
    announcing:
      description: Whether this node announces it now (answers ARP/NDP for it, or advertises it to its BGP peers).
      type: bool
    bgp:
      description:
        - For a VIP the BGP mode decides on - C(announcing), C(reason), C(sessionsUp), C(sessions) (this node's
          BGP sessions established and configured) and C(announcers) (the live nodes that should announce it).
      type: dict
    reason:
      description: Empty when this node announces, else why not (C(notOwner), C(drained),
        C(noMatchingAdvertisement), C(noHealthyBackend), C(noCandidates), ...).
      type: str
    interfaces:
      description: Interfaces it is announced on.
      type: list
      elements: str
owners:
  description:
    - "VIP -> who announces it - the elected node (layer 2), C(none), or for a BGP VIP C(bgp) with the nodes
      that should announce it (C(bgp: n1,n2,n3), C(bgp: nobody))."
  returned: success
  type: dict
  sample: {"198.51.100.200": "n2", "203.0.113.10": "bgp: n1,n2,n3"}
leaders:
  description: VIP -> elected leader (null when nobody may announce it, and for BGP VIPs).
  returned: success
  type: dict
  sample: {"198.51.100.200": "n2", "2001:db8:1::200": "n1"}
announcing:
  description: The VIPs this node announces now.
  returned: success
  type: list
  elements: str
config:
  description: Configuration state - C(state) (C(ok) or C(error)), C(errors), C(loadedAt), C(lastGoodAt).
  returned: success
  type: dict
conflicts:
  description: Addresses another MAC answered for (RFC 5227 check), with C(ip), C(mac), C(iface), C(at).
  returned: success
  type: list
  elements: dict
labels:
  description: The node's effective labels.
  returned: success
  type: dict
drained:
  description: Whether the node carries the drain label (C(node.kubernetes.io/exclude-from-external-load-balancers)).
  returned: success
  type: bool
"""


from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.control_client import request  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.election import DRAIN_LABEL  # noqa: E402


def owner_text(v: dict) -> str:
    """Who announces a VIP row: its leader (layer 2), or "bgp: NODES" (the nodes that should announce it)."""
    if v.get("protocol") == "bgp":
        announcers = (v.get("bgp") or {}).get("announcers")
        return "bgp" if announcers is None else "bgp: " + (",".join(announcers) or "nobody")
    return str(v.get("leader") or "none")


def owners(vips: list) -> dict:
    out: dict = {}
    for v in vips:
        if "ip" in v:
            out.setdefault(v["ip"], owner_text(v))
    return out


def summarize(status: dict) -> dict:
    """The status plus the convenience keys this module returns."""
    vips = status.get("vips") or []
    labels = status.get("labels") or {}
    return {
        "status": status,
        "node": status.get("node"),
        "ready": bool(status.get("ready")),
        "profile": status.get("profile"),
        "members": status.get("members") or [],
        "vips": vips,
        "leaders": {v["ip"]: v.get("leader") for v in vips if "ip" in v},
        "owners": owners(vips),
        "announcing": sorted({v["ip"] for v in vips if v.get("announcing")}),
        "config": status.get("config") or {},
        "conflicts": status.get("conflicts") or [],
        "labels": labels,
        "drained": DRAIN_LABEL in labels,
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "socket": {"type": "path", "default": "/run/nocloudlb/speaker.sock"},
            "timeout": {"type": "float", "default": 5.0},
        },
        supports_check_mode=True,
    )
    path = module.params["socket"]
    try:
        status = request(path, {"cmd": "status", "vips": "all", "announcers": True}, module.params["timeout"])
    except FileNotFoundError:
        module.fail_json(msg=f"socket: {path} does not exist; is nocloudlb-speaker.service running on this node?")
    except ConnectionRefusedError:
        module.fail_json(msg=f"socket: {path} refuses connections; is nocloudlb-speaker.service running?")
    except PermissionError:
        module.fail_json(msg=f"socket: no permission to connect to {path}; run the task with become: true")
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"socket: cannot read the status from {path}: {exc}")
    if status.get("ok") is False:
        module.fail_json(msg=f"the speaker refused the status request: {status.get('error', status)}")
    module.exit_json(changed=False, **summarize(status))


if __name__ == "__main__":
    main()
