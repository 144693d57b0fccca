#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: pool_validate
short_description: Check MetalLB-style address pools and advertisements before anything is deployed
version_added: 0.1.0
description:
  - Reads the documents of a MetalLB manifest (IPAddressPool, L2Advertisement, BGPAdvertisement, BGPPeer,
    BFDProfile, Community, and v1 Services of type LoadBalancer) and checks them the way MetalLB's admission
    webhook and configuration loader do, with MetalLB's wording.
  - Fails with every problem at once, each naming the resource, the field and the bad value.
  - On success returns the pools normalized, with per-family counts of total, assigned and available addresses
    (the assigned ones are read from the services' C(status.loadBalancer.ingress)), and a summary of the
    advertisements.
  - Runs on the controller or any host; it reads nothing but its arguments (and, with O(check_password_files),
    the BGPPeers' C(passwordFile)s on the host it runs on) and changes nothing.
options:
  check_password_files:
    description:
      - Also read each BGPPeer's C(spec.passwordFile) (an absolute path on the host the module runs on, so run it on
        the nodes, not delegated to the controller) and refuse the configuration when one is missing, unreadable,
        empty or holds a password FRR cannot take, as C(nocloudlb validate) and the speaker's (re)load do.
      - The password itself never appears in the result or in a message.
    type: bool
    default: false
author:
  - nocloud.loadbalancer developers (@nocloud)
extends_documentation_fragment:
  - nocloud.loadbalancer.resources
  - nocloud.loadbalancer.attributes
  - nocloud.loadbalancer.attributes.read_only
notes:
  - "Checks, besides strict field decoding: CIDRs and C(a-b) ranges (MetalLB's C(invalid CIDR), C(start IP is after
    the end IP)), overlapping CIDRs across all pools, duplicate names, unknown pools and peers referenced by
    advertisements, C(serviceAllocation) (priority, duplicate namespaces, label selectors), BGPPeer timers
    (C(invalid hold time), C(keepaliveTime ... must be lower than holdTime)), ASNs, addresses, MetalLB's FRR-mode
    rules for peers on the same node (router ID, duplicate peer, myASN per VRF; peers with different nodeSelectors
    are taken to be on different nodes), BFD ranges, BFD echo towards IPv6 pools, community formats, aggregation
    lengths against the pools' prefixes, conflicting local preferences, and services
    (C(metallb.io/loadBalancerIPs) together with C(spec.loadBalancerIP), bad addresses, ports, IP families,
    health checks)."
  - Whether a service can actually get an address (pool full, address outside every pool, sharing rules) is
    decided by M(nocloud.loadbalancer.address_allocate), which reports such failures per service.
seealso:
  - module: nocloud.loadbalancer.address_allocate
  - name: MetalLB configuration
    description: The resources this module reads, as MetalLB documents them.
    link: https://metallb.io/configuration/
"""

EXAMPLES = r"""
- name: Check the load balancer configuration kept next to the inventory
  nocloud.loadbalancer.pool_validate:
    resources: "{{ lookup('ansible.builtin.file', 'metallb.yaml') | ansible.builtin.from_yaml_all | list }}"
  register: lb_pools

- name: Check pools given inline, one dual-stack
  nocloud.loadbalancer.pool_validate:
    resources:
      - apiVersion: metallb.io/v1beta1
        kind: IPAddressPool
        metadata:
          name: web
          namespace: metallb-system
        spec:
          addresses:
            - 198.51.100.200-198.51.100.220
            - 2001:db8:100::/120
      - apiVersion: metallb.io/v1beta1
        kind: L2Advertisement
        metadata:
          name: web
          namespace: metallb-system
        spec:
          ipAddressPools: [web]
          interfaces: [eth0]

- name: Stop when fewer than 5 IPv4 addresses are left in pool web
  ansible.builtin.assert:
    that: (lb_pools.pools | selectattr('name', 'eq', 'web') | first).counts.ipv4.available >= 5
