"""nftables text for the data plane's rules (``nocloudlb.core.backends.Rule``): pure, no I/O.

Two tables, both owned by the speaker (a netdev hook cannot live in an inet table)::

    table inet nocloudlb_dp             NAT and full-NAT, through conntrack
      map svc4/svc6  VIP . l4proto . port : goto s<id>
      chain pre      nat prerouting (dstnat): ip daddr . meta l4proto . th dport vmap @svc4
      chain s<id>    the scheduler: numgen inc | jhash ... mod N vmap { slots : goto b<id> }
      chain b<id>    counter name b<id>; [ct mark set FULLNAT]; dnat to SERVER:PORT
      chain post     nat postrouting (srcnat): ct mark FULLNAT masquerade | snat to snatAddress
    table netdev nocloudlb_dp_dr        DR, before conntrack, on every interface with an address
      chain in<ifindex>  ingress: ip daddr . meta l4proto . th dport vmap @dr4
      chain s<id>    jhash ... mod N vmap { slots : goto b<id> }
      chain b<id>    counter name b<id>; fwd ip to SERVER device IFACE   (the neighbour's MAC)

NAT chains see only a flow's first packet: conntrack keeps every established flow on its
server whatever the backend set does afterwards. DR sees every packet, so it needs a per-flow
hash (sh, maglev) and the same table on every director: then a flow lands on the same server
from any director. Names of chains and counters are hashes of what they stand for, so a
counter keeps counting across updates and every director names things alike.

An update is one script: flush the tables' rules and maps, drop the chains and counters no
longer used, add what is new (``add`` of an existing chain or counter is a no-op), add every
rule and element. nft applies a script as one transaction.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass, field

from nocloudlb.core.backends import HASH_SEED, Rule, slot_ranges

TABLE = "nocloudlb_dp"
DR_TABLE = "nocloudlb_dp_dr"
MARK_FULLNAT = 0x4E4C0001  # masquerade
MARK_SNAT_BASE = 0x4E4C0100  # + k: snat to the k-th snatAddress


def _id(*parts: object) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:12]


def rule_id(r: Rule) -> str:
    return "s" + _id(r.service, r.vip, r.protocol, r.port)


def target_id(r: Rule, ident: str) -> str:
    return "b" + _id(r.service, r.vip, r.protocol, r.port, ident, r.method)


@dataclass
class Rendered:
    script: str
    chains: set[tuple[str, str]] = field(default_factory=set)  # (table, chain) of service/backend chains
    counters: set[tuple[str, str]] = field(default_factory=set)
    # counter name -> (service, vip, protocol, port, backend ident)
    labels: dict[str, tuple[str, str, str, int, str]] = field(default_factory=dict)


def base_script() -> str:
    """The tables with their fixed parts, replacing whatever a crashed run left."""
    return (
        f"add table inet {TABLE}\ndelete table inet {TABLE}\n"
        f"add table netdev {DR_TABLE}\ndelete table netdev {DR_TABLE}\n"
        f"add table inet {TABLE}\n"
        f"add map inet {TABLE} svc4 {{ type ipv4_addr . inet_proto . inet_service : verdict; }}\n"
        f"add map inet {TABLE} svc6 {{ type ipv6_addr . inet_proto . inet_service : verdict; }}\n"
        f"add chain inet {TABLE} pre {{ type nat hook prerouting priority dstnat; policy accept; }}\n"
        f"add chain inet {TABLE} post {{ type nat hook postrouting priority srcnat; policy accept; }}\n"
        f"add table netdev {DR_TABLE}\n"
        f"add map netdev {DR_TABLE} dr4 {{ type ipv4_addr . inet_proto . inet_service : verdict; }}\n"
        f"add map netdev {DR_TABLE} dr6 {{ type ipv6_addr . inet_proto . inet_service : verdict; }}\n"
    )


def _selector(r: Rule, l3: str, modulus: int) -> str:
    if r.selector == "numgen":
        return f"numgen inc mod {modulus}"
    key = f"{l3} saddr" if r.selector == "jhash-src" else f"{l3} saddr . th sport"
    return f"jhash {key} mod {modulus} seed {HASH_SEED:#x}"


def render(rules: list[Rule], ifaces: dict[str, tuple[int, list[str]]], old: Rendered | None = None) -> Rendered:
    """The update script for ``rules``. ``ifaces``: name -> (ifindex, prefixes) of this node's
    interfaces with addresses (DR hooks each one and sends out of the one on the server's
    segment). ``old``: the previous result, whose unused chains and counters are deleted."""
    out = Rendered("")
    lines: list[str] = [f"flush table inet {TABLE}", f"flush table netdev {DR_TABLE}",
                        f"flush map inet {TABLE} svc4", f"flush map inet {TABLE} svc6",
                        f"flush map netdev {DR_TABLE} dr4", f"flush map netdev {DR_TABLE} dr6"]
    adds: list[str] = []
    body: list[str] = []
    snat: dict[str, int] = {}
    dr_used = False
    nets = [(name, ipaddress.ip_interface(p).network) for name, (_idx, ps) in sorted(ifaces.items()) for p in ps]
    for r in rules:
        if not r.slots:
            continue  # no healthy server: not forwarded (the VIP on lo answers with a reset)
        v = r.family
        l3 = "ip" if v == 4 else "ip6"
        dr = r.method == "dr"
        fam, table = ("netdev", DR_TABLE) if dr else ("inet", TABLE)
        sid = rule_id(r)
        used = sorted(set(r.slots))
        if dr:
            dr_used = True
        targets = []
        for i in used:
            t = r.targets[i]
            bid = target_id(r, t.ident)
            out.chains.add((table, bid))
            out.counters.add((table, bid))
            out.labels[bid] = (r.service, r.vip, r.protocol, r.port, t.ident)
            adds.append(f"add chain {fam} {table} {bid}")
            adds.append(f"add counter {fam} {table} {bid}")
            if dr:
                ip = ipaddress.ip_address(t.address)
                dev = next((n for n, net in nets if ip in net), None)
                if dev is None:
                    continue  # check_topology refused it already; never forward blind
                body.append(f'add rule {fam} {table} {bid} counter name "{bid}" fwd {l3} to {t.address} '
                            f'device "{dev}"')
            else:
                mark = ""
                if r.method == "fullnat":
                    m = MARK_FULLNAT
                    if r.snat_address:
                        m = MARK_SNAT_BASE + snat.setdefault(r.snat_address, len(snat))
                    mark = f"ct mark set {m:#x} "
                to = f"[{t.address}]:{t.port}" if v == 6 else f"{t.address}:{t.port}"
                body.append(f'add rule {fam} {table} {bid} counter name "{bid}" {mark}meta l4proto {r.protocol} '
                            f"dnat {l3} to {to}")
            targets.append(i)
        if not targets:
            continue
        out.chains.add((table, sid))
        adds.append(f"add chain {fam} {table} {sid}")
        modulus = len(r.slots)
        vmap = ", ".join(f"{a} : goto {target_id(r, r.targets[t].ident)}" if a == b else
                         f"{a}-{b} : goto {target_id(r, r.targets[t].ident)}"
                         for a, b, t in slot_ranges(r.slots))
        body.append(f"add rule {fam} {table} {sid} {_selector(r, l3, modulus)} vmap {{ {vmap} }}")
        vip = f"{r.vip}"
        mapname = ("dr" if dr else "svc") + str(v)
        body.append(f"add element {fam} {table} {mapname} {{ {vip} . {r.protocol} . {r.port} : goto {sid} }}")
    # fixed rules
    body.append(f"add rule inet {TABLE} pre ip daddr . meta l4proto . th dport vmap @svc4")
    body.append(f"add rule inet {TABLE} pre ip6 daddr . meta l4proto . th dport vmap @svc6")
    body.append(f"add rule inet {TABLE} post ct mark {MARK_FULLNAT:#x} masquerade")
    for addr, k in snat.items():
        l3 = "ip" if ipaddress.ip_address(addr).version == 4 else "ip6"
        body.append(f"add rule inet {TABLE} post meta nfproto ipv{4 if l3 == 'ip' else 6} "
                    f"ct mark {MARK_SNAT_BASE + k:#x} snat {l3} to {addr}")
    if dr_used:
        for name, (idx, _ps) in sorted(ifaces.items()):
            chain = f"in{idx}"
            out.chains.add((DR_TABLE, chain))
            adds.append(f'add chain netdev {DR_TABLE} {chain} {{ type filter hook ingress device "{name}" '
                        "priority -400; policy accept; }")
            body.append(f"add rule netdev {DR_TABLE} {chain} ip daddr . meta l4proto . th dport vmap @dr4")
            body.append(f"add rule netdev {DR_TABLE} {chain} ip6 daddr . meta l4proto . th dport vmap @dr6")
    deletes: list[str] = []
    if old is not None:
        for table, chain in sorted(old.chains - out.chains):
            fam = "netdev" if table == DR_TABLE else "inet"
            deletes.append(f"delete chain {fam} {table} {chain}")
        for table, name in sorted(old.counters - out.counters):
            fam = "netdev" if table == DR_TABLE else "inet"
            deletes.append(f"delete counter {fam} {table} {name}")
    out.script = "\n".join(lines + deletes + adds + body) + "\n"
    return out
