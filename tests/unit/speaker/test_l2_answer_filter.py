"""The responder's classic BPF program (bpf.answer_program), run by a small interpreter of the
instructions it uses, on frames built by scapy: what passes and what stops in the kernel.

The kernel runs the same program in tests/netns/test_l2_responder.py (frames counted there).
"""

from __future__ import annotations

import ipaddress
import struct

import pytest
from nocloudlb.l2 import bpf
from scapy.all import ARP, Ether, ICMPv6ND_NA, ICMPv6ND_NS, ICMPv6NDOptSrcLLAddr, IPv6

MAC = "02:00:00:00:00:02"
VIP4, VIP6 = "198.51.100.200", "2001:db8:1::200"


def run(prog, frame: bytes, pkttype: int = 0, vlan: bool = False) -> int:
    """Interpret ``prog`` (LD W/H/B ABS with the pkttype and vlan ancillary loads, JEQ, JA, RET)."""
    a, pc = 0, 0
    for _i in range(100000):
        code, jt, jf, k = prog[pc]
        k = k - (1 << 32) if k >= 1 << 31 else k
        if code in (bpf.LDW, bpf.LDH, bpf.LDB):
            if k == bpf.SKF_AD_OFF + bpf.SKF_AD_PKTTYPE:
                a = pkttype
            elif k == bpf.SKF_AD_OFF + bpf.SKF_AD_VLAN_TAG_PRESENT:
                a = int(vlan)
            else:
                size = {bpf.LDW: 4, bpf.LDH: 2, bpf.LDB: 1}[code]
                if k + size > len(frame):
                    return 0  # the kernel drops a frame read past its end
                a = int.from_bytes(frame[k : k + size], "big")
            pc += 1
        elif code == bpf.JEQ:
            pc += 1 + (jt if a == (k & 0xFFFFFFFF) else jf)
        elif code == bpf.JA:
            pc += 1 + k
        elif code == bpf.RET:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
    raise AssertionError("no RET reached")


def packed(ip: str) -> bytes:
    return ipaddress.ip_address(ip).packed


def arp_req(target: str, sender: str = "198.51.100.2", op: int = 1) -> bytes:
    return bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=MAC) / ARP(op=op, hwsrc=MAC, psrc=sender, pdst=target))


def ns(target: str) -> bytes:
    return bytes(Ether(src=MAC, dst="33:33:ff:00:02:00") / IPv6(src="2001:db8:1::2", dst="ff02::1:ff00:200")
                 / ICMPv6ND_NS(tgt=target) / ICMPv6NDOptSrcLLAddr(lladdr=MAC))


def na(target: str) -> bytes:
    return bytes(Ether(src=MAC, dst="33:33:00:00:00:01") / IPv6(src=target, dst="ff02::1") / ICMPv6ND_NA(tgt=target))


def test_only_requests_for_answered_addresses_pass():
    prog = bpf.answer_program({packed(VIP4), packed(VIP6)})
    assert run(prog, arp_req(VIP4)) and run(prog, ns(VIP6))
    assert not run(prog, arp_req("198.51.100.201"))
    assert not run(prog, arp_req(VIP4, op=2))  # a reply: nothing to answer, nothing watched
    assert not run(prog, ns("2001:db8:1::201"))
    assert not run(prog, ns("2001:db8:7::200"))  # same last 32 bits, other prefix
    assert run(prog, na(VIP6))  # another MAC announcing an answered address: the wire rule reads it
    assert not run(prog, na("2001:db8:1::201"))
    assert run(prog, arp_req(VIP4, sender=VIP4))  # a gratuitous ARP (request form) for it, likewise
    assert not run(prog, arp_req(VIP4), pkttype=bpf.PACKET_OUTGOING)
    assert not run(prog, arp_req(VIP4), vlan=True)
    assert not run(prog, bytes(Ether(src=MAC) / IPv6(src="2001:db8:1::2", dst=VIP6)))


def test_watched_addresses_pass_in_every_form():
    prog = bpf.answer_program(set(), {packed(VIP4), packed(VIP6)})
    assert run(prog, arp_req("198.51.100.9", sender=VIP4, op=2))  # someone answering as the VIP
    assert run(prog, arp_req("198.51.100.9", sender=VIP4, op=1))  # or asking from it
    assert run(prog, ns(VIP6)) and run(prog, na(VIP6))  # DAD and advertisements for it
    assert not run(prog, arp_req(VIP4)) and not run(prog, na("2001:db8:1::201"))


@pytest.mark.parametrize("n", [1, 300, 1024])
def test_exact_up_to_the_limit_then_by_type(n):
    v4 = {(ipaddress.IPv4Address("203.0.113.0") + i % 256).packed if i < 256
          else (ipaddress.IPv4Address("192.0.2.0") + i % 256).packed for i in range(min(n, 512))}
    v6 = {(ipaddress.IPv6Address("2001:db8:5::") + i).packed for i in range(n)}
    prog = bpf.answer_program(v4 | v6)
    assert len(prog) <= bpf.MAX_INSNS
    for ip in list(v6)[:50]:
        assert run(prog, ns(str(ipaddress.IPv6Address(ip))))
    assert not run(prog, ns("2001:db8:6::1"))
    assert run(prog, arp_req(str(ipaddress.IPv4Address(next(iter(v4))))))
    wide = bpf.answer_program(v4 | v6 | {(ipaddress.IPv6Address("2001:db8:9::") + i).packed for i in range(1024)})
    assert run(wide, ns("2001:db8:6::1"))  # over the limit: every NS passes, Python's set decides
    assert not run(wide, arp_req("198.51.100.77"))  # the IPv4 part stays exact


def test_jumps_stay_in_range_and_land_on_instructions():
    prog = bpf.answer_program({(ipaddress.IPv6Address("2001:db8:5::") + i).packed for i in range(1000)},
                              {packed(VIP4)} | {(ipaddress.IPv4Address("203.0.113.0") + i).packed for i in range(250)})
    for pc, (code, jt, jf, k) in enumerate(prog):
        assert 0 <= jt < 256 and 0 <= jf < 256
        if code == bpf.JEQ:
            assert pc + 1 + max(jt, jf) < len(prog)
        if code == bpf.JA:
            assert pc + 1 + k < len(prog)
    assert prog[-1][0] == bpf.RET
    assert struct.calcsize("HBBI") * len(prog) < 65536


def test_an_address_watched_then_answered_gets_requests_for_it_through():
    """The conflict check watches a VIP (its filter passes frames *from* it), then the VIP is answered:
    the filter must be rebuilt to pass requests *for* it. Before the fix the responder took the watched
    address as already passing and kept the old filter until a later clean-up (a VIP announced but
    unanswered for up to a second)."""
    import os
    import socket

    from nocloudlb.l2.responder import Responder

    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    resp = Responder(r_in, w_out)
    try:
        os.write(w_in, f"I lo {socket.if_nametoindex('lo')} {MAC.replace(':', '')}\n".encode())
        assert resp.control()
        os.write(w_in, f"W {packed(VIP4).hex()}\n".encode())  # under the conflict check
        assert resp.control()
        port = resp.ports["lo"]
        assert run(port.program, arp_req("198.51.100.2", sender=VIP4)) != 0  # a frame from it: seen
        os.write(w_in, f"A lo {packed(VIP4).hex()}\n".encode())  # announced: answered from now on
        assert resp.control()
        assert run(port.program, arp_req(VIP4)) != 0  # a request for it reaches the responder
    finally:
        for port in list(resp.ports.values()):
            port.sock.close()
        for fd in (r_in, w_in, r_out, w_out):
            os.close(fd)
