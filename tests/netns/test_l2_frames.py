"""Our ARP/NDP frames checked by an independent decoder (scapy), and the BPF filter on a real socket."""

from __future__ import annotations

import ipaddress
import json
import struct
import sys

import pytest
from nocloudlb.l2 import arp, bpf, ndp
from scapy.all import ARP, Ether, ICMPv6ND_NA, ICMPv6ND_NS, ICMPv6NDOptDstLLAddr, ICMPv6NDOptSrcLLAddr, IPv6

MAC = arp.mac_bytes("02:00:5e:00:53:01")
PEER = arp.mac_bytes("02:00:5e:00:53:02")
V4 = ipaddress.IPv4Address("198.51.100.200").packed
V6 = ipaddress.IPv6Address("2001:db8:1::200").packed


def _icmp6_checksum_ok(frame: bytes, layer) -> bool:
    pkt = Ether(frame)
    fresh = pkt.copy()
    del fresh[layer].cksum
    return Ether(bytes(fresh))[layer].cksum == pkt[layer].cksum


def test_arp_frames_decode_as_intended():
    req, rep = arp.gratuitous(MAC, V4)
    for frame, op, tha in ((req, 1, "00:00:00:00:00:00"), (rep, 2, "ff:ff:ff:ff:ff:ff")):
        assert len(frame) == 60
        p = Ether(frame)
        assert p.dst == "ff:ff:ff:ff:ff:ff" and p.src == "02:00:5e:00:53:01"
        assert (p[ARP].op, p[ARP].psrc, p[ARP].pdst, p[ARP].hwsrc, p[ARP].hwdst) == (
            op, "198.51.100.200", "198.51.100.200", "02:00:5e:00:53:01", tha)
    probe = Ether(arp.probe(MAC, V4))
    assert (probe[ARP].op, probe[ARP].psrc, probe[ARP].pdst) == (1, "0.0.0.0", "198.51.100.200")
    asked = arp.parse(bytes(Ether(src="02:00:5e:00:53:02", dst="ff:ff:ff:ff:ff:ff")
                            / ARP(op=1, hwsrc="02:00:5e:00:53:02", psrc="198.51.100.2", pdst="198.51.100.200")))
    assert asked.target_ip == "198.51.100.200" and asked.sender_ip == "198.51.100.2"
    reply = Ether(arp.reply_to(asked, MAC))
    assert reply.dst == "02:00:5e:00:53:02" and len(bytes(reply)) == 60
    assert (reply[ARP].op, reply[ARP].hwsrc, reply[ARP].psrc, reply[ARP].hwdst, reply[ARP].pdst) == (
        2, "02:00:5e:00:53:01", "198.51.100.200", "02:00:5e:00:53:02", "198.51.100.2")
    assert arp.parse(b"\x00" * 30) is None
    assert arp.parse(bytes(Ether() / IPv6())) is None
    with pytest.raises(ValueError, match="not a MAC address: '02:00'"):
        arp.mac_bytes("02:00")


def test_ndp_frames_decode_as_intended():
    na = arp.mac_str(MAC)
    una = ndp.unsolicited_na(MAC, V6)
    p = Ether(una)
    assert p.dst == "33:33:00:00:00:01" and p[IPv6].dst == "ff02::1" and p[IPv6].src == "2001:db8:1::200"
    assert p[IPv6].hlim == 255
    assert (p[ICMPv6ND_NA].R, p[ICMPv6ND_NA].S, p[ICMPv6ND_NA].O) == (0, 0, 1)
    assert p[ICMPv6ND_NA].tgt == "2001:db8:1::200" and p[ICMPv6NDOptDstLLAddr].lladdr == na
    assert _icmp6_checksum_ok(una, ICMPv6ND_NA)

    dad = Ether(ndp.solicitation(MAC, V6))
    assert dad.dst == "33:33:ff:00:02:00" and dad[IPv6].dst == "ff02::1:ff00:200" and dad[IPv6].src == "::"
    assert dad[ICMPv6ND_NS].tgt == "2001:db8:1::200" and ICMPv6NDOptSrcLLAddr not in dad
    assert _icmp6_checksum_ok(bytes(dad), ICMPv6ND_NS)

    # A client's NS (built by scapy) parsed by us, answered with a solicited NA.
    ns_frame = bytes(Ether(src="02:00:5e:00:53:02", dst="33:33:ff:00:02:00")
                     / IPv6(src="2001:db8:1::2", dst="ff02::1:ff00:200")
                     / ICMPv6ND_NS(tgt="2001:db8:1::200") / ICMPv6NDOptSrcLLAddr(lladdr="02:00:5e:00:53:02"))
    ns = ndp.parse(ns_frame)
    assert ns.type == ndp.NS and ns.target == V6 and ns.lladdr == PEER
    ans = ndp.reply_to(ns, MAC)
    r = Ether(ans)
    assert r.dst == "02:00:5e:00:53:02" and r[IPv6].dst == "2001:db8:1::2" and r[IPv6].hlim == 255
    assert (r[ICMPv6ND_NA].R, r[ICMPv6ND_NA].S, r[ICMPv6ND_NA].O) == (0, 1, 1)
    assert r[ICMPv6NDOptDstLLAddr].lladdr == na and _icmp6_checksum_ok(ans, ICMPv6ND_NA)
    # Invalid per RFC 4861: hop limit below 255, or a bad checksum.
    low_hops = bytearray(ns_frame)
    low_hops[21] = 64  # IPv6 hop limit
    assert ndp.parse(ns_frame) is not None and ndp.parse(bytes(low_hops)) is None
    bad = bytearray(ns_frame)
    bad[56] ^= 0xFF
    assert ndp.parse(bytes(bad)) is None
    # DAD NS from :: is answered to all-nodes, without the solicited flag.
    dad_ns = ndp.parse(ndp.solicitation(PEER, V6))
    d = Ether(ndp.reply_to(dad_ns, MAC))
    assert d[IPv6].dst == "ff02::1" and (d[ICMPv6ND_NA].S, d[ICMPv6ND_NA].O) == (0, 1)


