# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""router_cidrs: the fewest CIDRs that cover pool entries (CIDRs or ``a-b`` ranges), with netaddr."""

from __future__ import annotations

DOCUMENTATION = r"""
name: router_cidrs
short_description: The fewest CIDRs covering address pools, for a router's prefix list
version_added: 0.1.0
author: nocloud.loadbalancer developers
description:
  - Turns pool entries (CIDRs or C(first-last) ranges, IPv4 and IPv6) into the fewest CIDRs that
    cover them (netaddr C(cidr_merge)), each with its IP version and the host length
    (C(le), 32 or 128) a pool-only prefix list admits.
options:
  _input:
    description: Pool entries.
    type: list
    elements: str
    required: true
requirements: [netaddr]
"""

EXAMPLES = r"""
- name: Prefix list lines
  ansible.builtin.debug:
    msg: "{{ ['203.0.113.0/26', '203.0.113.64-203.0.113.70'] | nocloud.loadbalancer.router_cidrs }}"
"""

RETURN = r"""
_value:
  description: One mapping per CIDR, with keys C(cidr), C(version) and C(le).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError  # noqa: E402 - after the documentation, as Ansible's plugins

try:
    import netaddr
except ImportError:  # reported when the filter is used
    netaddr = None


def router_cidrs(pools):
    if netaddr is None:
        raise AnsibleFilterError("router_cidrs needs the netaddr Python library on the controller")
    nets = []
    for entry in pools or []:
        text = str(entry).strip()
        try:
            if "-" in text:
                first, last = (part.strip() for part in text.split("-", 1))
                nets.extend(netaddr.IPRange(first, last).cidrs())
            else:
                nets.append(netaddr.IPNetwork(text).cidr)
        except (netaddr.AddrFormatError, ValueError, TypeError) as exc:
            raise AnsibleFilterError(f"router_pools: invalid address range {text!r}: {exc}") from exc
    merged = netaddr.cidr_merge(nets)
    return [{"cidr": str(n), "version": n.version, "le": 32 if n.version == 4 else 128} for n in merged]


class FilterModule:
    def filters(self):
        return {"router_cidrs": router_cidrs}
