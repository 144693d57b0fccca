#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a router's BGP routes: the next hops per prefix, from the kernel or from FRR's zebra."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bgp_route_info
short_description: Read the next hops a router uses for the load balancer's BGP prefixes
version_added: "0.2.0"
description:
  - Runs on a router (delegate to it) and returns, per prefix, the next hops the router forwards by,
    from the kernel's table (C(ip -j route show proto bgp), the default, any Linux router) or from
    FRR's zebra (C(vtysh -c 'show ip route bgp json') and its IPv6 twin, next hops installed in the FIB).
  - With O(next_hop), also lists the prefixes still routed through that address, so a play can wait
    with C(until) for a drained node to be gone from the router (C(playbooks/drain.yml) does).
  - The router's word, independent of what the speakers report (M(nocloud.loadbalancer.speaker_info)).
options:
  prefixes:
    description:
      - The prefixes to report (C(203.0.113.10) and C(203.0.113.10/32) are the same). A prefix the router
        has no route for is returned with no next hops.
      - By default every route the source holds as learned from BGP.
    type: list
    elements: str
    default: []
  next_hop:
    description: An address (a node's); RV(through_next_hop) lists the prefixes with it among their next hops.
    type: str
  source:
    description:
      - C(kernel) reads C(ip -j route) (what the router forwards by; any Linux router).
      - C(frr) asks FRR's zebra through C(vtysh) (routes selected and installed, next hops in the FIB).
    type: str
    choices: [kernel, frr]
    default: kernel
  vrf:
    description: The VRF to read (kernel table of that VRF device, or FRR's C(vrf NAME)).
    type: str
extends_documentation_fragment:
  - nocloud.loadbalancer.attributes
  - nocloud.loadbalancer.attributes.READ_ONLY
requirements:
  - C(iproute2) with JSON output (C(ip -j)) for O(source=kernel); FRR's C(vtysh) for O(source=frr).
notes:
  - Needs the rights to run C(vtysh) for O(source=frr) (root or the C(frrvty) group).
seealso:
  - module: nocloud.loadbalancer.node_drain
  - module: nocloud.loadbalancer.speaker_info
author:
  - nocloud.loadbalancer developers (@nocloud)
"""

EXAMPLES = r"""
- name: Next hops of a VIP at the router
  nocloud.loadbalancer.bgp_route_info:
    prefixes: [203.0.113.10]
  delegate_to: r1
  register: vip_routes

- name: Wait until the router no longer routes anything through n1 (after draining it)
  nocloud.loadbalancer.bgp_route_info:
    next_hop: 198.51.100.11
  delegate_to: r1
  register: router_view
  until: router_view.through_next_hop | length == 0
  retries: 60
  delay: 0.5

- name: The same question to FRR's zebra, in a VRF
  nocloud.loadbalancer.bgp_route_info:
    source: frr
    vrf: red
    next_hop: 198.51.100.11
  delegate_to: r1
"""

RETURN = r"""
routes:
  description: Prefix (canonical CIDR) -> its next hops, sorted; empty when the router has no route for it.
  returned: success
  type: dict
  sample: {"203.0.113.10/32": ["198.51.100.11", "198.51.100.12", "198.51.100.13"]}
through_next_hop:
  description: With O(next_hop), the prefixes of RV(routes) that have it among their next hops.
  returned: success
  type: list
  elements: str
  sample: ["203.0.113.10/32"]
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 (after the docs, as Ansible modules are)
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.routes import (  # noqa: E402
    canonical_prefix,
    kernel_routes,
    through,
    zebra_routes,
)


def read(module, source, vrf, family):
    if source == "kernel":
        args = ["ip", "-j", "-6" if family == 6 else "-4", "route", "show"]
        if vrf:
            args += ["vrf", vrf]
        rc, out, err = module.run_command(args + ["proto", "bgp"])
        if rc != 0:
            module.fail_json(msg=f"{' '.join(args)} failed (rc {rc}): {err.strip()}")
        return kernel_routes(out)
    command = f"show {'ipv6' if family == 6 else 'ip'} route{' vrf ' + vrf if vrf else ''} bgp json"
    rc, out, err = module.run_command(["vtysh", "-c", command])
    if rc != 0:
        module.fail_json(msg=f"vtysh -c '{command}' failed (rc {rc}): {(err or out).strip()}")
    try:
        return zebra_routes(out)
    except ValueError as exc:
        module.fail_json(msg=f"vtysh -c '{command}' did not return JSON: {exc}")
    return {}


def main():
    module = AnsibleModule(
        argument_spec={
            "prefixes": {"type": "list", "elements": "str", "default": []},
            "next_hop": {"type": "str"},
            "source": {"type": "str", "choices": ["kernel", "frr"], "default": "kernel"},
            "vrf": {"type": "str"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        wanted = [canonical_prefix(p) for p in params["prefixes"]]
        if params["next_hop"]:
            canonical_prefix(params["next_hop"])
    except ValueError as exc:
        module.fail_json(msg=f"not an address or prefix: {exc}")
    families = {6 if ":" in p else 4 for p in wanted} if wanted else {4, 6}
    if params["next_hop"] and not wanted:
        families = {6 if ":" in params["next_hop"] else 4}
    found = {}
    for family in sorted(families):
        found.update(read(module, params["source"], params["vrf"], family))
    routes = {p: found.get(p, []) for p in wanted} if wanted else found
    result = {"changed": False, "routes": routes}
    if params["next_hop"]:
        result["through_next_hop"] = through(routes, params["next_hop"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
