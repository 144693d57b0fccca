# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""l2_interface_problems: the interfaces a node's L2Advertisements name that it cannot announce on."""

from __future__ import annotations

DOCUMENTATION = r"""
name: l2_interface_problems
short_description: Interfaces named by a node's L2Advertisements that the node cannot announce on
version_added: 0.1.0
author: nocloud.loadbalancer developers
description:
  - For the L2Advertisements among the documents that select the node (C(nodeSelectors) against the
    node's labels), every interface they name (C(spec.interfaces)) that the node's gathered facts show
    missing, down (not active), the loopback, or enslaved to a bond or a bridge (a bond slave named
    instead of the bond). The speaker never announces on such an interface, so a VIP led by the node
    would be announced on nothing.
  - An L2Advertisement with no C(interfaces) (every eligible interface) names none and is not checked.
options:
  _input:
    description: MetalLB documents (IPAddressPool, L2Advertisement, Service, ...).
    type: list
    elements: dict
    required: true
  labels:
    description: The node's labels (C(nocloudlb_node_labels)).
    type: dict
    required: true
  facts:
    description: The node's gathered facts (C(ansible_facts)), with the network subset.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Interfaces this node cannot announce on
  ansible.builtin.debug:
    msg: "{{ documents | nocloud.loadbalancer.l2_interface_problems(nocloudlb_node_labels, ansible_facts) }}"
"""

RETURN = r"""
_value:
  description: >-
    One mapping per interface, sorted by name, with keys C(iface), C(reason) (C(missing), C(down),
    C(loopback), C(enslaved)), C(detail) (words for people) and C(advertisements) (the names of the
    L2Advertisements that name it).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError  # noqa: E402 - after the documentation, as Ansible's plugins
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.pools import selector_matches  # noqa: E402


def _fact(facts, name):
    """The facts of interface ``name`` (Ansible writes ``-`` and ``:`` in fact names as ``_``)."""
    for key in (name, name.replace("-", "_"), name.replace(":", "_"), name.replace("-", "_").replace(":", "_")):
        value = facts.get(key)
        if isinstance(value, dict) and "device" in value:
            return value
    return None


def _masters(facts):
    """Interface -> the bond or bridge it belongs to, from the facts of bonds (slaves) and bridges (interfaces)."""
    out = {}
    for name in facts.get("interfaces") or []:
        info = _fact(facts, name) or {}
        if info.get("type") == "bonding":
            for port in info.get("slaves") or []:
                out[port] = f"bond {info.get('device', name)}"
        elif info.get("type") == "bridge":
            for port in info.get("interfaces") or []:
                out.setdefault(port, f"bridge {info.get('device', name)}")
    return out


def l2_interface_problems(documents, labels, facts):
    if not isinstance(facts, dict) or "interfaces" not in facts:
        raise AnsibleFilterError("l2_interface_problems needs the node's facts with the network subset "
                                 "(gather_facts, or setup with gather_subset network)")
    named = {}
    for doc in documents or []:
        if not isinstance(doc, dict) or doc.get("kind") != "L2Advertisement":
            continue
        spec = doc.get("spec") or {}
        selectors = spec.get("nodeSelectors") or []
        if selectors and not any(selector_matches(s, labels or {}) for s in selectors):
            continue
        for name in spec.get("interfaces") or []:
            named.setdefault(str(name), []).append(str((doc.get("metadata") or {}).get("name", "")))
    masters = _masters(facts)
    out = []
    for name in sorted(named):
        info = _fact(facts, name)
        if info is None:
            have = ", ".join(sorted(str(i) for i in facts.get("interfaces") or [])) or "none"
            reason, detail = "missing", f"no such interface on this node (it has: {have})"
        elif name in masters:
            master = masters[name]
            reason, detail = "enslaved", (f"a port of {master}: name {master.split()[1]} instead "
                                          "(the speaker never announces on an enslaved interface)")
        elif info.get("type") == "loopback":
            reason, detail = "loopback", "the loopback interface: VIPs are held there, never announced"
        elif not info.get("active", True):
            reason, detail = "down", "the interface is down or has no carrier (operstate down)"
        else:
            continue
        out.append({"iface": name, "reason": reason, "detail": detail, "advertisements": named[name]})
    return out


class FilterModule:
    def filters(self):
        return {"l2_interface_problems": l2_interface_problems}
