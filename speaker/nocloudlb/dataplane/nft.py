"""nftables text for the data plane's rules (``nocloudlb.core.backends.Rule``): pure, no I/O.

Two tables, both owned by the speaker (a netdev hook cannot live in an inet table)::

    table inet nocloudlb_dp             NAT and full-NAT, through conntrack
      map svc4/svc6  VIP . l4proto . port : goto s<id>
      chain pre      nat prerouting (dstnat): ip daddr . meta l4proto . th dport vmap @svc4
      chain s<id>    the scheduler: numgen inc | jhash ... mod N vmap { slots : goto b<id> }
                     (maglev: jhash ... mod N vmap @m<id>)
      map m<id>      maglev only: slot number : goto b<id>, one element per slot
      chain b<id>    counter name b<id>; [ct mark set FULLNAT]; dnat to SERVER:PORT
      chain post     nat postrouting (srcnat): ct mark FULLNAT masquerade | snat to snatAddress
    table netdev nocloudlb_dp_dr        DR, before conntrack, on every interface with an address
      chain in<ifindex>  ingress: ip daddr . meta l4proto . th dport vmap @dr4
      chain s<id>    jhash ... mod N vmap { slots : goto b<id> }   (maglev: vmap @m<id>)
      map m<id>      as in the inet table
      chain b<id>    counter name b<id>; fwd ip to SERVER device IFACE   (the neighbour's MAC)

NAT chains see only a flow's first packet: conntrack keeps every established flow on its
server whatever the backend set does afterwards. DR sees every packet, so it needs a per-flow
hash (sh, maglev) and the same table on every director: then a flow lands on the same server
from any director. Names of chains and counters are hashes of what they stand for, so a
counter keeps counting across updates and every director names things alike.

The first script (after ``base_script``) writes everything. Later ones touch only the rules that
changed: flush the chains whose rule changed, drop the backend chains and counters no longer
used, add the new ones, and the map element only when a rule appears or goes. nft applies a
script as one transaction, so a change is atomic; a health flip of one backend rewrites one
service's chains (rr, wrr, sh) or a few elements of its map (maglev).

A Maglev table lives in a named map per rule, keyed by the slot number (a plain hash map, one
element per slot), not in an interval vmap inside the rule: a Maglev table has a run of slots
per few entries, and nft turned its ~920 runs per service into intervals slowly (1,000 services
of 1021 slots: 6.5-7.7 s of nft's CPU and about 1 GB for the first write). A change of the
table is a delta of elements: a server going down deletes and re-adds the slots it held,
nothing else (its chain and counter stay). The map is declared with ``typeof numgen inc mod 2``
(a 32-bit integer like the jhash result): ``typeof jhash ...`` makes nft 1.0.6 crash when it
lists the map.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from nocloudlb.core.backends import HASH_SEED, Rule, slot_ranges

TABLE = "nocloudlb_dp"
DR_TABLE = "nocloudlb_dp_dr"
MARK_FULLNAT = 0x4E4C0001  # masquerade
MARK_SNAT_BASE = 0x4E4C0100  # + k: snat to the k-th snatAddress
MAP_LINE_ELEMENTS = 4096  # elements of a Maglev map per "add/delete element" line


def _id(*parts: object) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:12]


def rule_id(r: Rule) -> str:
    return "s" + _id(r.service, r.vip, r.protocol, r.port)


def target_id(r: Rule, ident: str) -> str:
    return "b" + _id(r.service, r.vip, r.protocol, r.port, ident, r.method)


@dataclass
class Unit:
    """One rule's share of the table: its chains, counters, rule lines and map element."""

    fam: str
    table: str
    sid: str
    chains: list[str]  # the backend chains (bids); sid is separate
    rules: list[str]  # "add rule" lines of the backend chains, then the scheduler chain
    element: str  # "MAP { key : goto sid }"
    map: str = ""  # maglev: the named map of its slots (else "": the slots are inline in the rule)
    entries: tuple[str, ...] = ()  # maglev: slot -> its backend chain


class Seen(NamedTuple):
    """A rule as it was last rendered: the object itself, its service chain, the content its unit was
    rendered from (compared when a new rule object comes) and the unit."""
    rule: Rule
    sid: str
    key: tuple
    unit: Unit | None
    mark: int | None  # its snatAddress's ct mark then (marks are renumbered when the set of addresses changes)


