# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Address pools: ranges, families, sizes, overlap detection, label selectors.

Pure standard library. The wording of the errors follows MetalLB's
``internal/config`` package, so that an operator who knows MetalLB recognises
them; every message names the bad value.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Union

# Union (not X | Y) keeps these module_utils importable by older target Pythons.
IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]  # noqa: UP007
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]  # noqa: UP007

SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def parse_ip(text: str) -> IPAddress:
    """Parse one IP address the way Go's ``net.ParseIP`` accepts it.

    Raises ValueError for anything else (including IPv6 zone indexes, which
    Go refuses and Python would accept).
    """
    if not isinstance(text, str) or "%" in text or text != text.strip() or not text:
        raise ValueError(f"invalid IP address {text!r}")
    return ipaddress.ip_address(text)


def _as_ip(ip: object) -> IPAddress | None:
    """``ip`` as an address object (parsed from text as parse_ip does), or None if it is not one."""
    if isinstance(ip, str):
        try:
            return parse_ip(ip)
        except ValueError:
            return None
    return ip if isinstance(ip, (ipaddress.IPv4Address, ipaddress.IPv6Address)) else None


def ip_is_buggy(ip: IPAddress) -> bool:
    """True for IPv4 addresses ending in .0 or .255 (MetalLB's avoidBuggyIPs)."""
    return ip.version == 4 and int(ip) % 256 in (0, 255)


def _buggy_count(start: int, end: int) -> int:
    """How many integers in [start, end] are congruent to 0 or 255 modulo 256."""

    def upto(n: int, residue: int) -> int:  # count of x in [0, n] with x % 256 == residue
        if n < residue:
            return 0
        return (n - residue) // 256 + 1

    total = 0
    for residue in (0, 255):
        total += upto(end, residue) - (upto(start - 1, residue) if start > 0 else 0)
    return total


@dataclass(frozen=True)
class AddressRange:
    """One entry of an IPAddressPool's ``addresses``: a CIDR or an ``a-b`` range.

    ``text`` keeps the operator's spelling; ``start`` and ``end`` are inclusive.
    """

    start: IPAddress
    end: IPAddress
    text: str

    @property
    def version(self) -> int:
        return self.start.version

    @property
    def size(self) -> int:
        """Number of addresses in the range, both ends included."""
        return int(self.end) - int(self.start) + 1

    def __contains__(self, ip: object) -> bool:
        ip = _as_ip(ip)
        if ip is None:
            return False
        return ip.version == self.version and int(self.start) <= int(ip) <= int(self.end)

    def networks(self) -> list[IPNetwork]:
        """The fewest CIDRs covering exactly this range (what MetalLB stores)."""
        return list(ipaddress.summarize_address_range(self.start, self.end))

    def overlaps(self, other: AddressRange) -> bool:
        return (
            self.version == other.version
            and int(self.start) <= int(other.end)
            and int(other.start) <= int(self.end)
        )

    def buggy_count(self) -> int:
        """How many addresses of the range avoidBuggyIPs skips (.0 and .255, IPv4 only)."""
        if self.version != 4:
            return 0
        return _buggy_count(int(self.start), int(self.end))

    @classmethod
    def parse(cls, text: str) -> AddressRange:
        """Parse ``10.0.0.0/24`` or ``10.0.0.10-10.0.0.20`` (MetalLB's ParseCIDR).

        Raises ValueError with MetalLB's message.
        """
        if not isinstance(text, str):
            raise ValueError(f"invalid CIDR {text!r}")
        if "-" not in text:
            if "/" not in text or "%" in text or text != text.strip():
                raise ValueError(f"invalid CIDR {_q(text)}")
            try:
                net = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ValueError(f"invalid CIDR {_q(text)}") from None
            return cls(net.network_address, net.broadcast_address, text)
        first, last = text.split("-", 1)
        try:
            start = parse_ip(first.strip())
        except ValueError:
            raise ValueError(f"invalid IP range {_q(text)}: invalid start IP {_q(first)}") from None
        try:
            end = parse_ip(last.strip())
        except ValueError:
            raise ValueError(f"invalid IP range {_q(text)}: invalid end IP {_q(last)}") from None
        if start.version != end.version:
            raise ValueError(
                f"invalid IP range {_q(text)}: start IP {_q(str(start))} and end IP {_q(str(end))} "
                "are not of the same IP family"
            )
        if int(start) > int(end):
            raise ValueError(
                f"invalid IP range {_q(text)}: start IP {_q(str(start))} is after the end IP {_q(str(end))}"
            )
        return cls(start, end, text)


def _q(text: object) -> str:
    """Go's %q for plain strings: double quotes, backslash escapes."""
    s = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


