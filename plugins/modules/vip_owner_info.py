#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ask the wire who owns an address: every MAC that answers ARP (IPv4) or NDP (IPv6)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vip_owner_info
short_description: Find which MACs (and nodes) answer ARP or NDP for VIPs
version_added: "0.1.0"
description:
  - From a host on the same layer-2 segment, sends an ARP request (IPv4) or a neighbour
    solicitation to the solicited-node multicast group (IPv6) for each address and collects
    B(every) answer during O(timeout), like C(arping), with the latency of each.
  - Maps each answering MAC to a node name through O(nodes), so a play can assert that a VIP
    is answered by exactly one MAC, the one of the node the election names.
  - Also proves that addresses are free before a pool uses them (O(fail_on_answer)).
  - This is the wire's word, independent of what the speakers report
    (M(nocloud.loadbalancer.speaker_info)).
options:
  address:
    description: The addresses to probe (IPv4 and IPv6 may be mixed).
    type: list
    elements: str
    required: true
    aliases: [addresses, ip]
  interface:
    description:
      - Interface to probe on. By default the one the host's routing table uses for each address.
    type: str
  timeout:
    description: Seconds to collect answers after each probe is sent.
    type: float
    default: 1.0
  count:
    description: Probes sent per address (answers are merged by MAC, keeping the fastest).
    type: int
    default: 1
  nodes:
    description:
      - Node name -> MAC address (or list of MACs) of its interfaces on the segment, used to
        name the node behind each answer.
    type: dict
    default: {}
  expected_node:
    description:
      - Fail unless every address is answered by exactly one MAC and it belongs to this node.
    type: str
  fail_on_none:
    description: Fail when an address gets no answer at all.
    type: bool
    default: false
  fail_on_multiple:
    description: Fail when more than one MAC answers for an address (two owners, the split-brain symptom).
    type: bool
    default: false
  fail_on_answer:
    description: Fail when any MAC answers - proves the addresses are free (for example before adding a pool).
    type: bool
    default: false
extends_documentation_fragment:
  - nocloud.loadbalancer.attributes
  - nocloud.loadbalancer.attributes.READ_ONLY
requirements:
  - scapy >= 2.5 on the host running the module (Debian package C(python3-scapy), or the
    C(/opt/nocloudlb/venv) the C(speaker) role installs, as interpreter).
notes:
  - Needs root (raw packet sockets, CAP_NET_RAW).
  - Run it from a host on the segment that does not hold the VIP itself (a client, a router,
    another node); the kernel never sends probes for its own addresses onto the wire.
  - A probe is a normal request with the interface's address as sender; an IPv4 interface
    without an address sends an RFC 5227 probe (sender 0.0.0.0).
seealso:
  - module: nocloud.loadbalancer.speaker_info
  - module: nocloud.loadbalancer.node_drain
author:
  - nocloud.loadbalancer developers (@nocloud)
"""

EXAMPLES = r"""
- name: Every VIP is answered by exactly one MAC, the elected node's
  nocloud.loadbalancer.vip_owner_info:
    address: [198.51.100.200, "2001:db8:1::200"]
    nodes: {n1: "02:00:00:00:00:11", n2: "02:00:00:00:00:12", n3: "02:00:00:00:00:13"}
    fail_on_none: true
    fail_on_multiple: true
  register: owners

- name: Show the owner of each VIP
  ansible.builtin.debug:
    msg: "{{ owners.results | items2dict(key_name='address', value_name='owner_node') }}"

- name: Prove a new pool's addresses are free before using them
  nocloud.loadbalancer.vip_owner_info:
    address: "{{ range(210, 221) | map('regex_replace', '^', '198.51.100.') | list }}"
    timeout: 0.5
    fail_on_answer: true

- name: The VIP must be served by n2 now
  nocloud.loadbalancer.vip_owner_info:
    address: 198.51.100.200
    nodes: "{{ node_macs }}"
    expected_node: n2
