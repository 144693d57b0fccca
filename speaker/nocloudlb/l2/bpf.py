"""Raw AF_PACKET sockets with a classic BPF filter, so only ARP and NDP frames reach Python.

The filter is a handful of hand-written classic BPF instructions, equivalent to the tcpdump
expression ``not outbound and not vlan and ((arp and arp[0:2] == 1) or (icmp6 and (ip6[40] == 135 or
ip6[40] == 136)))``, assembled from labels by :func:`assemble` instead of generated at build time:

    ld   #pkttype                ancillary load: the kernel's PACKET_* type of the frame
    jeq  #PACKET_OUTGOING -> drop       our own (and the kernel's) transmitted frames
    ld   #vlan_tag_present       ancillary load: the frame carried an 802.1Q/802.1ad tag, which the
    jeq  #0 -> next, else drop          kernel moved out of the frame (skb_vlan_untag, hardware or not):
                                        a tagged request is never answered on the untagged parent
    ldh  [12]                    Ethernet type
    jeq  #0x0806 -> next, else ipv6
    ldh  [14]                    ARP hardware type must be Ethernet (1)
    jeq  #1 -> accept, else drop
  ipv6:
    jeq  #0x86dd -> next, else drop
    ldb  [20]                    IPv6 next header (14 + 6) must be ICMPv6 (58)
    jeq  #58 -> next, else drop
    ldb  [54]                    ICMPv6 type (14 + 40)
    jeq  #135 (NS) -> accept
    jeq  #136 (NA) -> accept, else drop
  accept: ret #65535
  drop:   ret #0

ARP replies and NAs pass as well as requests/solicitations: ``probe()`` listens for
answers from other MACs on such a socket.

The responder process (responder.py) uses a narrower program, :func:`answer_program`, rebuilt
whenever the addresses it answers change: it passes only ARP requests and NS whose target is
one of those addresses, plus the frames the conflict check watches (ARP with a watched sender
address, NS/NA with a watched target). Classic BPF has no maps, so the addresses are compared
one by one (one instruction each, JIT-compiled by the kernel); NAs for answered targets pass too
(another MAC announcing an address answered here: the wire rule, l2/disagree.py); above ``EXACT_LIMIT`` addresses
of a family the program falls back to the opcode/type test (every ARP request, every NS), and
Python's set lookup does the rest. The same fallback is taken when the kernel refuses the exact program
(issue 21, defect 8): ``SO_ATTACH_FILTER`` charges the program, and while it replaces another both, to the
socket's option memory, limited by ``net.core.optmem_max`` (20 KB before Linux 6.7, 128 KB since; per network
namespace since 6.9); a larger one fails with ENOMEM. The responder then attaches this small program, reports it
once and in ``filterFallback``, and goes on answering. The announcer's own sockets only send: :data:`DROP_ALL`.
"""

from __future__ import annotations

import ctypes
import socket
import struct
from collections.abc import Sequence

ETH_P_ALL = 0x0003
ETH_P_ARP = 0x0806
ETH_P_IPV6 = 0x86DD
SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_DROP_MEMBERSHIP = 2
PACKET_MR_MULTICAST = 0
PACKET_OUTGOING = 4

# classic BPF opcodes (linux/filter.h)
BPF_LD, BPF_JMP, BPF_RET = 0x00, 0x05, 0x06
BPF_W, BPF_H, BPF_B = 0x00, 0x08, 0x10
BPF_ABS = 0x20
BPF_JEQ = 0x10
BPF_JA = 0x00
BPF_K = 0x00
SKF_AD_OFF = -0x1000
SKF_AD_PKTTYPE = 4
SKF_AD_VLAN_TAG_PRESENT = 48


Insn = tuple[int, int, int, int]

LDW = BPF_LD | BPF_W | BPF_ABS
LDH = BPF_LD | BPF_H | BPF_ABS
LDB = BPF_LD | BPF_B | BPF_ABS
JEQ = BPF_JMP | BPF_JEQ | BPF_K
RET = BPF_RET | BPF_K
JA = BPF_JMP | BPF_JA