"""

RETURN = r"""
pools:
  description: Every pool, in manifest order, normalized.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: The pool's C(metadata.name).
      type: str
      sample: web
    addresses:
      description: The pool's C(spec.addresses) as written.
      type: list
      elements: str
      sample: ["198.51.100.200-198.51.100.220", "2001:db8:100::/120"]
    cidrs:
      description: The same addresses as the fewest CIDRs (what a router's prefix-list needs).
      type: list
      elements: str
      sample: ["198.51.100.200/29", "198.51.100.208/29", "198.51.100.216/30", "198.51.100.220/32"]
    families:
      description: The address families present, C(IPv4) and/or C(IPv6).
      type: list
      elements: str
      sample: ["IPv4", "IPv6"]
    autoAssign:
      description: Whether services without a request may get addresses from this pool.
      type: bool
      sample: true
    avoidBuggyIPs:
      description: Whether IPv4 addresses ending in .0 or .255 are skipped.
      type: bool
      sample: false
    serviceAllocation:
      description:
        - The pool's C(serviceAllocation) (priority, namespaces, namespaceSelectors, serviceSelectors), or null.
      type: dict
      sample: {"priority": 10, "namespaces": ["prod"], "namespaceSelectors": [], "serviceSelectors": []}
    counts:
      description:
        - Per family present (C(ipv4), C(ipv6)), the usable addresses (C(total)), those used by services'
          C(status.loadBalancer.ingress) (C(assigned), a shared address counted once) and C(available).
      type: dict
      sample: {"ipv4": {"total": 21, "assigned": 1, "available": 20}, "ipv6": {"total": 256, "assigned": 0,
               "available": 256}}
    l2Advertisements:
      description: Names of the L2Advertisements that announce this pool.
      type: list
      elements: str
      sample: ["web"]
    bgpAdvertisements:
      description: Names of the BGPAdvertisements that announce this pool.
      type: list
      elements: str
      sample: []
advertisements:
  description:
    - Summary of the advertisements, pools resolved (an advertisement without pools or pool selectors covers every
      pool).
  returned: success
  type: dict
  contains:
    l2:
      description:
        - One entry per L2Advertisement, with C(name), C(pools), C(interfaces), C(nodeSelectors),
          C(serviceSelectors).
      type: list
      elements: dict
      sample: [{"name": "web", "pools": ["web"], "interfaces": ["eth0"], "nodeSelectors": [], "serviceSelectors": []}]
    bgp:
      description:
        - One entry per BGPAdvertisement, with C(name), C(pools), C(peers), C(aggregationLength),
          C(aggregationLengthV6), C(localPref), C(communities) (values, aliases resolved), C(nodeSelectors),
          C(serviceSelectors).
      type: list
      elements: dict
      sample: []
unpooled:
  description:
    - Addresses found in services' C(status.loadBalancer.ingress) that belong to no pool (a warning is also given).
  returned: success
  type: list
  elements: dict
  sample: [{"service": "prod/web", "ip": "192.0.2.9"}]
summary:
  description: How many resources of each kind were read.
  returned: success
  type: dict
  sample: {"pools": 1, "l2Advertisements": 1, "bgpAdvertisements": 0, "bgpPeers": 0, "bfdProfiles": 0,
           "communities": 0, "services": 2, "namespaces": 0}
errors:
  description: Every problem found, one per entry; also joined into C(msg).
  returned: failure
  type: list
  elements: str
  sample: ['IPAddressPool "web": spec.addresses[0]: invalid CIDR "198.51.100.0/33" in pool "web"']
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 (after the docs, as Ansible modules are)
from ansible_collections.nocloud.loadbalancer.plugins.module_utils._argspec import resources_spec  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.bgp import read_password_files  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.errors import ConfigError  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.pools import pool_counts  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.schema import parse_resources  # noqa: E402

FAMILY_NAMES = {4: "IPv4", 6: "IPv6"}


def summarize(config):
    """The module's result for a valid configuration."""
    assigned = []
    unpooled = []
    for svc in config.services:
        for ip in svc.ingress_ips:
            assigned.append(ip)
            if config.pool_for_ip(ip) is None:
                unpooled.append({"service": svc.key, "ip": ip})
    pools = []
    for pool in config.pools.values():
        allocation = None
        if pool.allocation is not None:
            allocation = {
                "priority": pool.allocation.priority,
                "namespaces": list(pool.allocation.namespaces),
                "namespaceSelectors": list(pool.allocation.namespace_selectors),
                "serviceSelectors": list(pool.allocation.service_selectors),
            }
        counts = pool_counts(pool, assigned)
        pools.append(
            {
                "name": pool.name,
                "addresses": [r.text for r in pool.ranges],
                "cidrs": [str(net) for r in pool.ranges for net in r.networks()],
                "families": [FAMILY_NAMES[v] for v in sorted(pool.families())],
                "autoAssign": pool.auto_assign,
                "avoidBuggyIPs": pool.avoid_buggy_ips,
                "serviceAllocation": allocation,
                "counts": {f"ipv{version}": value for version, value in counts.items()},
                "l2Advertisements": [adv.name for adv in config.l2_advertisements_for_pool(pool.name)],
                "bgpAdvertisements": [adv.name for adv in config.bgp_advertisements_for_pool(pool.name)],
            }
        )
    advertisements = {
        "l2": [
            {
                "name": adv.name,
                "pools": list(adv.pools),
                "interfaces": list(adv.interfaces),
                "nodeSelectors": list(adv.node_selectors),
                "serviceSelectors": list(adv.service_selectors),
            }
            for adv in config.l2_advertisements
        ],
        "bgp": [
            {
                "name": adv.name,
                "pools": list(adv.pools),
                "peers": list(adv.peers),
                "aggregationLength": adv.aggregation_length,
                "aggregationLengthV6": adv.aggregation_length_v6,
                "localPref": adv.local_pref,
                "communities": list(adv.communities),
                "nodeSelectors": list(adv.node_selectors),
                "serviceSelectors": list(adv.service_selectors),
            }
            for adv in config.bgp_advertisements
        ],
    }
    summary = {
        "pools": len(config.pools),
        "l2Advertisements": len(config.l2_advertisements),
        "bgpAdvertisements": len(config.bgp_advertisements),
        "bgpPeers": len(config.bgp_peers),
        "bfdProfiles": len(config.bfd_profiles),
        "communities": len(config.communities),
        "services": len(config.services),
        "namespaces": len(config.namespaces),
    }
    return {"pools": pools, "advertisements": advertisements, "unpooled": unpooled, "summary": summary}


def main():
    spec = resources_spec()
    spec["check_password_files"] = {"type": "bool", "default": False}
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    try:
        config = parse_resources(module.params["resources"])
        if module.params["check_password_files"]:
            problems = read_password_files(config)
            if problems:
                raise ConfigError(problems)
    except ConfigError as exc:
        count = len(exc.errors)
        module.fail_json(
            msg=f"invalid load balancer configuration ({count} problem{'' if count == 1 else 's'}):\n{exc}",
            errors=exc.errors,
        )
    result = summarize(config)
    for item in result["unpooled"]:
        module.warn(f"service {item['service']} has address {item['ip']} in status.loadBalancer.ingress, "
                    "which belongs to no pool")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