"""

RETURN = r"""
results:
  description: One entry per address, in the order given.
  returned: success and failure
  type: list
  elements: dict
  contains:
    address:
      description: The probed address.
      type: str
    family:
      description: 4 (ARP) or 6 (NDP).
      type: int
    interface:
      description: The interface the probe went out on.
      type: str
    answers:
      description: Every distinct MAC that answered, fastest first.
      type: list
      elements: dict
      contains:
        mac:
          description: The answering MAC (from the ARP sender / NA target link-layer address).
          type: str
        node:
          description: The node owning that MAC per O(nodes), or null.
          type: str
        latency_ms:
          description: Milliseconds from sending the probe to receiving this answer.
          type: float
    owner_mac:
      description: The MAC when exactly one answered, else null.
      type: str
    owner_node:
      description: The node when exactly one MAC answered and O(nodes) knows it, else null.
      type: str
    free:
      description: True when nothing answered.
      type: bool
owners:
  description: Address -> owner node (or owner MAC when unknown to O(nodes); null when none or several answered).
  returned: success
  type: dict
  sample: {"198.51.100.200": "n2"}
answers:
  description: The answers for the first address (convenience for a single probe).
  returned: success
  type: list
  elements: dict
"""

import ipaddress  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402

SCAPY_IMPORT_ERROR = None
try:  # imported lazily in spirit: only this module needs it, and it fails cleanly without it
    import logging

    logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
    from scapy.config import conf
    from scapy.layers.inet6 import (
        ICMPv6ND_NA,
        ICMPv6ND_NS,
        ICMPv6NDOptDstLLAddr,
        ICMPv6NDOptSrcLLAddr,
        IPv6,
        in6_getnsma,
        in6_getnsmac,
    )
    from scapy.layers.l2 import ARP, Ether
    from scapy.sendrecv import sendp, sniff

    conf.verb = 0
except ImportError:
    SCAPY_IMPORT_ERROR = traceback.format_exc()

MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def iface_mac(iface: str) -> str:
    with open(f"/sys/class/net/{iface}/address") as fh:
        return fh.read().strip().lower()


def route_iface(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[str, str]:
    """(interface, source address) the routing table uses for ip."""
    if ip.version == 4:
        conf.route.resync()
        iface, src, _gw = conf.route.route(str(ip))
    else:
        conf.route6.resync()
        iface, src, _gw = conf.route6.route(str(ip))
    return str(iface), str(src)


def is_local(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ip is one of this host's addresses (binding to it succeeds only then)."""
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((str(ip), 0))
        except OSError:
            return False
    return True