def assemble(source: list[tuple]) -> list[Insn]:
    """Assemble ``(op, k)``, ``(JEQ, k, true_label, false_label)`` and ``("label", name)`` into BPF.

    A jump label of ``None`` means "fall through to the next instruction". ``(JA, label)`` is an
    unconditional jump (32-bit offset, so it reaches past the 255 instructions a conditional can).
    """
    labels: dict[str, int] = {}
    body: list[tuple] = []
    for item in source:
        if item[0] == "label":
            labels[item[1]] = len(body)
        else:
            body.append(item)
    out: list[Insn] = []
    for idx, item in enumerate(body):
        if len(item) == 2 and item[0] == JA and isinstance(item[1], str):
            out.append((JA, 0, 0, labels[item[1]] - idx - 1))
            continue
        if len(item) == 2:
            out.append((item[0], 0, 0, item[1] & 0xFFFFFFFF))
            continue
        code, k, jt, jf = item

        def rel(label: str | None, idx: int = idx) -> int:
            if label is None:
                return 0
            off = labels[label] - idx - 1
            if not 0 <= off < 256:
                raise ValueError(f"BPF jump to {label!r} out of range: {off}")
            return off

        out.append((code, rel(jt), rel(jf), k & 0xFFFFFFFF))
    return out


ARP_NDP_PROGRAM: tuple[Insn, ...] = tuple(assemble([
    (LDW, SKF_AD_OFF + SKF_AD_PKTTYPE),
    (JEQ, PACKET_OUTGOING, "drop", None),
    (LDW, SKF_AD_OFF + SKF_AD_VLAN_TAG_PRESENT),
    (JEQ, 0, None, "drop"),
    (LDH, 12),
    (JEQ, ETH_P_ARP, None, "ipv6"),
    (LDH, 14),
    (JEQ, 1, "accept", "drop"),
    ("label", "ipv6"),
    (JEQ, ETH_P_IPV6, None, "drop"),
    (LDB, 20),
    (JEQ, 58, None, "drop"),
    (LDB, 54),
    (JEQ, 135, "accept", None),
    (JEQ, 136, "accept", "drop"),
    ("label", "accept"),
    (RET, 0x0000FFFF),
    ("label", "drop"),
    (RET, 0),
]))


DROP_ALL: tuple[Insn, ...] = ((RET, 0, 0, 0),)

MAX_INSNS = 4096  # BPF_MAXINSNS
EXACT_LIMIT = 1024  # addresses per family compared one by one; above: opcode/type only
_ACCEPT = 0x0000FFFF


def _member(src: list[tuple], values: list[int], tag: str) -> None:
    """Append ``A in values -> accept``: blocks of conditional jumps to a local ``ret accept``
    (a conditional jump reaches 255 instructions), each block skipped over with ``ja``."""
    for b in range(0, len(values), 200):
        block = values[b : b + 200]
        ok, past = f"{tag}-ok{b}", f"{tag}-past{b}"
        src.extend((JEQ, v, ok, None) for v in block)
        src.extend([(JA, past), ("label", ok), (RET, _ACCEPT), ("label", past)])


def _word(ip: bytes, at: int = -4) -> int:
    return struct.unpack("!I", ip[at : at + 4 if at != -4 else None])[0]


def _member6(src: list[tuple], addrs: set[bytes], tag: str) -> None:
    """Append ``the NS/NA target (offset 62) in addrs -> accept``: the addresses grouped by their first
    96 bits (usually a handful of prefixes), then the last 32 bits compared one by one."""
    groups: dict[bytes, list[int]] = {}
    for ip in addrs:
        groups.setdefault(ip[:12], []).append(_word(ip))
    for g, (head, lows) in enumerate(sorted(groups.items())):
        skip = f"{tag}-g{g}"
        for off in range(3):
            src += [(LDW, 62 + 4 * off), *_not_eq(_word(head, 4 * off), skip, f"{tag}-g{g}-{off}")]
        src.append((LDW, 74))
        _member(src, sorted(set(lows)), f"{tag}-g{g}")
        src.append(("label", skip))


def _not_eq(k: int, label: str, tag: str) -> list[tuple]:
    """A != k -> label (any distance), else fall through."""
    return [(JEQ, k, tag, None), (JA, label), ("label", tag)]


