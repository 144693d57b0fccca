# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The `resources` option: MetalLB-shaped documents.
    DOCUMENTATION = r"""
options:
  resources:
    description:
      - The configuration, as the documents of a MetalLB manifest (C(apiVersion), C(kind), C(metadata), C(spec)),
        for example a manifest file read with the C(ansible.builtin.file) lookup and the
        C(ansible.builtin.from_yaml_all) filter.
      - "Kinds in C(metallb.io/v1beta1): C(IPAddressPool), C(L2Advertisement), C(BGPAdvertisement), C(BFDProfile),
        C(Community); C(BGPPeer) in C(metallb.io/v1beta2) (C(v1beta1) accepted)."
      - "Kinds in C(v1): C(Service) of type C(LoadBalancer) (with MetalLB's annotations C(metallb.io/loadBalancerIPs),
        C(metallb.io/address-pool), C(metallb.io/allow-shared-ip)), C(Namespace) (labels for
        C(serviceAllocation.namespaceSelectors)), C(Secret) (for C(BGPPeer.spec.passwordSecret)), and C(List)."
      - "Our own Service annotation C(nocloud.io/health-check) says how a node checks its local backend, which stands
        in for endpoints under C(externalTrafficPolicy: Local): C(tcp://HOST:PORT), C(http://HOST:PORT/PATH),
        C(https://HOST:PORT/PATH), C(exec:COMMAND ARGS), or a JSON object with keys C(type), C(host), C(port),
        C(path), C(command), C(interval), C(timeout), C(rise), C(fall). HOST defaults to C(127.0.0.1), PORT to the
        service's first port."
      - Decoding is strict, as Kubernetes' strict field validation is; an unknown field is an error naming it.
        Empty documents (C(null), from a stray C(---)) are skipped.
    type: list
    elements: dict
    required: true
"""
