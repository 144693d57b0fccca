# -*- coding: utf-8 -*-
# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Client side of the speaker's control socket: one JSON line out, one JSON line back.

Shared by the daemon's CLI (as ``nocloudlb.core.control_client``) and the modules
that talk to a running speaker (speaker_info, node_drain).
"""

from __future__ import annotations

import json
import socket

DEFAULT_SOCKET = "/run/nocloudlb/speaker.sock"


def request(path: str, payload: dict, timeout: float = 5.0) -> dict:
    """Send ``payload`` to the speaker listening on ``path`` and return its answer.

    Raises OSError (FileNotFoundError, ConnectionRefusedError, PermissionError, a
    timeout, or ConnectionError when the speaker closes without answering) and
    ValueError when the answer is not JSON.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(payload).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data.strip():
        raise ConnectionError(f"{path}: the speaker closed the connection without an answer")
    return json.loads(data)
