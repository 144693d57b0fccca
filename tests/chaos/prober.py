# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs inside the chaos lab's client (standard library only): who answers for every VIP, and HTTP.

Usage: python3 prober.py IFACE INTERVAL UNTIL STOPFILE VIP=PORT [VIP=PORT ...]

Every INTERVAL seconds it asks for every VIP, twice 20 ms apart: an ARP request (IPv4) or a
neighbour solicitation (IPv6), and prints one line per round: {"k": "arp", "t": <send time>,
"a": {vip: [mac, ...]}, "a1": {...}, "a2": {...}}. ``a1`` and ``a2`` are the MACs that answered the
first and the second request (a reply counts for the first until the second is sent). ``a`` is who
answers in that round: the MACs of a request that two or more answered (two owners at once), else the
second request's answer, else the first's. So a clean move between the two requests (the old owner
answers the first, the new one the second, as a hand-off that makes before it breaks does now and
then) is the new owner, not two owners. Only replies sent to this client count (a gratuitous
announcement is not an answer). Beside it one thread per VIP
fetches http://VIP:PORT/ every 0.25 s (1 s timeout; each node's web root names the node) and
prints {"k": "http", "t": ..., "ip": vip, "ok": bool, "body": node or error}.
"""

from __future__ import annotations

import ipaddress
import json
import os
import select
import socket
import struct
import sys
import threading
import time
import urllib.request

LOCK = threading.Lock()


def emit(obj: dict) -> None:
    line = json.dumps(obj, separators=(",", ":"))
    with LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def my_ipv4(iface: str) -> bytes:
    import fcntl

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("256s", iface.encode()[:15])
        return fcntl.ioctl(s.fileno(), 0x8915, req)[20:24]  # SIOCGIFADDR
    finally:
        s.close()


def http_loop(ip: str, port: int, until: float, stop: str) -> None:
    host = f"[{ip}]" if ":" in ip else ip
    url = f"http://{host}:{port}/"
    while time.time() < until and not os.path.exists(stop):
        t = time.time()
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                body, ok = r.read().decode().strip()[:40], True
        except Exception as exc:  # every failure is a data point
            body, ok = f"{type(exc).__name__}: {exc}"[:120], False
        emit({"k": "http", "t": t, "ip": ip, "ok": ok, "body": body})
        time.sleep(max(0.0, 0.25 - (time.time() - t)))


def main() -> int:
    iface, interval, until, stop = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    targets = {}
    for item in sys.argv[5:]:
        ip, port = item.rsplit("=", 1)
        targets[str(ipaddress.ip_address(ip))] = int(port)
    v4 = [ip for ip in targets if ":" not in ip]
    v6 = [ip for ip in targets if ":" in ip]

    arp = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
    arp.bind((iface, 0x0806))
    mac = arp.getsockname()[4]
    src = my_ipv4(iface)
    icmp = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    icmp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
    icmp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)
    icmp.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, iface.encode())
    scope = socket.if_nametoindex(iface)

    def send_all() -> None:
        for ip in v4:
            frame = b"\xff" * 6 + mac + b"\x08\x06" + struct.pack(
                "!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, src, b"\x00" * 6, socket.inet_aton(ip))
            arp.send(frame)
        for ip in v6:
            target = ipaddress.IPv6Address(ip).packed
            group = "ff02::1:ff" + target[13:14].hex() + ":" + target[14:16].hex()
            ns = struct.pack("!BBHI", 135, 0, 0, 0) + target + struct.pack("!BB6s", 1, 1, mac)
            try:
                icmp.sendto(ns, (group, 0, 0, scope))
            except OSError:
                pass

    for ip, port in targets.items():
        threading.Thread(target=http_loop, args=(ip, port, until, stop), daemon=True).start()

    while time.time() < until and not os.path.exists(stop):
        t0 = time.time()
        first: dict[str, set[str]] = {ip: set() for ip in targets}
        slots = (first, {ip: set() for ip in targets})  # the answers to the first request, to the second
        send_all()
        second = t0 + 0.02
        end = t0 + interval
        while True:
            now = time.time()
            if second and now >= second:
                send_all()
                second = 0.0
            if now >= end:
                break
            ready = select.select([arp, icmp], [], [], min(end, second or end) - now)[0]
            answers = slots[0] if second else slots[1]  # the second request is out once ``second`` is 0
            for sock in ready:
                if sock is arp:
                    data = arp.recv(128)
                    if len(data) < 42 or data[0:6] != mac:
                        continue
                    op = struct.unpack("!H", data[20:22])[0]
                    sender_ip = socket.inet_ntoa(data[28:32])
                    if op == 2 and sender_ip in answers:
                        answers[sender_ip].add(mac_text(data[22:28]))
                else:
                    data, _addr = icmp.recvfrom(256)
                    if len(data) < 24 or data[0] != 136:
                        continue
                    target_ip = str(ipaddress.IPv6Address(data[8:24]))
                    if target_ip not in answers:
                        continue
                    opts = data[24:]
                    while len(opts) >= 8 and opts[1]:
                        if opts[0] == 2:  # target link-layer address
                            answers[target_ip].add(mac_text(opts[2:8]))
                        opts = opts[opts[1] * 8:]
        first, last = slots
        who = {ip: sorted(first[ip] if len(first[ip]) > 1 and len(last[ip]) < 2 else last[ip] or first[ip])
               for ip in targets}
        emit({"k": "arp", "t": t0, "a": who, "a1": {ip: sorted(m) for ip, m in first.items()},
              "a2": {ip: sorted(m) for ip, m in last.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
