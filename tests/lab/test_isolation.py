"""Lab traffic has no way out: hosts have only lo and their veths, the fabric only bridges and ports."""

from __future__ import annotations

import json

import labctl
from conftest import addr, ping


def test_hosts_and_fabric_hold_only_lab_links(lab: labctl.Lab) -> None:
    topo = lab.state()["topology"]
    ports = set()
    for host, h in topo["hosts"].items():
        links = json.loads(lab.exec(host, ["ip", "-j", "link", "show"]).stdout)
        names = {li["ifname"] for li in links}
        assert names == {"lo"} | {i["name"] for i in h["interfaces"]}, (host, names)
        assert all(li.get("link_type") in ("loopback", "ether") for li in links)
        ports |= {i["port"] for i in h["interfaces"]}
    fabric = {li["ifname"]: li for li in json.loads(labctl.run(["ip", "-n", lab.fabric_ns, "-j", "-d", "link"]).stdout)}
    bridges = {f"br-{s}" for s in topo["segments"]}
    assert set(fabric) == {"lo"} | bridges | ports
    for p in ports:
        assert fabric[p]["linkinfo"]["info_kind"] == "veth" and fabric[p]["master"] in bridges
    machine = {li["ifname"] for li in json.loads(labctl.run(["ip", "-j", "link"]).stdout)}
    assert not machine & (ports | bridges)


def test_no_route_out_of_the_lab(lab: labctl.Lab) -> None:
    """Only the lab's own prefixes are routable: a default route, where there is one, ends at r1, which has none."""
    topo = lab.state()["topology"]
    lab_ips = {a.split("/")[0] for h in topo["hosts"].values() for i in h["interfaces"] for a in i["addresses"]}
    for host in lab.hosts():
        res = lab.exec(host, ["ip", "-j", "route", "get", "8.8.8.8"], check=False)
        if res.returncode == 0:
            assert json.loads(res.stdout)[0]["gateway"] in lab_ips, (host, res.stdout)
        else:
            assert "unreachable" in res.stderr, (host, res.stderr)
    assert lab.exec("r1", ["ip", "route", "get", "8.8.8.8"], check=False).returncode != 0
    assert ping(lab, "c2", addr(lab, "c1")) == 1


def test_host_systemd_stays_in_its_own_cgroups(lab: labctl.Lab) -> None:
    """The host's systemd builds its tree (init.scope, system.slice) inside the host's directories only."""
    dirs = lab.cgroup_dirs("n1")
    assert {"systemd", "freezer"} <= set(dirs)
    for name, d in dirs.items():
        if name in ("systemd", "memory", "pids", "devices", "unified"):
            assert (d / "init.scope").is_dir() and (d / "system.slice").is_dir(), (name, d)
    own = lab.exec("n1", ["cat", "/proc/1/cgroup"]).stdout.split()
    assert all(line.endswith(":/init.scope") or line.endswith(":/") for line in own), own