def test_bpf_program_shape():
    prog = bpf.ARP_NDP_PROGRAM
    assert prog[-1] == (bpf.RET, 0, 0, 0) and prog[-2] == (bpf.RET, 0, 0, 0xFFFF)
    for idx, (code, jt, jf, _k) in enumerate(prog):
        if code == bpf.JEQ:
            assert idx + 1 + jt < len(prog) and idx + 1 + jf < len(prog)
    with pytest.raises(ValueError, match="out of range"):
        bpf.assemble([(bpf.JEQ, 1, "far", None), *[(bpf.RET, 0)] * 300, ("label", "far"), (bpf.RET, 0)])


LISTEN = r"""
import json, select, sys, time
from nocloudlb.l2.bpf import open_packet_socket
s = open_packet_socket("eth0")
print("ready", flush=True)
seen = []
end = time.time() + float(sys.argv[1])
while time.time() < end:
    r, _, _ = select.select([s], [], [], max(0.0, end - time.time()))
    if not r:
        continue
    d = s.recv(65535)
    et = d[12:14].hex()
    if et == "0806":
        seen.append([et, d[21], ".".join(str(b) for b in d[38:42])])
    else:
        seen.append([et, d[54] if d[20] == 58 else -d[20], ""])
print(json.dumps(seen), flush=True)
"""


def test_bpf_filter_lets_only_arp_and_ns_na_through(segment):
    seg = segment
    n1 = seg.hosts[0]
    proc = seg.popen(n1.ns, [sys.executable, "-u", "-c", LISTEN, "2.5"])
    assert proc.stdout.readline().strip() == "ready"
    c = seg.client.ns
    seg.run(c, ["ping", "-c", "2", "-i", "0.2", "-W", "1", n1.ipv4])  # ARP + ICMP
    seg.run(c, ["ping", "-6", "-c", "2", "-i", "0.2", "-W", "1", n1.ipv6])  # NS/NA + ICMPv6 echo
    seg.run(c, f"echo hi > /dev/udp/{n1.ipv4}/9 || true")
    seg.run(c, ["arping", "-c", "1", "-i", "eth0", n1.ipv4], check=False)
    seg.run(n1.ns, ["ping", "-c", "1", "-W", "1", seg.client.ipv4])  # n1's own outgoing frames
    # n1 asks for an address nobody has: outgoing ARP requests the filter must drop.
    seg.run(n1.ns, ["ping", "-c", "1", "-W", "1", "198.51.100.99"], check=False)
    out, _err = proc.communicate(timeout=20)
    seen = json.loads(out.strip().splitlines()[-1])
    kinds = {(et, typ) for et, typ, _rest in seen}
    assert kinds <= {("0806", 1), ("0806", 2), ("86dd", 135), ("86dd", 136)}, kinds
    assert ("0806", 1) in kinds and ("86dd", 135) in kinds
    assert not [x for x in seen if x[2] == "198.51.100.99"], "own outgoing ARP requests reached the socket"


def test_packed_helpers():
    assert ndp.solicited_node(V6) == ipaddress.IPv6Address("ff02::1:ff00:200").packed
    assert ndp.multicast_mac(ndp.solicited_node(V6)) == bytes.fromhex("3333ff000200")
    assert struct.calcsize("HBBI") == 8  # struct sock_filter
