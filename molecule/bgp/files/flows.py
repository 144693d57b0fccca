"""Long-lived TCP connections through the router's ECMP (issue 9, point 8), run inside lab hosts.

    python3 -c "$(cat flows.py)" server PORT            # on each node: says its name, then echoes
    python3 -c "$(cat flows.py)" client VIP PORT N STOP [STALL] # on the client: N connections held open

The client opens N connections (N source ports, so the router hashes them over the nodes),
notes which node answered each, then sends one byte on every connection every 0.1 s and waits
for its echo. A connection that is reset, closed or silent for STALL seconds (default 2) is
counted as broken, under the node that held it. Once connected it prints
{"ready": {node: {"connections": n, ...}}, "ports": {source port: node}}; when the file STOP
appears, one JSON line: {"nodes": {node: {"connections": n, "broken": b}}, "errors": [...],
"rounds": r, "max_gap": s} (errors name the connection's source port; max_gap: the longest a
connection waited for its echo, in seconds).
"""

import json
import os
import socket
import socketserver
import sys
import time


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall((socket.gethostname() + "\n").encode())
        while True:
            data = self.request.recv(4096)
            if not data:
                return
            self.request.sendall(data)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def server(port):
    Server(("0.0.0.0", port), Echo).serve_forever()


def client(vip, port, n, stop, stall=2.0):
    conns = []
    for _i in range(n):
        s = socket.create_connection((vip, port), timeout=stall)
        name = b""
        while not name.endswith(b"\n"):
            name += s.recv(64)
        conns.append([s, name.decode().strip(), True, s.getsockname()[1]])
    nodes = {}
    for _s, name, _ok, _port in conns:
        nodes.setdefault(name, {"connections": 0, "broken": 0})["connections"] += 1
    ports = {c[3]: c[1] for c in conns}
    print(json.dumps({"ready": nodes, "ports": ports}), flush=True)
    errors, rounds, max_gap = [], 0, 0.0
    while not os.path.exists(stop):
        rounds += 1
        for c in conns:
            if not c[2]:
                continue
            t0 = time.monotonic()
            try:
                c[0].sendall(b"x")
                if c[0].recv(1) != b"x":
                    raise ConnectionError("closed")
            except OSError as exc:
                c[2] = False
                nodes[c[1]]["broken"] += 1
                errors.append({"node": c[1], "t": time.time(), "error": type(exc).__name__, "port": c[3]})
            max_gap = max(max_gap, time.monotonic() - t0)
        time.sleep(0.1)
    print(json.dumps({"nodes": nodes, "errors": errors, "rounds": rounds, "max_gap": round(max_gap, 3)}),
          flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(int(sys.argv[2]))
    else:
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
               float(sys.argv[6]) if len(sys.argv) > 6 else 2.0)
