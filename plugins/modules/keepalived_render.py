#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: keepalived_render
short_description: Render the same VIPs as keepalived/VRRP configuration, for comparison and migration
version_added: 0.2.0
description:
  - Reads the documents the speaker reads (pools, L2Advertisements, Services with their allocated addresses in
    C(status.loadBalancer.ingress), and C(nocloud.io/v1alpha1) C(Backends)) and the cluster's nodes, and renders
    each node's C(keepalived.conf).
  - One C(vrrp_instance) per VIP and interface (or per pool, family and interface), VRRPv3 by default,
    C(advert_int) from the profile (C(lan) 1 s, C(fast) 0.1 s).
  - Priorities follow the speaker's election order (C(sha256(node#vip)), preferredNodeSelectors first), so the same
    node is master for the same VIP under both systems; keepalived preempts, as the speaker does.
  - Virtual router IDs are deterministic and stable per interface and family (the last run's IDs in O(previous)
    are kept), avoid O(taken_vrids), and a request for more than 255 is refused naming the limit.
  - Local-policy services get a C(vrrp_script) from their C(nocloud.io/health-check) (weight 0, a failure moves
    the VIP); the drain label is a C(track_file) (write C(1) to O(drain_file) to move every VIP of a node away).
  - Services with C(Backends) get C(virtual_server) blocks (methods C(nat), C(dr), C(tun) as C(lb_kind) NAT, DR,
    TUN; schedulers C(rr), C(wrr), C(sh), C(maglev) as C(rr), C(wrr), C(sh), C(mh)). C(fullnat) is refused,
    since LVS has no full-NAT method.
  - Reads nothing but its arguments and changes nothing; write the result with M(ansible.builtin.copy) (with
    C(validate) running C(keepalived -t)), as the C(nocloud.loadbalancer.keepalived) role does.
author:
  - nocloud.loadbalancer developers (@nocloud)
extends_documentation_fragment:
  - nocloud.loadbalancer.resources
  - nocloud.loadbalancer.attributes
  - nocloud.loadbalancer.attributes.read_only