def selector_matches(selector: dict | None, labels: dict | None) -> bool:
    """Kubernetes LabelSelector semantics.

    ``matchLabels`` must all be present with equal values; ``matchExpressions``
    support In, NotIn, Exists and DoesNotExist (NotIn matches when the key is
    absent, as in Kubernetes). None or {} matches everything.
    """
    if not selector:
        return True
    labels = labels or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if key not in labels or str(labels[key]) != str(value):
            return False
    for expr in selector.get("matchExpressions") or []:
        key = expr.get("key")
        op = expr.get("operator")
        values = [str(v) for v in (expr.get("values") or [])]
        present = key in labels
        if op == "In":
            if not present or str(labels[key]) not in values:
                return False
        elif op == "NotIn":
            if present and str(labels[key]) in values:
                return False
        elif op == "Exists":
            if not present:
                return False
        elif op == "DoesNotExist":
            if present:
                return False
        else:
            return False
    return True


def selector_problems(selector: Any) -> list[str]:
    """What is wrong with a LabelSelector (empty list when it is valid).

    Messages follow Kubernetes' LabelSelectorAsSelector wording.
    """
    if selector is None:
        return []
    if not isinstance(selector, dict):
        return [f"must be a label selector (matchLabels/matchExpressions), got {selector!r}"]
    problems = []
    for key in selector:
        if key not in ("matchLabels", "matchExpressions"):
            problems.append(f'unknown field "{key}"')
    match_labels = selector.get("matchLabels")
    if match_labels is not None:
        if not isinstance(match_labels, dict):
            problems.append(f"matchLabels: must be a mapping of strings, got {match_labels!r}")
        else:
            for key, value in match_labels.items():
                if not isinstance(key, str) or not key:
                    problems.append(f"matchLabels: invalid label key {key!r}")
                if not isinstance(value, (str, int, float, bool)) or isinstance(value, bool):
                    problems.append(f"matchLabels[{key}]: invalid label value {value!r}")
    exprs = selector.get("matchExpressions")
    if exprs is not None:
        if not isinstance(exprs, list):
            problems.append(f"matchExpressions: must be a list, got {exprs!r}")
        else:
            seen: list[tuple] = []
            for i, expr in enumerate(exprs):
                where = f"matchExpressions[{i}]"
                if not isinstance(expr, dict):
                    problems.append(f"{where}: must be a mapping with key/operator/values, got {expr!r}")
                    continue
                for key in expr:
                    if key not in ("key", "operator", "values"):
                        problems.append(f'{where}: unknown field "{key}"')
                key = expr.get("key")
                op = expr.get("operator")
                values = expr.get("values") or []
                if not isinstance(key, str) or not key:
                    problems.append(f"{where}.key: invalid label key {key!r}")
                if op not in SELECTOR_OPERATORS:
                    problems.append(f"{where}.operator: {_q(op)} is not a valid label selector operator")
                if not isinstance(values, list):
                    problems.append(f"{where}.values: must be a list, got {values!r}")
                    continue
                if op in ("In", "NotIn") and not values:
                    problems.append(f"{where}.values: for 'in', 'notin' operators, values set can't be empty")
                if op in ("Exists", "DoesNotExist") and values:
                    problems.append(f"{where}.values: values set must be empty for exists and does not exist")
                dup = _first_duplicate([str(v) for v in values])
                if dup is not None:
                    problems.append(
                        f"{where}.values: duplicate definition of match expression value in label selector {_q(dup)}"
                    )
                ident = (key, op, tuple(sorted(str(v) for v in values)))
                if ident in seen:
                    problems.append(f"{where}: duplicate definition of match expressions {_q(_expr_text(expr))}")
                seen.append(ident)
    return problems


def _expr_text(expr: dict) -> str:
    return f"{expr.get('key')} {expr.get('operator')} {sorted(str(v) for v in expr.get('values') or [])}"


def _first_duplicate(items: Iterable) -> Any:
    seen = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None


def selector_text(selector: dict | None) -> str:
    """A stable, readable form of a selector (used to find duplicates and in messages)."""
    if not selector:
        return "<everything>"
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        values = ",".join(sorted(str(v) for v in expr.get("values") or []))
        op = expr.get("operator")
        if op in ("Exists",):
            parts.append(str(expr.get("key")))
        elif op == "DoesNotExist":
            parts.append(f"!{expr.get('key')}")
        else:
            parts.append(f"{expr.get('key')} {str(op).lower()} ({values})")
    return ",".join(sorted(parts))


@dataclass
class ServiceAllocation:
    """An IPAddressPool's ``serviceAllocation``: who may get addresses from it.

    ``priority``: lower number = higher priority; None (or 0 in a manifest) =
    lowest. ``namespaces`` lists namespace names; ``namespace_selectors`` and
    ``service_selectors`` are Kubernetes LabelSelector dicts.
    """

    priority: int | None = None
    namespaces: list[str] = field(default_factory=list)
    namespace_selectors: list[dict] = field(default_factory=list)
    service_selectors: list[dict] = field(default_factory=list)

    def matches(self, namespace: str, namespace_labels: dict | None, service_labels: dict | None) -> bool:
        """True when a service in ``namespace`` with ``service_labels`` may use the pool.

        The namespace must be listed or selected (when any namespace restriction
        is given), and one service selector must match (when any is given).
        """
        if self.namespaces or self.namespace_selectors:
            ok = namespace in self.namespaces or any(
                selector_matches(sel, namespace_labels or {}) for sel in self.namespace_selectors
            )
            if not ok:
                return False
        if self.service_selectors:
            return any(selector_matches(sel, service_labels or {}) for sel in self.service_selectors)
        return True


