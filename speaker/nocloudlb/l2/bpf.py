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

ARP replies and NAs pass as well as requests/solicitations: the announcer's conflict
check and ``probe()`` listen for answers from other MACs on the same socket.
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


def assemble(source: list[tuple]) -> list[Insn]:
    """Assemble ``(op, k)``, ``(JEQ, k, true_label, false_label)`` and ``("label", name)`` into BPF.

    A jump label of ``None`` means "fall through to the next instruction".
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


def attach_filter(sock: socket.socket, program: Sequence[Insn] = ARP_NDP_PROGRAM) -> None:
    """Attach a classic BPF program (list of (code, jt, jf, k)) to ``sock`` with SO_ATTACH_FILTER."""
    blob = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(blob)
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; } (padding before the pointer)
    fprog = struct.pack("HL", len(program), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


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