@dataclass
class Rendered:
    script: str
    units: dict[str, Unit] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)  # pre/post/ingress rules
    ingress: dict[str, str] = field(default_factory=dict)  # DR ingress chain -> its "add chain" line
    snat_marks: dict[str, int] = field(default_factory=dict)  # snatAddress -> its ct mark
    # a rule's service chain -> (its content, its unit or None)
    cache: dict[str, tuple[tuple, Unit | None]] = field(default_factory=dict)
    # id(rule) -> (the rule, its service chain, content and unit): the same Rule object again (a
    # ``PlanMemo`` hands them out) is found without comparing its content
    seen: dict[int, Seen] = field(default_factory=dict)
    # counter name -> (service, vip, protocol, port, backend ident)
    labels: dict[str, tuple[str, str, str, int, str]] = field(default_factory=dict)
    nets: list = field(default_factory=list)  # (interface, network) as DR rules were rendered with

    @property
    def counters(self) -> set[str]:
        return {b for u in self.units.values() for b in u.chains}


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


def _unit(r: Rule, nets: list, marks: dict[str, int], labels: dict) -> Unit | None:
    if not r.slots:
        return None  # no healthy server: not forwarded (the VIP on lo answers with a reset)
    v = r.family
    l3 = "ip" if v == 4 else "ip6"
    dr = r.method == "dr"
    fam, table = ("netdev", DR_TABLE) if dr else ("inet", TABLE)
    sid = rule_id(r)
    chains: list[str] = []
    rules: list[str] = []
    # maglev: a chain (and counter) for every server, healthy or not, so a health flip changes
    # map elements only; the others: for the servers in the table
    maglev = r.scheduler == "maglev"
    for i in range(len(r.targets)) if maglev else sorted(set(r.slots)):
        t = r.targets[i]
        bid = target_id(r, t.ident)
        if dr:
            ip = ipaddress.ip_address(t.address)
            dev = next((n for n, net in nets if ip in net), None)
            if dev is None:
                return None  # check_topology refused it already; never forward blind
            rules.append(f'add rule {fam} {table} {bid} counter name "{bid}" fwd {l3} to {t.address} device "{dev}"')
        else:
            mark = ""
            if r.method == "fullnat":
                m = MARK_FULLNAT
                if r.snat_address:
                    m = marks[r.snat_address]
                mark = f"ct mark set {m:#x} "
            to = f"[{t.address}]:{t.port}" if v == 6 else f"{t.address}:{t.port}"
            rules.append(f'add rule {fam} {table} {bid} counter name "{bid}" {mark}meta l4proto {r.protocol} '
                         f"dnat {l3} to {to}")
        chains.append(bid)
        labels[bid] = (r.service, r.vip, r.protocol, r.port, t.ident)
    mapname = ("dr" if dr else "svc") + str(v)
    element = f"{mapname} {{ {r.vip} . {r.protocol} . {r.port} : goto {sid} }}"
    if maglev:
        slots = "m" + sid[1:]
        rules.append(f"add rule {fam} {table} {sid} {_selector(r, l3, len(r.slots))} vmap @{slots}")
        return Unit(fam, table, sid, chains, rules, element, slots, tuple(chains[i] for i in r.slots))
    vmap = ", ".join(f"{a} : goto {target_id(r, r.targets[t].ident)}" if a == b else
                     f"{a}-{b} : goto {target_id(r, r.targets[t].ident)}" for a, b, t in slot_ranges(r.slots))
    rules.append(f"add rule {fam} {table} {sid} {_selector(r, l3, len(r.slots))} vmap {{ {vmap} }}")
    return Unit(fam, table, sid, chains, rules, element)


def _map_decl(u: Unit) -> str:
    return f"add map {u.fam} {u.table} {u.map} {{ typeof numgen inc mod 2 : verdict; }}"


def _map_lines(verb: str, u: Unit, items: Iterable[str]) -> list[str]:
    """``VERB element`` lines of ``u``'s map for these elements, at most ``MAP_LINE_ELEMENTS`` per line."""
    picked = list(items)
    return [f"{verb} element {u.fam} {u.table} {u.map} {{ {', '.join(picked[k:k + MAP_LINE_ELEMENTS])} }}"
            for k in range(0, len(picked), MAP_LINE_ELEMENTS)]


