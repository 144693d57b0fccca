# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""router_config: the router role's variables checked for the chosen router (FRR, BIRD 2, GoBGP) and
put in the shape its templates render; what a router cannot do is refused naming the router and field."""

from __future__ import annotations

DOCUMENTATION = r"""
name: router_config
short_description: The router role's variables, checked for one router kind
version_added: 0.1.0
author: nocloud.loadbalancer developers
description:
  - Takes the C(router_*) variables of the C(router) role as one mapping and checks them for the
    router in C(router_kind) (C(frr), C(bird) or C(gobgp)) before anything is rendered or written.
  - Refuses, with the router and the field named, what that router cannot do, for example BFD on
    GoBGP, a TCP MD5 password on GoBGP's dynamic neighbours, a password over the 80 bytes of a TCP
    MD5 key or one the nodes' FRR cannot hold (the core's C(password_problem)), a password BIRD cannot
    quote, a listen range that is not a CIDR or a pool that is not an address range.
  - Returns the values the templates use, normalised (CIDRs, timers, BFD intervals with defaults).
options:
  _input:
    description: The role's variables, keyed by their names (C(router_kind), C(router_asn), ...).
    type: dict
    required: true
requirements: [netaddr]
"""

EXAMPLES = r"""
- name: Check the router's variables
  ansible.builtin.set_fact:
    router__config: "{{ {'router_kind': 'bird', 'router_listen_ranges': ['198.51.100.0/24'],
                         'router_pools': ['203.0.113.0/26']} | nocloud.loadbalancer.router_config }}"
"""

RETURN = r"""
_value:
  description: >-
    A mapping with C(kind), C(asn), C(nodes_asn), C(ebgp), C(router_id), C(listen_ranges) (C(cidr),
    C(version)), C(pools) (as router_cidrs), C(pools4), C(pools6), C(maximum_paths),
    C(password_set) (the password itself is left out),
    C(bfd) (empty or C(receive_interval), C(transmit_interval), C(detect_multiplier)), C(keepalive), C(hold).
  type: dict
