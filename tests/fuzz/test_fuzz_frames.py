"""Fuzz the ARP and NDP parsers and the announcer's receive path with hostile frames.

Mutations of valid requests/answers: truncated, oversized (up to 9,000 bytes, a jumbo frame), VLAN
(802.1Q, 802.1ad, stacked) tagged, bytes flipped, and NDP with option chains that loop (zero length,
lengths that run past the end, thousands of tiny options) with the checksum fixed up so the option
walk is reached. Nothing may raise; a frame the announcer answers must be a request for an address it
holds, answered from its own MAC.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import struct
import time

from fuzzcfg import FRAMES, SEED
from nocloudlb.l2 import arp, ndp
from nocloudlb.l2.announcer import L2Announcer
from nocloudlb.l2.tables import Iface

MY_MAC = bytes.fromhex("020000005301")
PEER = bytes.fromhex("020000005302")
VIP4 = ipaddress.IPv4Address("198.51.100.210").packed
VIP6 = ipaddress.IPv6Address("2001:db8:1::210").packed
ASKER6 = ipaddress.IPv6Address("2001:db8:1::1").packed


def _seeds() -> list[bytes]:
    ns = ndp.solicitation(PEER, VIP6, ASKER6)
    return [
        arp.probe(PEER, VIP4, ipaddress.IPv4Address("198.51.100.1").packed),
        arp.frame(MY_MAC, PEER, arp.OP_REPLY, PEER, VIP4, MY_MAC, VIP4),
        *arp.gratuitous(PEER, VIP4),
        ns,
        ndp.solicitation(PEER, VIP6),
        ndp.unsolicited_na(PEER, VIP6),
    ]


def _fix_icmp6(frame: bytearray) -> bytearray:
    """Make the IPv6 payload length and ICMPv6 checksum right again (so the option walk is reached)."""
    if len(frame) < 54 + 4 or frame[12:14] != b"\x86\xdd":
        return frame
    icmp = frame[54:]
    frame[18:20] = struct.pack("!H", len(icmp))
    icmp[2:4] = b"\x00\x00"
    csum = ndp.checksum(bytes(frame[22:38]), bytes(frame[38:54]), bytes(icmp))
    frame[56:58] = struct.pack("!H", csum)
    return frame


def _mutate(rng: random.Random, seed: bytes) -> bytes:
    f = bytearray(seed)
    op = rng.randrange(9)
    if op == 0:  # truncated
        return bytes(f[: rng.randrange(len(f) + 1)])
    if op == 1:  # oversized
        return bytes(f + rng.randbytes(rng.randrange(1, 9000 - len(f))))
    if op == 2:  # VLAN tags in the frame: 802.1Q, 802.1ad, stacked
        tags = b"".join(struct.pack("!HH", rng.choice((0x8100, 0x88A8, 0x9100)), rng.randrange(4096))
                        for _dummy in range(rng.randrange(1, 3)))
        return bytes(f[:12] + tags + f[12:])
    if op == 3:  # flipped bytes
        for _dummy in range(rng.randrange(1, 8)):
            f[rng.randrange(len(f))] = rng.randrange(256)
        return bytes(f)
    if op == 4 and f[12:14] == b"\x86\xdd":  # NDP: option chains that loop or run off the end
        base = f[: 54 + 24]
        kind = rng.randrange(4)
        if kind == 0:
            opts = bytes([rng.randrange(256), 0]) + rng.randbytes(6)  # length 0: must stop the walk
        elif kind == 1:
            opts = b"".join(bytes([rng.randrange(1, 3), 1]) + rng.randbytes(6)
                            for _dummy in range(rng.randrange(1, 1100)))
        elif kind == 2:
            opts = bytes([1, 255]) + rng.randbytes(rng.randrange(0, 64))  # claims 2,040 bytes
        else:
            opts = rng.randbytes(rng.randrange(1, 600))
        return bytes(_fix_icmp6(bytearray(base + opts)))
    if op == 5 and f[12:14] == b"\x86\xdd":  # flipped bytes, checksum fixed
        for _dummy in range(rng.randrange(1, 6)):
            f[rng.randrange(14, len(f))] = rng.randrange(256)
        return bytes(_fix_icmp6(f))
    if op == 6:  # header fields changed (hw/proto types and lengths, IPv6 version, hop limit)
        f[rng.randrange(12, min(len(f), 60))] = rng.choice((0, 1, 4, 6, 0x40, 0x60, 255))
        return bytes(_fix_icmp6(f) if rng.random() < 0.5 else f)
    if op == 7:
        return rng.randbytes(rng.randrange(0, 200))
    return bytes(f)


class _Sock:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, frame: bytes) -> int:
        self.sent.append(frame)
        return len(frame)


def test_parsers_and_receive_path_survive_hostile_frames():
    rng = random.Random(SEED)
    seeds = _seeds()
    ann = L2Announcer("n1", logging.getLogger("fuzz"), registry=None)
    sock = _Sock()
    iface = Iface("eth0", 2, MY_MAC, sock, answer={VIP4, VIP6})  # type: ignore[arg-type]
    counts = {"arp": 0, "nd": 0, "answered": 0}
    t0 = time.monotonic()
    for _dummy in range(FRAMES):
        frame = _mutate(rng, rng.choice(seeds))
        a = arp.parse(frame)
        n = ndp.parse(frame)
        counts["arp"] += a is not None
        counts["nd"] += n is not None
        if a is not None:
            arp.reply_to(a, MY_MAC)
            assert a.sender_ip and a.target_ip
        if n is not None:
            ndp.reply_to(n, MY_MAC)
            assert n.target_ip
        before = len(sock.sent)
        if frame[12:14] == b"\x08\x06":
            ann._answerer.on_arp(iface, frame)
        else:
            ann._answerer.on_nd(iface, frame)
        for out in sock.sent[before:]:
            counts["answered"] += 1
            assert out[6:12] == MY_MAC  # only ever from our own MAC
            if out[12:14] == b"\x08\x06":
                assert out[28:32] == VIP4 and a is not None and a.tpa == VIP4
            else:
                assert n is not None and n.target == VIP6 and out[62:78] == VIP6
        del sock.sent[:]
    took = time.monotonic() - t0
    print(f"\n{FRAMES} frames in {took:.1f}s: {counts}")
    # the mutations keep a fair share valid, so the deep paths are exercised
    assert counts["arp"] > FRAMES // 20 and counts["nd"] > FRAMES // 20 and counts["answered"] > FRAMES // 50