def _map_add(u: Unit, slots: Iterable[int]) -> list[str]:
    """``add element`` of these slots of ``u``'s map, each to its backend chain."""
    return _map_lines("add", u, (f"{s} : goto {u.entries[s]}" for s in slots))


def _map_delete(u: Unit, slots: Iterable[int]) -> list[str]:
    return _map_lines("delete", u, (str(s) for s in slots))


def _by_chain(u: Unit) -> dict[str, str]:
    """chain -> its one rule: the backend chains, then the service chain (whose rule is last)."""
    out = dict(zip(u.chains, u.rules[:-1], strict=True))
    out[u.sid] = u.rules[-1]
    return out


def _same(a: Unit, b: Unit) -> bool:
    return a.rules == b.rules and a.element == b.element and a.map == b.map and a.entries == b.entries


def render(rules: list[Rule], ifaces: dict[str, tuple[int, list[str]]], old: Rendered | None = None) -> Rendered:
    """The script that makes the tables hold ``rules``. ``ifaces``: name -> (ifindex, prefixes) of
    this node's interfaces with addresses (DR hooks each one and sends out of the one on the
    server's segment). ``old``: what the tables hold now (the previous result); then the script
    touches only what changed: a health flip of one backend rewrites that service's chains, not
    a thousand others. Without ``old`` it rewrites everything (after ``base_script``)."""
    # one mark per snatAddress, by sorted address: the same on every director for the same rules
    used_snat = sorted({r.snat_address for r in rules if r.method == "fullnat" and r.snat_address})
    out = Rendered("", snat_marks={a: MARK_SNAT_BASE + i for i, a in enumerate(used_snat)})
    nets = [(name, ipaddress.ip_interface(p).network) for name, (_idx, ps) in sorted(ifaces.items()) for p in ps]
    same_nets = old is not None and old.nets == nets
    out.nets = nets
    for r in rules:
        # a rule as it was last time renders as it did: reuse its unit (1000 Maglev services
        # would otherwise be re-rendered on every health flip of one backend)
        mark = out.snat_marks.get(r.snat_address or "")
        hit = old.seen.get(id(r)) if old is not None else None
        if hit is not None and hit.rule is r and hit.mark == mark and (same_nets or r.method != "dr"):
            sid, key, u = hit.sid, hit.key, hit.unit
            reused = True
        else:
            sid = rule_id(r)
            key = (r.service, r.vip, r.protocol, r.port, r.method, r.selector, tuple(r.slots), tuple(r.targets),
                   mark, tuple(nets) if r.method == "dr" else ())
            prev = old.cache.get(sid) if old is not None else None
            reused = prev is not None and prev[0] == key
            u = prev[1] if prev is not None and reused else _unit(r, nets, out.snat_marks, out.labels)
        if reused and u is not None and old is not None:
            out.labels.update({b: old.labels[b] for b in u.chains if b in old.labels})
        out.seen[id(r)] = Seen(r, sid, key, u, mark)
        out.cache[sid] = (key, u)
        if u is not None:
            out.units[u.sid] = u
    # fixed rules
    fixed = [f"add rule inet {TABLE} pre ip daddr . meta l4proto . th dport vmap @svc4",
             f"add rule inet {TABLE} pre ip6 daddr . meta l4proto . th dport vmap @svc6",
             f"add rule inet {TABLE} post ct mark {MARK_FULLNAT:#x} masquerade"]
    for addr, m in sorted(out.snat_marks.items()):
        l3 = "ip" if ipaddress.ip_address(addr).version == 4 else "ip6"
        fixed.append(f"add rule inet {TABLE} post meta nfproto ipv{4 if l3 == 'ip' else 6} ct mark {m:#x} "
                     f"snat {l3} to {addr}")
    if any(u.fam == "netdev" for u in out.units.values()):
        for name, (idx, _ps) in sorted(ifaces.items()):
            chain = f"in{idx}"
            out.ingress[chain] = (f'add chain netdev {DR_TABLE} {chain} {{ type filter hook ingress device "{name}" '
                                  "priority -400; policy accept; }")
            fixed.append(f"add rule netdev {DR_TABLE} {chain} ip daddr . meta l4proto . th dport vmap @dr4")
            fixed.append(f"add rule netdev {DR_TABLE} {chain} ip6 daddr . meta l4proto . th dport vmap @dr6")
    out.fixed = fixed
    lines: list[str] = []
    if old is None:
        lines += [f"flush table inet {TABLE}", f"flush table netdev {DR_TABLE}"]
        lines += [f"flush map inet {TABLE} {m}" for m in ("svc4", "svc6")]
        lines += [f"flush map netdev {DR_TABLE} {m}" for m in ("dr4", "dr6")]
        lines += list(out.ingress.values())
        for u in out.units.values():
            lines += [f"add chain {u.fam} {u.table} {c}" for c in [*u.chains, u.sid]]
            lines += [f"add counter {u.fam} {u.table} {c}" for c in u.chains]
            if u.map:
                lines.append(_map_decl(u))
        for u in out.units.values():
            if u.map:
                lines += _map_add(u, range(len(u.entries)))
            lines += u.rules
            lines.append(f"add element {u.fam} {u.table} {u.element}")
        lines += fixed
    else:
        if fixed != old.fixed or out.ingress != old.ingress:
            lines += [f"flush chain inet {TABLE} pre", f"flush chain inet {TABLE} post"]
            lines += [f"flush chain netdev {DR_TABLE} {c}" for c in old.ingress]
            lines += [f"delete chain netdev {DR_TABLE} {c}" for c in old.ingress if c not in out.ingress]
            lines += [line for c, line in out.ingress.items() if c not in old.ingress]
        adds: list[str] = []
        body: list[str] = []
        drops: list[str] = []
        unmap: list[str] = []
        for sid, ou in old.units.items():
            nu = out.units.get(sid)
            if nu is not None and (nu is ou or _same(nu, ou)):
                continue
            same_fam = nu is not None and nu.fam == ou.fam
            if nu is None or not same_fam or nu.rules != ou.rules:
                # only the chains whose rule changes, flushed before any chain is deleted (the
                # service chain's inline vmap references the backend chains)
                now = _by_chain(nu) if nu is not None and same_fam else {}
                for c, line in _by_chain(ou).items():
                    if now.get(c) != line:
                        lines.append(f"flush chain {ou.fam} {ou.table} {c}")
                    if c not in now and c != sid:
                        drops += [f"delete chain {ou.fam} {ou.table} {c}",
                                  f"delete counter {ou.fam} {ou.table} {c}"]
            if ou.map:
                if nu is not None and same_fam and nu.map == ou.map:
                    # the slots that change hands (or go: a smaller table) leave before any chain does
                    n = len(nu.entries)
                    lines += _map_delete(ou, (s for s, c in enumerate(ou.entries)
                                              if s >= n or nu.entries[s] != c))
                else:
                    unmap.append(f"delete map {ou.fam} {ou.table} {ou.map}")
            if nu is None or nu.element != ou.element or not same_fam:
                lines.append(f"delete element {ou.fam} {ou.table} {ou.element.split(' : ')[0]} }}")
            if nu is None or not same_fam:
                drops.append(f"delete chain {ou.fam} {ou.table} {sid}")
        slots: list[str] = []
        for sid, nu in out.units.items():
            pu = old.units.get(sid)
            if pu is not None and (nu is pu or _same(nu, pu)):
                continue
            same_fam = pu is not None and pu.fam == nu.fam
            if pu is None or not same_fam or nu.rules != pu.rules:
                was = _by_chain(pu) if pu is not None and same_fam else {}
                adds += [f"add chain {nu.fam} {nu.table} {c}" for c in nu.chains if c not in was]
                adds += [f"add counter {nu.fam} {nu.table} {c}" for c in nu.chains if c not in was]
                if not same_fam:
                    adds.append(f"add chain {nu.fam} {nu.table} {sid}")
                body += [line for c, line in _by_chain(nu).items() if was.get(c) != line]
            if nu.map:
                if pu is not None and same_fam and pu.map == nu.map:
                    n = len(pu.entries)
                    slots += _map_add(nu, (s for s, c in enumerate(nu.entries) if s >= n or pu.entries[s] != c))
                else:
                    adds.append(_map_decl(nu))
                    slots += _map_add(nu, range(len(nu.entries)))
            if pu is None or not same_fam or nu.element != pu.element:
                body.append(f"add element {nu.fam} {nu.table} {nu.element}")
        lines += unmap + drops + adds + slots + body
        if fixed != old.fixed or out.ingress != old.ingress:
            lines += fixed
    out.script = "\n".join(lines) + "\n" if lines else ""
    return out
