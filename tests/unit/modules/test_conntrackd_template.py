"""The speaker role's connection sync templates: conntrackd.conf.j2 rendered with jinja2 and run by
conntrackd itself (it has no check mode: it is started in the foreground in a network namespace of
its own until its control socket answers), and config.yaml.j2's connectionSync accepted by the
speaker's config parser."""

from __future__ import annotations

import grp
import os
import shutil
import socket
import stat
import subprocess
import time
import uuid

import jinja2
import pytest
import yaml
from nocloudlb.config import parse

from .conftest import ROOT

TEMPLATES = ROOT / "roles" / "speaker" / "templates"
DEFAULTS = yaml.safe_load((ROOT / "roles" / "speaker" / "defaults" / "main.yml").read_text())


def render(name: str, **values) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             extensions=["jinja2.ext.do"])
    env.filters["to_nice_yaml"] = lambda data, indent=2, sort_keys=False: yaml.safe_dump(
        data, indent=indent, sort_keys=sort_keys, default_flow_style=False)
    env.filters["bool"] = bool
    variables = {k: v for k, v in DEFAULTS.items() if k.startswith("nocloudlb_conntrackd_")}
    variables.update(ansible_managed="managed by test", **values)
    return env.get_template(name).render(**variables)


def conf(**values) -> str:
    base = {"nocloudlb_conntrackd_enabled": True, "nocloudlb_conntrackd_interface": "sync0",
            "speaker__conntrackd_address": "203.0.113.1",
            "speaker__conntrackd_filter": ["198.51.100.13", "198.51.100.14", "2001:db8::13"]}
    base.update(values)
    return render("conntrackd.conf.j2", **base)


def test_unicast_filter_and_why_not_ct_mark():
    text = conf(nocloudlb_conntrackd_peer="203.0.113.2")
    assert "Mode FTFW" in text and "UDP {" in text and "Multicast" not in text
    assert "IPv4_Destination_Address 203.0.113.2" in text and "Interface sync0" in text
    assert "IPv4_address 198.51.100.13" in text and "IPv6_address 2001:db8::13" in text
    assert "conntrack mark" in text and "Path /var/run/conntrackd.ctl" in text


def test_multicast_without_a_peer_and_no_address_filter_without_servers():
    text = conf(speaker__conntrackd_filter=[])
    assert "Multicast {" in text and "IPv4_address 225.0.0.50" in text and "IPv4_interface 203.0.113.1" in text
    assert "Address Accept" not in text


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("conntrackd") or not shutil.which("ip"),
                    reason="needs root, ip and conntrackd to run conntrackd on the rendered file")
@pytest.mark.parametrize("peer", ["203.0.113.2", ""], ids=["unicast", "multicast"])
def test_conntrackd_runs_the_rendered_file(tmp_path, peer):
    sock, lock = tmp_path / "ct.ctl", tmp_path / "ct.lock"
    text = conf(nocloudlb_conntrackd_peer=peer, nocloudlb_conntrackd_socket=str(sock))
    text = text.replace("/var/lock/conntrackd.lock", str(lock))  # not the host's lock file
    path = tmp_path / "conntrackd.conf"
    path.write_text(text)
    ns = f"ctsync-tpl-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    proc = None
    try:
        # a veth pair inside the namespace (no dummy module on every kernel): sync0 carries the address
        subprocess.run(["ip", "-n", ns, "link", "add", "sync0", "type", "veth", "peer", "name", "sync1"], check=True)
        subprocess.run(["ip", "-n", ns, "addr", "add", "203.0.113.1/30", "dev", "sync0"], check=True)
        for dev in ("sync0", "sync1"):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        out = tmp_path / "out.txt"
        with open(out, "w") as fh:
            proc = subprocess.Popen(["ip", "netns", "exec", ns, "conntrackd", "-C", str(path)], stdout=fh,
                                    stderr=subprocess.STDOUT)
        end = time.monotonic() + 10
        while not sock.exists():
            assert proc.poll() is None, f"conntrackd refused the file: {out.read_text()}\n{text}"
            assert time.monotonic() < end, f"no control socket in 10 s: {out.read_text()}"
            time.sleep(0.05)
        stats = subprocess.run(["ip", "netns", "exec", ns, "conntrackd", "-C", str(path), "-s", "network"],
                               capture_output=True, text=True, timeout=5, check=False)
        assert stats.returncode == 0 and "Pckts recv" in stats.stdout, stats
    finally:
        if proc is not None:
            proc.kill()  # by its PID: the ip-netns-exec'd conntrackd
            proc.wait(timeout=5)
        subprocess.run(["ip", "netns", "del", ns], check=False)


def test_the_unit_drop_in_lets_the_speakers_group_use_the_socket(tmp_path):
    text = render("conntrackd-dropin.conf.j2", nocloudlb_user="nocloudlb", nocloudlb_group="nocloudlb",
                  nocloudlb_conntrackd_socket=str(tmp_path / "ct.ctl"))
    assert "ExecStart=/usr/sbin/conntrackd -C /etc/conntrackd/conntrackd.conf" in text
    post = next(line for line in text.splitlines() if line.startswith("ExecStartPost="))
    script = post.split("-c ", 1)[1].strip("'")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "ct.ctl"))
    try:
        group = grp.getgrgid(os.getgid()).gr_name
        t0 = time.monotonic()
        done = subprocess.run(["/bin/sh", "-c", script.replace("chgrp nocloudlb", f"chgrp {group}")],
                              capture_output=True, text=True, timeout=10, check=False)
        assert done.returncode == 0 and time.monotonic() - t0 < 1, done
        assert stat.S_IMODE(os.stat(tmp_path / "ct.ctl").st_mode) == 0o660
    finally:
        sock.close()


def test_the_speaker_config_enables_connection_sync():
    values = {"speaker__join": ["198.51.100.11"], "speaker__bind": "198.51.100.11", "nocloudlb_memberlist_port": 7946,
              "nocloudlb_memberlist_profile": "lan", "nocloudlb_config_dir": "/etc/nocloudlb",
              "nocloudlb_witness": "", "nocloudlb_memberlist_overrides": {}, "nocloudlb_node_name": "n1",
              "nocloudlb_node_labels": {}, "nocloudlb_state_dir": "/var/lib/nocloudlb",
              "nocloudlb_socket": "/run/nocloudlb/speaker.sock", "nocloudlb_metrics_bind": "auto:7472",
              "nocloudlb_handover_grace": 30, "nocloudlb_bgp_flow_handover": {}, "speaker__allocated": [],
              "nocloudlb_conntrackd_enabled": True, "nocloudlb_conntrackd_commit_timeout": 0.5}
    cfg = parse(yaml.safe_load(render("config.yaml.j2", **values)))
    assert cfg.connection_sync.enabled and cfg.connection_sync.commit_timeout == 0.5
    assert cfg.connection_sync.socket == "/var/run/conntrackd.ctl"
    values["nocloudlb_conntrackd_enabled"] = False
    assert "connectionSync" not in yaml.safe_load(render("config.yaml.j2", **values))
