"""A real server for the data-plane scenario: TCP port 8080 answers "NAME PEER" per line.

A connection's first line "HOLD" keeps it open: every further line is answered with the name,
so a client can tell whether an established connection still reaches the same server.
"""

import socket
import socketserver
import sys

NAME = sys.argv[1]


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        try:
            for line in self.rfile:
                peer = self.client_address[0].removeprefix("::ffff:")
                self.wfile.write(f"{NAME} {peer}\n".encode())
                self.wfile.flush()
                if not line.startswith(b"HOLD") and not line.startswith(b"more"):
                    return
        except OSError:
            pass


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    address_family = socket.AF_INET6


if __name__ == "__main__":
    with Server(("::", 8080), Handler) as srv:
        srv.serve_forever()