"""

from ansible.errors import AnsibleFilterError  # noqa: E402 - after the documentation, as Ansible's plugins

try:
    import netaddr
except ImportError:  # reported when the filter is used
    netaddr = None

from ansible_collections.nocloud.loadbalancer.plugins.filter.router_cidrs import router_cidrs  # noqa: E402
from ansible_collections.nocloud.loadbalancer.plugins.module_utils.schema import password_problem  # noqa: E402

KINDS = {"frr": "FRR", "bird": "BIRD", "gobgp": "GoBGP"}
BFD_KEYS = ("receive_interval", "transmit_interval", "detect_multiplier")
BFD_DEFAULTS = {"receive_interval": 300, "transmit_interval": 300, "detect_multiplier": 3}
# FRR's bfdd ranges (BIRD takes these too): intervals 10-60000 ms, multiplier 2-255.
BFD_RANGES = {"receive_interval": (10, 60000), "transmit_interval": (10, 60000), "detect_multiplier": (2, 255)}


class _Refused(AnsibleFilterError):
    pass


def _int(value, kind, field, low, high):
    if isinstance(value, bool):
        raise _Refused(f"router {kind}: {field}: {value!r} is not a number")
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        raise _Refused(f"router {kind}: {field}: {value!r} is not a number") from None
    if not low <= number <= high:
        raise _Refused(f"router {kind}: {field}: {number} is outside {low}-{high}")
    return number


def _bfd(value, kind):
    if not value:
        return {}
    if kind == "gobgp":
        raise _Refused("router gobgp: router_bfd: GoBGP has no BFD; leave router_bfd empty for gobgp, "
                       "or use router_kind frr or bird")
    if not isinstance(value, dict):
        raise _Refused(f"router {kind}: router_bfd: a mapping of {', '.join(BFD_KEYS)} is needed, not {value!r}")
    unknown = sorted(set(value) - set(BFD_KEYS))
    if unknown:
        raise _Refused(f"router {kind}: router_bfd: unknown field(s) {', '.join(map(str, unknown))} "
                       f"(known: {', '.join(BFD_KEYS)})")
    out = {}
    for key in BFD_KEYS:
        low, high = BFD_RANGES[key]
        out[key] = _int(value.get(key, BFD_DEFAULTS[key]), kind, f"router_bfd.{key}", low, high)
    return out


def _password(value, kind):
    text = "" if value is None else str(value)
    if not text:
        return ""
    if kind == "gobgp":
        raise _Refused("router gobgp: router_password: GoBGP sets TCP MD5 keys only for configured neighbours, "
                       "not for dynamic-neighbors ranges, so the nodes' sessions could never come up; "
                       "leave router_password empty for gobgp, or use router_kind frr or bird")
    # the nodes hold the same password in FRR: what FRR cannot take is refused for every router kind
    problem = password_problem(text)
    if problem:
        raise _Refused(f"router {kind}: router_password: {problem}")
    if kind == "bird" and '"' in text:
        raise _Refused('router bird: router_password: BIRD strings have no escapes, so a password with " '
                       "cannot be written in bird.conf")
    return text


def _listen_ranges(value, kind):
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise _Refused(f"router {kind}: router_listen_ranges: a list of CIDRs is needed, not {value!r}")
    out = []
    for entry in value:
        text = str(entry).strip()
        try:
            if "/" not in text or "-" in text:
                raise ValueError("not a CIDR")
            net = netaddr.IPNetwork(text).cidr
        except (netaddr.AddrFormatError, ValueError, TypeError) as exc:
            raise _Refused(f"router {kind}: router_listen_ranges: {text!r} is not a CIDR ({exc})") from exc
        out.append({"cidr": str(net), "version": net.version})
    return out


def _timers(value, kind):
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or len(value) != 2:
        raise _Refused(f"router {kind}: router_timers: [keepalive, hold] in seconds is needed, not {value!r}")
    keepalive = _int(value[0], kind, "router_timers[0] (keepalive)", 1, 65535)
    hold = _int(value[1], kind, "router_timers[1] (hold)", 3, 65535)
    if keepalive > hold:
        raise _Refused(f"router {kind}: router_timers: keepalive {keepalive} s is longer than hold {hold} s")
    return keepalive, hold


def router_config(variables):
    if netaddr is None:
        raise AnsibleFilterError("router_config needs the netaddr Python library on the controller")
    if not isinstance(variables, dict):
        raise AnsibleFilterError(f"router_config: a mapping of the router role's variables is needed, "
                                 f"not {variables!r}")
    kind = variables.get("router_kind", "frr")
    if kind not in KINDS:
        raise _Refused(f"router {kind}: router_kind: unknown router {kind!r}; choose one of {', '.join(KINDS)}")
    asn = _int(variables.get("router_asn", 64500), kind, "router_asn", 1, 4294967295)
    nodes_asn = _int(variables.get("router_nodes_asn", 64512), kind, "router_nodes_asn", 1, 4294967295)
    router_id = str(variables.get("router_id") or "").strip()
    if router_id:
        try:
            if netaddr.IPAddress(router_id, flags=netaddr.INET_PTON).version != 4:
                raise ValueError("IPv6")
        except (netaddr.AddrFormatError, ValueError) as exc:
            raise _Refused(f"router {kind}: router_id: {router_id!r} is not an IPv4 address ({exc})") from exc
    pools_in = variables.get("router_pools") or []
    if isinstance(pools_in, (str, bytes)):
        raise _Refused(f"router {kind}: router_pools: a list is needed, not {pools_in!r}")
    try:
        pools = router_cidrs(pools_in)
    except AnsibleFilterError as exc:
        raise _Refused(f"router {kind}: {exc.message}") from exc
    keepalive, hold = _timers(variables.get("router_timers", [3, 9]), kind)
    return {
        "kind": kind,
        "asn": asn,
        "nodes_asn": nodes_asn,
        "ebgp": asn != nodes_asn,
        "router_id": router_id,
        "listen_ranges": _listen_ranges(variables.get("router_listen_ranges") or [], kind),
        "pools": pools,
        "pools4": [p["cidr"] for p in pools if p["version"] == 4],
        "pools6": [p["cidr"] for p in pools if p["version"] == 6],
        "maximum_paths": _int(variables.get("router_maximum_paths", 8), kind, "router_maximum_paths", 1, 256),
        # the password itself stays out of the result (set_fact shows it; the templates read router_password)
        "password_set": bool(_password(variables.get("router_password"), kind)),
        "bfd": _bfd(variables.get("router_bfd"), kind),
        "keepalive": keepalive,
        "hold": hold,
    }


class FilterModule:
    def filters(self):
        return {"router_config": router_config}