@dataclass
class Pool:
    """An IPAddressPool, parsed.

    ``ranges`` keep the manifest order; ``labels`` are the pool's metadata
    labels (for ipAddressPoolSelectors).
    """

    name: str
    ranges: list[AddressRange]
    auto_assign: bool = True
    avoid_buggy_ips: bool = False
    allocation: ServiceAllocation | None = None
    labels: dict = field(default_factory=dict)

    def contains(self, ip: object) -> bool:
        """True when ``ip`` (str or ipaddress object) falls in one of the ranges.

        Buggy addresses still belong to the pool (MetalLB accepts them when
        requested explicitly); ``usable`` tells whether auto-assignment may use it.
        """
        ip = _as_ip(ip)
        return ip is not None and any(ip in r for r in self.ranges)

    def usable(self, ip: object) -> bool:
        """True when ``ip`` is in the pool and not skipped by avoidBuggyIPs."""
        ip = _as_ip(ip)
        return ip is not None and self.contains(ip) and not (self.avoid_buggy_ips and ip_is_buggy(ip))

    def families(self) -> set[int]:
        return {r.version for r in self.ranges}

    def size(self, version: int) -> int:
        """Usable addresses of one family (minus .0/.255 ones when avoid_buggy_ips)."""
        total = 0
        for r in self.ranges:
            if r.version != version:
                continue
            total += r.size
            if self.avoid_buggy_ips:
                total -= r.buggy_count()
        return total

    def iter_addresses(self, version: int) -> Iterator[IPAddress]:
        """Usable addresses of one family, ascending (ranges never overlap in a valid config)."""
        ranges = sorted((r for r in self.ranges if r.version == version), key=lambda r: int(r.start))
        last = -1
        for r in ranges:
            start = max(int(r.start), last + 1)
            for value in range(start, int(r.end) + 1):
                ip: IPAddress = ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value)
                if self.avoid_buggy_ips and ip_is_buggy(ip):
                    continue
                yield ip
            last = max(last, int(r.end))


def overlapping_cidrs(first: AddressRange, second: AddressRange) -> tuple[IPNetwork, IPNetwork] | None:
    """The first pair of MetalLB CIDRs (one of each range) that overlap, or None."""
    if not first.overlaps(second):
        return None
    for a in first.networks():
        for b in second.networks():
            if a.overlaps(b):
                return a, b
    return None  # pragma: no cover - overlapping ranges always share a CIDR pair


def find_overlaps(pools: Iterable[Pool]) -> list[str]:
    """Every overlap between ranges, across all pools and inside each pool.

    Pools are taken in the given order, as MetalLB does: the later range is
    reported against the already defined one, with MetalLB's message
    ``CIDR "x" in pool "b" overlaps with already defined CIDR "y"``.
    """
    seen: list[tuple[str, AddressRange]] = []
    problems = []
    for pool in pools:
        for index, rng in enumerate(pool.ranges):
            for owner, other in seen:
                pair = overlapping_cidrs(rng, other)
                if pair is None:
                    continue
                where = f" (from {_q(other.text)} in pool {_q(owner)})"
                problems.append(
                    f"IPAddressPool {_q(pool.name)}: spec.addresses[{index}]: CIDR {_q(str(pair[0]))} in pool "
                    f"{_q(pool.name)} overlaps with already defined CIDR {_q(str(pair[1]))}{where}"
                )
                break
            seen.append((pool.name, rng))
    return problems


def pool_counts(pool: Pool, assigned: Iterable[object]) -> dict[int, dict[str, int]]:
    """Per family of the pool: ``total`` usable addresses, ``assigned`` (distinct
    addresses of ``assigned`` that fall in the pool, shared ones counted once) and
    ``available`` (usable and not assigned), as MetalLB's IPAddressPool status."""
    taken: dict[int, set[IPAddress]] = {4: set(), 6: set()}
    for item in assigned:
        try:
            ip = item if isinstance(item, (ipaddress.IPv4Address, ipaddress.IPv6Address)) else parse_ip(str(item))
        except ValueError:
            continue
        if pool.contains(ip):
            taken[ip.version].add(ip)
    counts = {}
    for version in sorted(pool.families()):
        total = pool.size(version)
        usable_taken = sum(1 for ip in taken[version] if pool.usable(ip))
        counts[version] = {"total": total, "assigned": len(taken[version]), "available": total - usable_taken}
    return counts