options:
  nodes:
    description:
      - The cluster's nodes. Each is a mapping with C(name) (the node name the speaker uses), C(labels) (matched by
        the advertisements' node selectors), C(interfaces) (the interfaces the node has; when given, an instance
        on an interface the node lacks is refused), C(addresses) (its own IPv4 and IPv6 addresses, for unicast
        adverts) and C(interface) (its instances' interface when no advertisement names one).
      - A plain string is a node name.
    type: list
    elements: raw
    required: true
  node:
    description: Render only this node's configuration (a name in O(nodes)). Default is every node.
    type: str
  service:
    description:
      - Also return, under RV(service), the speaker's and keepalived's view of this one service (C(namespace/name)),
        for a side-by-side comparison.
    type: str
  version:
    description: VRRP version. VRRPv2 carries IPv4 only, in whole-second adverts; VRRPv3 both families.
    type: int
    choices: [2, 3]
    default: 3
  profile:
    description: Timing profile mirroring the speaker's, C(lan) (advert_int 1 s) or C(fast) (0.1 s, VRRPv3 only).
    type: str
    choices: [lan, fast]
    default: lan
  advert_int:
    description: Advertisement interval in seconds, overriding O(profile).
    type: float
  group_by:
    description:
      - One instance per VIP (C(vip)), or per pool and family (C(pool), which saves VRIDs; the master
        follows the election of the pool's first VIP).
    type: str
    choices: [vip, pool]
    default: vip
  interface:
    description: The instances' interface when neither the advertisement nor the node names one.
    type: str
    default: eth0
  priority_base:
    description: Priority of the first node in the election order (at most 254; 255 is the address owner's).
    type: int
    default: 254
  priority_step:
    description:
      - Priority drop per place in the election order (0 would tie, and is refused).
      - Unset, the candidates of each instance are spread evenly over 1 to O(priority_base) (3 nodes get 254, 128,
        2). A backup takes over a master that gives up after (256 - priority) / 256 advert intervals, so priorities
        1 apart fire 1/256 of an interval apart, too close for the first's advert to stop the second; both then send
        gratuitous ARPs and clients may follow the one that steps back.
    type: int
  unicast:
    description: Send adverts to the other members' addresses (C(unicast_peer)) instead of multicast.
    type: bool
    default: false
  auth_pass:
    description: VRRPv2 simple password (1-8 characters). VRRPv3 has no authentication; refused with version 3.
    type: str
    default: ""
  vrids:
    description: Pinned virtual router IDs, instance name or VIP -> ID. A pin colliding with another pin or with
      O(taken_vrids) is refused.
    type: dict
    default: {}
  previous:
    description: The last run's instance name -> ID (RV(vrids) of a previous run); kept while still free.
    type: dict
    default: {}
  taken_vrids:
    description: IDs other VRRP users already use on a segment, as C({interface, family (IPv4|IPv6), vrids}).
    type: list
    elements: dict
    default: []
  drain_file:
    description: The track file standing in for the drain label (non-zero = every instance in FAULT).
    type: path
    default: /etc/keepalived/nocloudlb-drain
  script_user:
    description: The user keepalived runs the health check scripts as.
    type: str
    default: nobody
  services:
    description:
      - The services keepalived owns (C(namespace/name)); the speaker serves the others. Default is every service.
      - Virtual router IDs are computed over every service, so an ID does not change when a service moves between
        keepalived and the speaker. Services sharing a VIP move together.
    type: list
    elements: str
seealso:
  - module: nocloud.loadbalancer.address_allocate
  - name: keepalived configuration synopsis
    description: keepalived's own reference of the keywords rendered here.
    link: https://keepalived.readthedocs.io/en/latest/configuration_synopsis.html
"""

EXAMPLES = r"""
- name: Render every node's keepalived.conf from the allocated resources
  nocloud.loadbalancer.keepalived_render:
    resources: "{{ allocated }}"
    nodes:
      - {name: n1, addresses: [198.51.100.11], interfaces: [eth0]}
      - {name: n2, addresses: [198.51.100.12], interfaces: [eth0]}
    profile: fast
  register: kad

- name: Show which node is master of which VIP under keepalived
  ansible.builtin.debug:
    var: kad.masters

- name: Compare both systems for one service
  nocloud.loadbalancer.keepalived_render:
    resources: "{{ allocated }}"
    nodes: [n1, n2, n3]
    service: prod/web
  register: compare
"""

RETURN = r"""
configs:
  description: Node name -> the text of its keepalived.conf.
  returned: success
  type: dict
  sample: {"n1": "global_defs {\n    router_id n1\n ..."}
instances:
  description:
    - Every VRRP instance of the cluster.
    - C(hold_file) is the instance's own track file (C(1) = FAULT on that node), beside O(drain_file). A migration
      writes C(1) on the backups before they reload and learn the instance, and C(0) once they have heard the master.
  returned: success
  type: list
  elements: dict
  sample: [{"name": "vip_198_51_100_200_eth0", "family": "IPv4", "segment": "eth0", "vrid": 170,
            "vips": ["198.51.100.200"], "hold_file": "/etc/keepalived/nocloudlb-hold-vip_198_51_100_200_eth0",
            "services": ["prod/web"], "master": "n1",
            "members": [{"node": "n1", "priority": 254, "interface": "eth0"}], "scripts": []}]
vrids:
  description: Instance name -> virtual router ID (feed it back as O(previous) to keep them stable).
  returned: success
  type: dict
  sample: {"vip_198_51_100_200_eth0": 170}
masters:
  description: VIP -> the node keepalived makes master when every member is up (the speaker's leader).
  returned: success
  type: dict
  sample: {"198.51.100.200": "n1"}
service:
  description: With O(service), the two views of it - C(speaker) (its documents and the election order, YAML-like
    text) and C(keepalived) (its vrrp_instance and virtual_server blocks of the master's config).
  returned: when O(service) is given
  type: dict
  sample: {"speaker": "...", "keepalived": "..."}
"""

import json  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils._argspec import resources_spec  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.errors import ConfigError  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.keepalived import (  # noqa: E402
    plan,
    render,
    service_views,
    summary,
)

OPTIONS = ("version", "profile", "advert_int", "group_by", "interface", "priority_base", "priority_step", "unicast",
           "auth_pass", "vrids", "previous", "taken_vrids", "drain_file", "script_user", "services")


def run(params):
    """The module's result from its parameters (separated for testing without Ansible's plumbing)."""
    p = plan(params["resources"], params["nodes"], {k: params.get(k) for k in OPTIONS})
    names = [params["node"]] if params.get("node") else sorted(p.nodes)
    out = {
        "configs": {name: render(p, name) for name in names},
        "instances": summary(p),
        "vrids": p.vrids(),
        "masters": p.masters(),
        "changed": False,
    }
    if params.get("service"):
        out["service"] = service_views(p, params["resources"], params["service"])
    return out


def main():
    argument_spec = resources_spec()
    argument_spec.update(
        nodes=dict(type="list", elements="raw", required=True),
        node=dict(type="str"),
        service=dict(type="str"),
        version=dict(type="int", choices=[2, 3], default=3),
        profile=dict(type="str", choices=["lan", "fast"], default="lan"),
        advert_int=dict(type="float"),
        group_by=dict(type="str", choices=["vip", "pool"], default="vip"),
        interface=dict(type="str", default="eth0"),
        priority_base=dict(type="int", default=254),
        priority_step=dict(type="int"),
        unicast=dict(type="bool", default=False),
        auth_pass=dict(type="str", default="", no_log=True),
        vrids=dict(type="dict", default={}),
        previous=dict(type="dict", default={}),
        taken_vrids=dict(type="list", elements="dict", default=[]),
        drain_file=dict(type="path", default="/etc/keepalived/nocloudlb-drain"),
        script_user=dict(type="str", default="nobody"),
        services=dict(type="list", elements="str"),
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    params = dict(module.params)
    # integers may arrive as strings from the inventory (-e, templated dicts)
    for key in ("vrids", "previous"):
        try:
            params[key] = {str(k): int(v) for k, v in (params[key] or {}).items()}
        except (TypeError, ValueError):
            module.fail_json(msg=f"{key}: every value must be a virtual router ID (an integer), got "
                                 f"{json.dumps(params[key], default=str)}")
    try:
        out = run(params)
    except ConfigError as exc:
        count = len(exc.errors)
        module.fail_json(msg=f"cannot render keepalived ({count} problem{'' if count == 1 else 's'}):\n{exc}",
                         errors=exc.errors)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