def source_for(iface: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """The interface's own address to send from (an unspecified one when it has none)."""
    if ip.version == 4:
        from scapy.arch import get_if_addr

        addr = get_if_addr(iface)
        return addr if addr and addr != "0.0.0.0" else "0.0.0.0"
    from scapy.arch import get_if_addr6

    return get_if_addr6(iface) or "::"


def probe_once(ip, iface: str, timeout: float) -> list[tuple[str, float]]:
    """Send one ARP request / NS for ip on iface; return (mac, latency_ms) of every answer."""
    mine = iface_mac(iface)
    text = str(ip)
    if ip.version == 4:
        frame = Ether(src=mine, dst="ff:ff:ff:ff:ff:ff") / ARP(
            op=1, hwsrc=mine, psrc=source_for(iface, ip), hwdst="00:00:00:00:00:00", pdst=text)

        def answer(pkt):
            if ARP in pkt and pkt[ARP].op == 2 and pkt[ARP].psrc == text:
                return str(pkt[ARP].hwsrc).lower()
            return None
    else:
        nsma = socket.inet_ntop(socket.AF_INET6, in6_getnsma(socket.inet_pton(socket.AF_INET6, text)))
        frame = (Ether(src=mine, dst=in6_getnsmac(socket.inet_pton(socket.AF_INET6, nsma)))
                 / IPv6(src=source_for(iface, ip), dst=nsma, hlim=255)
                 / ICMPv6ND_NS(tgt=text) / ICMPv6NDOptSrcLLAddr(lladdr=mine))

        def answer(pkt):
            if ICMPv6ND_NA in pkt and ipaddress.ip_address(pkt[ICMPv6ND_NA].tgt) == ip:
                if ICMPv6NDOptDstLLAddr in pkt:
                    return str(pkt[ICMPv6NDOptDstLLAddr].lladdr).lower()
                return str(pkt[Ether].src).lower()
            return None

    sent: list[float] = []

    def send() -> None:
        sent.append(time.time())
        sendp(frame, iface=iface, verbose=0)

    found: list[tuple[str, float]] = []

    def keep(pkt) -> bool:
        mac = answer(pkt)
        if mac and sent and str(pkt[Ether].src).lower() != mine:
            found.append((mac, round((float(pkt.time) - sent[0]) * 1000.0, 3)))
        return False

    sniff(iface=iface, timeout=timeout, store=False, prn=None, lfilter=keep, started_callback=send)
    return found


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "address": {"type": "list", "elements": "str", "required": True, "aliases": ["addresses", "ip"]},
            "interface": {"type": "str"},
            "timeout": {"type": "float", "default": 1.0},
            "count": {"type": "int", "default": 1},
            "nodes": {"type": "dict", "default": {}},
            "expected_node": {"type": "str"},
            "fail_on_none": {"type": "bool", "default": False},
            "fail_on_multiple": {"type": "bool", "default": False},
            "fail_on_answer": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    if SCAPY_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("scapy"), exception=SCAPY_IMPORT_ERROR)
    if p["timeout"] <= 0:
        module.fail_json(msg=f"timeout: must be > 0, got {p['timeout']}")
    if p["count"] < 1:
        module.fail_json(msg=f"count: must be >= 1, got {p['count']}")

    owner_of: dict[str, str] = {}
    for node, macs in (p["nodes"] or {}).items():
        for mac in [macs] if isinstance(macs, str) else list(macs or []):
            norm = str(mac).strip().lower().replace("-", ":")
            if not MAC_RE.match(norm):
                module.fail_json(msg=f"nodes[{node!r}]: {mac!r} is not a MAC address (like 02:00:00:00:00:11)")
            owner_of[norm] = str(node)

    addresses = []
    for text in p["address"]:
        try:
            addresses.append(ipaddress.ip_address(str(text).strip()))
        except ValueError:
            module.fail_json(msg=f"address: {text!r} is not an IPv4 or IPv6 address")

    results = []
    for ip in addresses:
        if ip.is_loopback or is_local(ip):
            module.fail_json(msg=f"address: {ip} is local to this host; probe it from another host on the segment")
        iface = p["interface"] or route_iface(ip)[0]
        if iface in ("lo", ""):
            module.fail_json(msg=f"address: no route to {ip} on this host's interfaces; set interface")
        try:
            best: dict[str, float] = {}
            for _round in range(p["count"]):
                for mac, latency in probe_once(ip, iface, p["timeout"]):
                    best[mac] = min(latency, best.get(mac, latency))
        except OSError as exc:
            module.fail_json(msg=f"cannot probe {ip} on interface {iface!r}: {exc} (the module needs root)")
        answers = [{"mac": mac, "node": owner_of.get(mac), "latency_ms": lat}
                   for mac, lat in sorted(best.items(), key=lambda kv: kv[1])]
        single = answers[0] if len(answers) == 1 else None
        results.append({
            "address": str(ip), "family": ip.version, "interface": iface, "answers": answers,
            "owner_mac": single["mac"] if single else None,
            "owner_node": single["node"] if single else None,
            "free": not answers,
        })

    problems = []
    for r in results:
        macs = [a["mac"] + (f" ({a['node']})" if a["node"] else "") for a in r["answers"]]
        if p["fail_on_none"] and r["free"]:
            problems.append(f"{r['address']}: no answer on {r['interface']} within {p['timeout']:g}s")
        if p["fail_on_multiple"] and len(r["answers"]) > 1:
            problems.append(f"{r['address']}: {len(macs)} MACs answer: {', '.join(macs)}")
        if p["fail_on_answer"] and r["answers"]:
            problems.append(f"{r['address']}: not free, answered by {', '.join(macs)}")
        if p["expected_node"] is not None and r["owner_node"] != p["expected_node"]:
            got = ", ".join(macs) if macs else "nobody"
            problems.append(f"{r['address']}: expected {p['expected_node']} as the only owner, answered by {got}")

    owners = {r["address"]: r["owner_node"] or r["owner_mac"] for r in results}
    out = {"changed": False, "results": results, "owners": owners,
           "answers": results[0]["answers"] if results else []}
    if problems:
        module.fail_json(msg="; ".join(problems), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
