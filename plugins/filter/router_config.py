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
    quote, a listen range that is not a CIDR or a pool that is not an address range, static BFD peers
    without BFD, outside the listen ranges or on none of the router's networks.
  - C(router_bfd_peers) lists nodes the router holds a BFD session with before their BGP session is up
    (FRR 10.2 and 10.3 on a node start BGP only once BFD is up, while a passive router with dynamic
    neighbours starts BFD only once BGP is up); C(router_addresses) are the router's own addresses
    (C(198.51.100.1/24) strings or Ansible's interface facts), from which each session's local
    address is taken.
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
    C(bfd) (empty or C(receive_interval), C(transmit_interval), C(detect_multiplier)),
    C(bfd_peers) (C(peer), C(local), C(interface), C(version): static single-hop BFD sessions towards
    the nodes),
    C(keepalive), C(hold).
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


def _addresses(value):
    """The router's own addresses as (netaddr IPNetwork, interface name or ""): strings like
    198.51.100.1/24, or Ansible's interface facts (device, ipv4, ipv4_secondaries, ipv6)."""
    out = []
    for entry in value or []:
        items, device = [entry], ""
        if isinstance(entry, dict):
            items = [entry.get("ipv4")] + list(entry.get("ipv4_secondaries") or []) + list(entry.get("ipv6") or [])
            device = str(entry.get("device") or "")
        for item in items:
            if isinstance(item, dict) and item.get("address"):
                item = f"{item['address']}/{item.get('netmask') or item.get('prefix') or ''}".rstrip("/")
            if not item or isinstance(item, dict):
                continue
            try:
                out.append((netaddr.IPNetwork(str(item).split("%", maxsplit=1)[0]), device))
            except (netaddr.AddrFormatError, ValueError, TypeError):
                continue
    return out


def _bfd_peers(value, kind, bfd, ranges, addresses):
    """Static BFD sessions towards the nodes, each with the router's address on the node's network.

    A passive router with dynamic neighbours starts BFD only once a node's BGP session is up, and FRR
    10.2-10.3 on a node starts BGP only once BFD is up: these sessions break that wait."""
    if not value:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise _Refused(f"router {kind}: router_bfd_peers: a list of the nodes' addresses is needed, not {value!r}")
    if kind == "gobgp":
        raise _Refused("router gobgp: router_bfd_peers: GoBGP has no BFD; leave router_bfd_peers empty for gobgp, "
                       "or use router_kind frr or bird")
    if not bfd:
        raise _Refused(f"router {kind}: router_bfd_peers: BFD sessions need router_bfd (their timers), which is "
                       "empty; set router_bfd or leave router_bfd_peers empty")
    own = _addresses(addresses)
    out = {}
    for entry in value:
        text = str(entry).strip()
        try:
            peer = netaddr.IPAddress(text, flags=netaddr.INET_PTON)
        except (netaddr.AddrFormatError, ValueError, TypeError) as exc:
            raise _Refused(f"router {kind}: router_bfd_peers: {text!r} is not an IP address ({exc})") from exc
        if not any(peer in netaddr.IPNetwork(r["cidr"]) for r in ranges):
            raise _Refused(f"router {kind}: router_bfd_peers: {peer} is in none of router_listen_ranges "
                           f"({', '.join(r['cidr'] for r in ranges) or 'none'}), so it never peers with this router")
        local = next(((a, dev) for a, dev in own if a.version == peer.version and peer in a.cidr and a.ip != peer),
                     None)
        if local is None:
            raise _Refused(f"router {kind}: router_bfd_peers: {peer} is on none of this router's networks "
                           f"({', '.join(str(a) for a, _dev in own) or 'no addresses known: gather facts'}); "
                           "these BFD sessions are single-hop")
        # with the interface, FRR's bfdd keys the session as bgpd later registers it: one session, not two
        out[str(peer)] = {"peer": str(peer), "local": str(local[0].ip), "interface": local[1], "version": peer.version}
    return sorted(out.values(), key=lambda p: (p["version"], netaddr.IPAddress(p["peer"])))


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
    bfd = _bfd(variables.get("router_bfd"), kind)
    ranges = _listen_ranges(variables.get("router_listen_ranges") or [], kind)
    return {
        "kind": kind,
        "asn": asn,
        "nodes_asn": nodes_asn,
        "ebgp": asn != nodes_asn,
        "router_id": router_id,
        "listen_ranges": ranges,
        "pools": pools,
        "pools4": [p["cidr"] for p in pools if p["version"] == 4],
        "pools6": [p["cidr"] for p in pools if p["version"] == 6],
        "maximum_paths": _int(variables.get("router_maximum_paths", 8), kind, "router_maximum_paths", 1, 256),
        # the password itself stays out of the result (set_fact shows it; the templates read router_password)
        "password_set": bool(_password(variables.get("router_password"), kind)),
        "bfd": bfd,
        "bfd_peers": _bfd_peers(variables.get("router_bfd_peers"), kind, bfd, ranges,
                                variables.get("router_addresses")),
        "keepalive": keepalive,
        "hold": hold,
    }


class FilterModule:
    def filters(self):
        return {"router_config": router_config}
