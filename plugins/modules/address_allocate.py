#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: address_allocate
short_description: Give LoadBalancer services stable addresses from MetalLB-style pools
version_added: "0.1.0"
description:
  - Reads MetalLB-shaped documents (IPAddressPool, L2Advertisement, BGPAdvertisement, BGPPeer, BFDProfile,
    Community, v1 Namespace and v1 Service of type LoadBalancer) and assigns every service of our
    load balancer class its addresses, with MetalLB's rules.
  - C(metallb.io/loadBalancerIPs) (or the deprecated C(spec.loadBalancerIP), never both) asks for exact
    addresses; C(metallb.io/address-pool) names a pool; C(metallb.io/allow-shared-ip) lets services with the
    same key share an address when their ports and protocols do not overlap and their traffic policies are
    compatible. Pools with C(autoAssign=false) serve only services that name them. C(serviceAllocation)
    (priority, namespaces, namespaceSelectors, serviceSelectors) pins pools to the services they select.
    C(avoidBuggyIPs) pools never hand out IPv4 addresses ending in .0 or .255.
  - Dual stack follows C(spec.ipFamilyPolicy) (SingleStack, PreferDualStack, RequireDualStack) and
    C(spec.ipFamilies). A SingleStack service without C(spec.ipFamilies) takes one address of either family,
    IPv4 first; a PreferDualStack service that declares one family in C(spec.ipFamilies) gets that family only,
    as with MetalLB. Both addresses of a dual-stack service come from the same pool.
  - Services whose C(spec.loadBalancerClass) is set to something other than C(nocloud.io/loadbalancer) are
    left alone, without error.
  - Unlike MetalLB, the choice is deterministic (pinned pools by priority then name, then the other pools by
    name; services in a fixed order, whatever the order of the documents) and stable. Given the assignments
    of the last run in O(previous) (or, for a service missing there, its own C(status.loadBalancer.ingress)),
    every service keeps its addresses while other services and pools come and go, unless its own request, its
    pool or its sharing rules make that impossible. Services that held addresses are served first, then new
    services asking for exact addresses, then those naming a pool, then the rest, by key in each group.
  - Under C(externalTrafficPolicy=Local), MetalLB lets services share an address only when they select the
    same pods. Here there are no pods; Local services may share an address only with Local services that
    carry the same C(nocloud.io/health-check) annotation (or none). Cluster services share only with
    Cluster services.
  - For C(serviceAllocation.namespaceSelectors), a namespace's labels come from the v1 Namespace documents in
    O(resources), plus C(kubernetes.io/metadata.name) set to its name, as Kubernetes does.
  - "A service that cannot be served is reported with MetalLB's message
    C(Failed to allocate IP for \"ns/name\": <reason>) and every other service still gets its addresses. That
    includes a request that is not an address, both C(metallb.io/loadBalancerIPs) and C(spec.loadBalancerIP),
    or two addresses of one family. Only a malformed manifest (a document that is not a mapping, an unknown
    kind, a bad pool) fails the whole task, listing every problem in RV(errors)."
  - The module only computes; it changes nothing on the host, so check mode gives the same answer.
author:
  - nocloud.loadbalancer developers (@nocloud)
options:
  previous:
    description:
      - The assignments of the last run, service key (C(namespace/name)) to its addresses, as returned in
        RV(assignments). A key present here wins over that service's C(status.loadBalancer.ingress); an empty
        list means the service had no address.
    type: dict
    default: {}
  fail_on_error:
    description:
      - Fail the task when one or more services could not get an address. The other services' addresses are
        returned either way.
      - When V(false), the messages are returned in RV(failures) and as warnings.
    type: bool
    default: true
extends_documentation_fragment:
  - nocloud.loadbalancer.resources
  - nocloud.loadbalancer.attributes
attributes:
  check_mode:
    support: full
    description: Can run in check_mode and return changed status prediction without modifying target.
    details: The module only computes; check mode returns exactly the same result.
  diff_mode:
    support: full
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    details: The diff shows the assignments before (O(previous) and the services' status) and after.
notes:
  - Store RV(assignments) (for example in a file on the controller) and pass it back as O(previous) on the
    next run, or deploy the returned RV(services), whose C(status.loadBalancer.ingress) carries the same
    information.
seealso:
  - module: nocloud.loadbalancer.pool_validate
  - name: MetalLB IP address sharing and pool selection
    description: The semantics this module follows.
    link: https://metallb.universe.tf/usage/
"""

EXAMPLES = r"""
- name: Allocate addresses for the services of a MetalLB manifest, keeping those of the last run
  nocloud.loadbalancer.address_allocate:
    resources: "{{ lookup('ansible.builtin.file', 'metallb.yaml') | ansible.builtin.from_yaml_all | list }}"
    previous: >-
      {{ (lookup('ansible.builtin.file', 'assignments.json', errors='ignore') or '{}')
         | ansible.builtin.from_json }}
  register: allocation

- name: Keep the assignments for the next run
  ansible.builtin.copy:
    content: "{{ allocation.assignments | to_nice_json }}"
    dest: assignments.json
    mode: "0644"
  delegate_to: localhost

- name: A pool, one plain service, one asking for a pool and two sharing an address
  nocloud.loadbalancer.address_allocate:
    resources:
      - apiVersion: metallb.io/v1beta1
        kind: IPAddressPool
        metadata: {name: default}
        spec: {addresses: [198.51.100.200-198.51.100.220]}
      - apiVersion: metallb.io/v1beta1
        kind: IPAddressPool
        metadata: {name: reserved}
        spec: {addresses: [203.0.113.0/28], autoAssign: false, avoidBuggyIPs: true}
      - apiVersion: v1
        kind: Service
        metadata: {name: web, namespace: prod}
        spec: {type: LoadBalancer, ports: [{port: 443, protocol: TCP}]}
      - apiVersion: v1
        kind: Service
        metadata: {name: db, namespace: prod, annotations: {metallb.io/address-pool: reserved}}
        spec: {type: LoadBalancer, ports: [{port: 5432}]}
      - apiVersion: v1
        kind: Service
        metadata: {name: dns-tcp, namespace: infra, annotations: {metallb.io/allow-shared-ip: dns}}
        spec: {type: LoadBalancer, ports: [{port: 53, protocol: TCP}]}
      - apiVersion: v1
        kind: Service
        metadata: {name: dns-udp, namespace: infra, annotations: {metallb.io/allow-shared-ip: dns}}
        spec: {type: LoadBalancer, ports: [{port: 53, protocol: UDP}]}
  register: allocation

- name: Report failures without failing the play
  nocloud.loadbalancer.address_allocate:
    resources: "{{ manifest }}"
    previous: "{{ last_assignments | default({}) }}"
    fail_on_error: false
  register: allocation
"""

RETURN = r"""
services:
  description:
    - Every Service document of O(resources), in input order. Services of our class carry their addresses in
      C(status.loadBalancer.ingress) (empty when they got none) and the pool in the
      C(metallb.io/ip-allocated-from-pool) annotation, as MetalLB's controller writes them. Other services are
      returned unchanged.
  returned: success or failure to allocate
  type: list
  elements: dict
  sample:
    - apiVersion: v1
      kind: Service
      metadata:
        name: web
        namespace: prod
        annotations: {metallb.io/ip-allocated-from-pool: default}
      spec: {type: LoadBalancer, ports: [{port: 443, protocol: TCP}]}
      status: {loadBalancer: {ingress: [{ip: 198.51.100.200}]}}
assignments:
  description: Service key to its addresses (primary family first), for the services that got some.
  returned: success or failure to allocate
  type: dict
  sample: {"prod/web": ["198.51.100.200"], "infra/dns-tcp": ["198.51.100.201"], "infra/dns-udp": ["198.51.100.201"]}
pools_by_service:
  description: Service key to the name of the pool its addresses come from.
  returned: success or failure to allocate
  type: dict
  sample: {"prod/web": "default"}
failures:
  description:
    - One MetalLB-style message per service that got no address, in key order.
    - Named so because C(failed) is Ansible's own result flag.
  returned: always
  type: list
  elements: str
  sample: ['Failed to allocate IP for "prod/big": no available IPs']
changes:
  description:
    - What changed against O(previous) (and the services' own status).
    - C(added) and C(removed) map keys to addresses; C(changed) maps keys to C(before) and C(after).
  returned: success or failure to allocate
  type: dict
  sample: {"added": {"prod/web": ["198.51.100.200"]}, "changed": {}, "removed": {}}
unmanaged:
  description:
    - Services left alone (another loadBalancerClass), key to the reason.
    - Not called C(skipped), which is Ansible's own result flag.
  returned: success or failure to allocate
  type: dict
  sample: {"prod/other": "spec.loadBalancerClass is 'example.com/lb', not 'nocloud.io/loadbalancer'"}
pools:
  description: Per pool and family (C(ipv4), C(ipv6)), the number of addresses assigned and still available.
  returned: success or failure to allocate
  type: dict
  sample: {"default": {"ipv4": {"assigned": 3, "available": 18}}}
errors:
  description: Every problem found in O(resources) or O(previous) when they cannot be used at all.
  returned: when the configuration is invalid
  type: list
  elements: str
  sample: ['IPAddressPool "default": spec.addresses[0]: invalid CIDR "198.51.100.0/33"']
"""

import copy  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils._argspec import resources_spec  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.allocation import (  # noqa: E402
    ANNOTATION_ALLOCATED_FROM_POOL,
    allocate,
)
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.errors import ConfigError  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.schema import parse_resources  # noqa: E402


def _service_docs(resources):
    """The Service documents of ``resources`` in order, including the items of v1 List documents."""
    for doc in resources:
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "List" and doc.get("apiVersion") == "v1":
            for item in doc.get("items") or []:
                if isinstance(item, dict) and item.get("kind") == "Service":
                    yield item
        elif doc.get("kind") == "Service":
            yield doc


def _with_status(doc, assignment):
    out = copy.deepcopy(doc)
    meta = out.setdefault("metadata", {})
    annotations = dict(meta.get("annotations") or {})
    if assignment.ips:
        out["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in assignment.ips]}}
        annotations[ANNOTATION_ALLOCATED_FROM_POOL] = assignment.pool
    else:
        out["status"] = {"loadBalancer": {}}
        annotations.pop(ANNOTATION_ALLOCATED_FROM_POOL, None)
    meta["annotations"] = annotations
    return out


def run(params):
    """Compute the module's result from its parameters (separated for testing without Ansible's plumbing)."""
    config = parse_resources(params["resources"])
    result = allocate(config, params.get("previous") or {})
    services = []
    for doc in _service_docs(params["resources"]):
        meta = doc.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        assignment = result.services.get(key)
        services.append(_with_status(doc, assignment) if assignment is not None else copy.deepcopy(doc))
    return result, {
        "services": services,
        "assignments": result.assignments,
        "pools_by_service": {key: a.pool for key, a in result.services.items() if a.ips},
        "failures": result.failed,
        "changes": result.changes,
        "unmanaged": result.skipped,
        "pools": result.pool_usage,
        "changed": result.changed,
    }


def main():
    argument_spec = resources_spec()
    argument_spec.update(
        previous=dict(type="dict", default={}),
        fail_on_error=dict(type="bool", default=True),
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    try:
        result, out = run(module.params)
    except ConfigError as exc:
        count = len(exc.errors)
        module.fail_json(
            msg=f"invalid load balancer configuration ({count} problem{'' if count == 1 else 's'}):\n{exc}",
            errors=exc.errors,
            failures=[],
        )
    if module._diff:
        out["diff"] = {
            "before": dict(sorted(result.previous.items())),
            "after": dict(sorted(result.assignments.items())),
            "before_header": "assignments",
            "after_header": "assignments",
        }
    if result.failed:
        if module.params["fail_on_error"]:
            module.fail_json(msg="\n".join(result.failed), **out)
        for message in result.failed:
            module.warn(message)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
