# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""router_cidrs: the fewest CIDRs that cover pool entries (CIDRs or ``a-b`` ranges), with netaddr."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

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
