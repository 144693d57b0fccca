"""``nocloudlb support-bundle``: what someone helping you needs, in one archive.

    nocloudlb support-bundle [-o FILE] [--socket S] [-c CONFIG] [--since 2h]

Collects the speaker's status and key ids (control socket), its config with every
secret redacted (the gossip key file is never read), the unit's journal, the
neighbour, address, link and route tables, the ARP sysctls and the handover
nftables table, versions, and a MANIFEST.json that says for each file what
produced it and whether that worked. A step that fails is recorded, never fatal.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import socket
import subprocess
import tarfile
import time
from typing import Any

REDACTED = "<redacted>"
# keys whose values are secrets wherever they appear (MetalLB: BGPPeer password, passwordSecret)
SECRET_KEY = re.compile(r"(?i)^(password|passwd|secret|token|key|keys|privatekey|authkey|passwordsecret|"
                        r"gossipkey|bgppassword|.*_password|.*_secret|.*_token)$")


def redact(doc: Any) -> Any:
    """A copy of ``doc`` with secret values replaced; Secret objects lose their data."""
    if isinstance(doc, dict):
        out: dict[str, Any] = {}
        is_secret_kind = doc.get("kind") == "Secret"
        for k, v in doc.items():
            if SECRET_KEY.match(str(k)) or (is_secret_kind and k in ("data", "stringData")):
                out[k] = REDACTED if not isinstance(v, dict) else dict.fromkeys(v, REDACTED)
            else:
                out[k] = redact(v)
        return out
    if isinstance(doc, list):
        return [redact(v) for v in doc]
    return doc


def _run(argv: list[str], timeout: float = 20) -> tuple[str, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"{argv[0]}: {exc}"
    note = "" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[:500]}"
    return proc.stdout, note


def collect(socket_path: str, config_path: str, since: str) -> dict[str, tuple[bytes, str, str]]:
    """name -> (content, what produced it, error or "")."""
    from .core.control_client import request

    files: dict[str, tuple[bytes, str, str]] = {}

    def add(name: str, text: str, what: str, err: str = "") -> None:
        files[name] = (text.encode(), what, err)

    for cmd in ("status", "keys"):
        try:
            add(f"{cmd}.json", json.dumps(request(socket_path, {"cmd": cmd}), indent=2, sort_keys=True) + "\n",
                f"control socket {socket_path}: {cmd}")
        except (OSError, ValueError) as exc:
            add(f"{cmd}.json", "", f"control socket {socket_path}: {cmd}", str(exc))
    try:
        import yaml

        with open(config_path) as fh:
            text = fh.read()
        try:
            docs = [redact(d) for d in yaml.safe_load_all(text)]
            add("config.yaml", yaml.safe_dump_all(docs, sort_keys=False), f"{config_path}, secrets redacted")
        except yaml.YAMLError as exc:
            # unparsable: keep only its shape, never its text (it may hold a secret)
            add("config.yaml", "", f"{config_path}", f"not YAML ({exc}); {len(text.splitlines())} lines left out")
    except OSError as exc:
        add("config.yaml", "", config_path, str(exc))
    commands = {
        "journal.txt": ["journalctl", "-u", "nocloudlb-speaker.service", "-o", "short-iso-precise", "--no-pager",
                        "--since", f"-{since}" if not since.startswith("-") else since],
        "neighbours.json": ["ip", "-j", "neigh", "show"],
        "addresses.json": ["ip", "-j", "addr", "show"],
        "links.json": ["ip", "-j", "-s", "link", "show"],
        "routes.json": ["ip", "-j", "route", "show", "table", "all"],
        "sysctl-arp.txt": ["sysctl", "net.ipv4.conf.all.arp_ignore", "net.ipv4.conf.all.arp_announce",
                           "net.ipv4.conf.default.arp_ignore", "net.ipv4.conf.default.arp_announce"],
        "nft-handover.txt": ["nft", "list", "table", "netdev", "nocloudlb_handover"],
        "unit.txt": ["systemctl", "status", "--no-pager", "nocloudlb-speaker.service"],
    }
    for name, argv in commands.items():
        out, err = _run(argv)
        add(name, out, " ".join(argv), err)
    try:
        from importlib.metadata import version

        nver = version("nocloudlb")
    except Exception:  # noqa: BLE001 - a bundle never fails on a version lookup
        nver = "unknown"
    add("versions.json", json.dumps({"nocloudlb": nver, "python": platform.python_version(),
                                     "kernel": platform.release(), "host": socket.gethostname(),
                                     "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2) + "\n",
        "versions")
    return files


def write(path: str, files: dict[str, tuple[bytes, str, str]]) -> None:
    top = os.path.basename(path).removesuffix(".tar.gz")
    manifest = {name: {"from": what, "bytes": len(data), "error": err} for name, (data, what, err) in files.items()}
    blobs = dict((n, d) for n, (d, _w, _e) in files.items())
    blobs["MANIFEST.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    now = time.time()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in sorted(blobs.items()):
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(data), int(now), 0o600
            tar.addfile(info, io.BytesIO(data))


def main(output: str | None, socket_path: str, config_path: str, since: str) -> int:
    node = socket.gethostname()
    path = output or f"nocloudlb-support-{node}-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz"
    files = collect(socket_path, config_path, since)
    write(path, files)
    failed = [f"{n} ({e})" for n, (_d, _w, e) in files.items() if e]
    print(f"{path}: {len(files) + 1} files, {os.path.getsize(path)} bytes")
    for f in failed:
        print(f"  missing or partial: {f}")
    return 0