def answer_program(answer: set[bytes] | frozenset[bytes], watch: set[bytes] | frozenset[bytes] = frozenset(),
                   limit: int = EXACT_LIMIT) -> tuple[Insn, ...]:
    """The responder's filter for one interface (see the module docstring).

    ``answer``: packed addresses (4 or 16 bytes) answered on it; ``watch``: addresses under the
    conflict check. IPv6 targets are compared whole (first 96 bits per prefix, then the
    last 32 bits one by one), IPv4 ones likewise. Above ``limit`` addresses of a family, every ARP request (every NS)
    passes. Returns the program as (code, jt, jf, k) tuples, at most a few thousand long.
    """
    a4 = sorted({_word(ip) for ip in answer if len(ip) == 4})
    a6 = [ip for ip in answer if len(ip) == 16]
    w4 = sorted({_word(ip) for ip in watch if len(ip) == 4})
    w6 = [ip for ip in watch if len(ip) == 16]
    n = iter(range(1 << 30))

    def need(k: int) -> list[tuple]:  # A == k, else drop (a local ret: no jump range to worry about)
        c = f"c{next(n)}"
        return [(JEQ, k, c, None), (RET, 0), ("label", c)]

    def goto_if(k: int, label: str) -> list[tuple]:  # A == k -> label (any distance), else fall through
        c = f"c{next(n)}"
        return [(JEQ, k, None, c), (JA, label), ("label", c)]

    src: list[tuple] = [
        (LDW, SKF_AD_OFF + SKF_AD_PKTTYPE),
        (JEQ, PACKET_OUTGOING, "drop", None),
        (LDW, SKF_AD_OFF + SKF_AD_VLAN_TAG_PRESENT),
        (JEQ, 0, None, "drop"),
        (LDH, 12),
        (JEQ, ETH_P_ARP, "arp", None),
        (JEQ, ETH_P_IPV6, None, "drop"),
        (JA, "ipv6"),
        ("label", "drop"),
        (RET, 0),
        ("label", "arp"),
        (LDH, 14),
        *need(1),
    ]
    if len(w4) > limit:
        src.append((RET, _ACCEPT))  # too many to watch one by one: every ARP frame
    elif w4:
        src.append((LDW, 28))  # ARP sender protocol address
        _member(src, w4, "w4")
    src += [(LDH, 20), *need(1)]  # beyond the watched senders: requests only
    if len(a4) > limit:
        src.append((RET, _ACCEPT))
    else:
        src.append((LDW, 38))  # ARP target protocol address
        _member(src, a4, "a4")
        src.append((RET, 0))
    src += [("label", "ipv6"), (LDB, 20), *need(58), (LDB, 54), *goto_if(136, "na"), *need(135)]
    if len(a6) > limit or len(w6) > limit:
        src.append((RET, _ACCEPT))
    else:
        _member6(src, {ip for ip in answer | watch if len(ip) == 16}, "ns")
        src.append((RET, 0))
    src += [("label", "na")]  # NAs for watched targets and for answered ones (another MAC announcing them)
    na6 = {ip for ip in answer | watch if len(ip) == 16}
    if len(na6) > limit:
        src.append((RET, _ACCEPT))
    else:
        _member6(src, na6, "na")
        src.append((RET, 0))
    prog = tuple(assemble(src))
    return prog if len(prog) <= MAX_INSNS else ARP_NDP_PROGRAM


def attach_filter(sock: socket.socket, program: Sequence[Insn] = ARP_NDP_PROGRAM) -> None:
    """Attach a classic BPF program (list of (code, jt, jf, k)) to ``sock`` with SO_ATTACH_FILTER."""
    blob = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(blob)
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; } (padding before the pointer)
    fprog = struct.pack("HL", len(program), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def detach_filter(sock: socket.socket) -> None:
    """Remove the socket's filter (every frame passes until the next attach)."""
    sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)


def open_packet_socket(ifname: str, program: Sequence[Insn] = ARP_NDP_PROGRAM) -> socket.socket:
    """An AF_PACKET/SOCK_RAW socket bound to ``ifname`` that only delivers frames ``program`` accepts.

    The filter is attached before bind, then frames queued before the filter took
    effect are drained, so Python never sees unrelated traffic.
    """
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0))
    try:
        attach_filter(sock, program)
        sock.bind((ifname, ETH_P_ALL))
        sock.setblocking(False)
        while True:
            try:
                sock.recv(65535)
            except BlockingIOError:
                break
    except BaseException:
        sock.close()
        raise
    return sock


def set_link_multicast(sock: socket.socket, ifindex: int, mac: bytes, add: bool) -> None:
    """Add or drop a link-layer multicast address on the socket's interface (PACKET_MR_MULTICAST)."""
    # struct packet_mreq { int mr_ifindex; unsigned short mr_type, mr_alen; unsigned char mr_address[8]; }
    mreq = struct.pack("iHH8s", ifindex, PACKET_MR_MULTICAST, 6, mac)
    sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP if add else PACKET_DROP_MEMBERSHIP, mreq)
