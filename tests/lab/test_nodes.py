"""Day-two node operations on the lab (issue 20, layer 2): add a node with --limit, remove one under
traffic, uninstall one, with the commands docs/operations.md shows, run as shown from a directory
holding `inventory/` and `playbooks/`.

Three speakers n1-n3 and a client c1 are deployed with site.yml (n4 is booted but not in the group
yet); then, each step timed and printed:
  refuse  `site.yml --limit n4` while no other node of the group can be reached: refused, n4 untouched;
  add     n4 in the group, `site.yml --limit n4`: same key, it joins (`nocloudlb status --cluster` on
          it lists every member), every service keeps its address;
  remove  `remove_node.yml -e target=n2` while c1 fetches n2's VIP every 50 ms: 0 requests lost, the
          VIP served by another node, n2's speaker stopped and disabled, no join list names n2;
  uninstall  `uninstall.yml -e target=n2 --check` changes nothing, then `uninstall.yml -e target=n2`
          leaves no unit, file, user, nft table or address on lo on n2; the cluster still serves.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import labctl
import pytest
import yaml
from conftest import REPO, leftovers

sys.path.insert(0, str(REPO / "molecule" / "default" / "files"))

from measure import Poller, http_report  # noqa: E402

pytestmark = pytest.mark.timeout(420)

LAB = "pynodes"
NODES = ["n1", "n2", "n3", "n4"]
NOCLOUDLB = "/opt/nocloudlb/venv/bin/nocloudlb"
POOL = [f"198.51.100.{i}" for i in range(200, 232)]


def order(nodes: list[str], ip: str) -> list[str]:
    return sorted(nodes, key=lambda n: hashlib.sha256(f"{n}#{ip}".encode()).digest())


# The VIP n2 leads among n1-n4 (so also among n1-n3): removing n2 moves it.
WEB_IP = next(ip for ip in POOL if order(NODES, ip)[0] == "n2")

TOPOLOGY = {
    "name": LAB,
    "segments": {"lan": {}},
    "hosts": {
        **{n: {"groups": ["nodes"],
               "interfaces": [{"segment": "lan", "addresses": [f"198.51.100.{11 + i}/24", f"2001:db8:1::{11 + i}/64"]}]}
           for i, n in enumerate(NODES)},
        "c1": {"groups": ["clients"],
               "interfaces": [{"segment": "lan", "addresses": ["198.51.100.50/24", "2001:db8:1::50/64"]}]},
    },
}

CLUSTER_VARS = {
    "nocloudlb_memberlist_address": "{{ lab_ipv4 }}",
    "nocloudlb_memberlist_profile": "lan",
    "nocloudlb_pools": [{"name": "web4", "addresses": ["198.51.100.200-198.51.100.231"]},
                        {"name": "web6", "addresses": ["2001:db8:1::200-2001:db8:1::20f"]}],
    "nocloudlb_l2_advertisements": [{"name": "lan", "interfaces": ["eth0"]}],
    "nocloudlb_services": [
        {"name": "web", "namespace": "prod", "ports": [8080], "ips": [WEB_IP]},
        {"name": "api", "namespace": "prod", "ports": [8080], "pool": "web4"},
        {"name": "web6", "namespace": "prod", "ports": [8080], "pool": "web6", "ip_families": ["IPv6"]},
    ],
}

HTTP_UNIT = """[Unit]
Description=Lab HTTP server (stands in for the service's backend)
[Service]
ExecStart=/usr/bin/python3 -m http.server 8080 --bind :: --directory /srv/www
Restart=always
[Install]
WantedBy=multi-user.target
"""

TIMINGS: list[tuple[str, float]] = []


def step(name: str, t0: float) -> None:
    TIMINGS.append((name, time.monotonic() - t0))
    print(f"STEP {name}: {TIMINGS[-1][1]:.1f} s", flush=True)


class Ops:
    """The lab, a working directory with inventory/ and playbooks/, and the collection importable."""

    def __init__(self, lab: labctl.Lab, work: Path) -> None:
        self.lab, self.work = lab, work
        coll = work / "collections" / "ansible_collections" / "nocloud"
        coll.mkdir(parents=True)
        (coll / "loadbalancer").symlink_to(REPO, target_is_directory=True)
        (work / "playbooks").symlink_to(REPO / "playbooks", target_is_directory=True)
        (work / "inventory" / "group_vars").mkdir(parents=True)
        (work / "inventory" / "group_vars" / "all.yml").write_text(yaml.safe_dump({"ansible_become": False}))
        (work / "inventory" / "group_vars" / "speakers.yml").write_text(yaml.safe_dump(CLUSTER_VARS))
        bindir = Path(sys.executable).parent
        self.env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(work / "collections"),
                        PATH=f"{bindir}:{os.environ.get('PATH', '')}", ANSIBLE_HOME=str(work / "home"),
                        ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")

    def inventory(self, speakers: list[str], bad_pids: tuple[str, ...] = ()) -> None:
        """inventory/hosts.yml: every lab host (nsenter), group speakers as given; hosts in bad_pids get
        a PID above pid_max, which no process can have: they cannot be reached."""
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
        hosts = {}
        for h in [*NODES, "c1"]:
            hosts[h] = {"ansible_connection": "community.docker.nsenter",
                        "ansible_nsenter_pid": pid_max + 1000 if h in bad_pids else self.lab.pid(h),
                        "ansible_python_interpreter": "/usr/bin/python3",
                        "lab_ipv4": TOPOLOGY["hosts"][h]["interfaces"][0]["addresses"][0].split("/")[0]}
        inv = {"all": {"hosts": hosts, "children": {"speakers": {"hosts": {h: None for h in speakers}},
                                                    "clients": {"hosts": {"c1": None}}}}}
        (self.work / "inventory" / "hosts.yml").write_text(yaml.safe_dump(inv))

    def run(self, command: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A command exactly as the docs show it, from the working directory."""
        res = subprocess.run(command.split(), cwd=self.work, env=self.env, capture_output=True, text=True,
                             timeout=timeout, check=False)
        with (self.work / "log.txt").open("a") as log:
            log.write(f"$ {command}\n{res.stdout}\n{res.stderr}\n")
        if check:
            assert res.returncode == 0, (f"{command} exited {res.returncode}:\n{res.stdout[-6000:]}\n"
                                         f"{res.stderr[-2000:]}")
        return res

    def sh(self, host: str, cmd: str, check: bool = True) -> str:
        return self.lab.exec(host, ["sh", "-c", cmd], check=check, timeout=60).stdout

    def status(self, host: str, *args: str) -> dict:
        return json.loads(self.sh(host, f"{NOCLOUDLB} status -o json {' '.join(args)}"))

    def services(self, host: str) -> dict[str, list[str]]:
        """Service -> addresses, from the node's config.yaml."""
        cfg = yaml.safe_load(self.sh(host, "cat /etc/nocloudlb/config.yaml"))
        return {f"{d['metadata']['namespace']}/{d['metadata']['name']}": [i["ip"] for i in d["status"]["loadBalancer"]
                                                                          ["ingress"]]
                for d in cfg["resources"] if d["kind"] == "Service"}

    def wait(self, what: str, test, timeout: float = 60):  # noqa: ANN001 - a callable returning a truthy value
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = test()
            except (labctl.LabError, ValueError, KeyError) as exc:
                last = exc
            if last and not isinstance(last, Exception):
                return last
            time.sleep(0.5)
        raise AssertionError(f"{what}: not after {timeout} s (last: {last!r})")


@pytest.fixture(scope="module")
def ops(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ops]:
    lab = labctl.Lab(LAB)
    lab.down()
    try:
        t0 = time.monotonic()
        res = lab.up(TOPOLOGY)
        assert all(v == "running" for v in res["system_state"].values()), res["system_state"]
        o = Ops(lab, tmp_path_factory.mktemp("nodes"))
        for n in NODES:  # each node's web root names the node
            o.sh(n, f"mkdir -p /srv/www && echo {n} > /srv/www/index.html")
            lab.exec(n, ["sh", "-c", "cat > /etc/systemd/system/lab-http.service && systemctl daemon-reload "
                                     "&& systemctl start lab-http.service"], input=HTTP_UNIT)
        step("lab up (4 nodes, 1 client)", t0)
        t0 = time.monotonic()
        o.inventory(["n1", "n2", "n3"])
        o.run("ansible-playbook -i inventory playbooks/site.yml")
        step("site.yml on n1-n3", t0)
        yield o
    finally:
        print("TIMINGS " + ", ".join(f"{n}: {s:.1f} s" for n, s in TIMINGS), flush=True)
        lab.down()
    assert not any(leftovers(LAB).values()), leftovers(LAB)


def test_add_remove_uninstall(ops: Ops) -> None:
    before = ops.services("n1")
    assert before["prod/web"] == [WEB_IP], before
    key = ops.sh("n1", "sha256sum /etc/nocloudlb/memberlist.key").split()[0]

    # A limited run that cannot read the cluster's key or addresses is refused; n4 stays untouched.
    t0 = time.monotonic()
    ops.inventory(NODES, bad_pids=("n1", "n2", "n3"))
    res = ops.run("ansible-playbook -i inventory playbooks/site.yml --limit n4", check=False)
    assert res.returncode != 0 and "none of the cluster's other nodes" in res.stdout, res.stdout[-4000:]
    assert ops.sh("n4", "ls /etc/nocloudlb /opt/nocloudlb 2>&1 || true").count("No such file") == 2
    step("site.yml --limit n4 with n1-n3 unreachable: refused", t0)

    # Add n4: the group names it, the run is limited to it.
    t0 = time.monotonic()
    ops.inventory(NODES)
    ops.run("ansible-playbook -i inventory playbooks/site.yml --limit n4")
    assert ops.sh("n4", "sha256sum /etc/nocloudlb/memberlist.key").split()[0] == key
    assert ops.services("n4") == before, (ops.services("n4"), before)
    cluster = ops.wait("n4 sees every member alive and asks each one", lambda: (
        v := ops.status("n4", "--cluster"),
        v if sorted(m["name"] for m in v["members"] if m["state"] == "alive" and m["reachable"]) == NODES
        else None)[1])
    assert all(v["verdict"] == "ok" for v in cluster["vips"]), cluster["vips"]
    table = ops.sh("n4", f"{NOCLOUDLB} status --cluster")
    assert all(n in table for n in NODES), table
    assert ops.services("n1") == before  # outside the limit: untouched
    step("site.yml --limit n4 (joins, same key and addresses)", t0)

    # Remove n2 (the owner of WEB_IP) while c1 fetches it every 50 ms.
    t0 = time.monotonic()
    poller = Poller(LAB, "c1", f"http://{WEB_IP}:8080/", 240)
    try:
        assert poller.wait_for("n2", time.time() - 1, 20), f"{WEB_IP} not served by n2: {poller.since(0)[-3:]}"
        t_cmd = time.time()
        ops.run("ansible-playbook -i inventory playbooks/remove_node.yml -e target=n2")
        time.sleep(1.0)
        report = http_report(poller.since(t_cmd), t_cmd)
    finally:
        poller.close()
    print(f"REMOVE n2: {report['http_failed']} of {report['http_requests']} requests to {WEB_IP} failed; "
          f"served by {report['served_by']}", flush=True)
    assert report["http_requests"] > 50 and report["http_failed"] == 0, report
    assert report["served_by"][-1][1] != "n2", report["served_by"]
    assert ops.sh("n2", "systemctl is-active nocloudlb-speaker.service; systemctl is-enabled "
                        "nocloudlb-speaker.service", check=False).split() == ["inactive", "disabled"]
    for n in ("n1", "n3", "n4"):
        join = yaml.safe_load(ops.sh(n, "cat /etc/nocloudlb/config.yaml"))["memberlist"]["join"]
        assert sorted(join) == ["198.51.100.11:7946", "198.51.100.13:7946", "198.51.100.14:7946"], (n, join)
        assert ops.status(n)["config"]["restartPending"] == [], n
        assert ops.services(n) == before, n
    ops.wait("n1 sees n1, n3, n4 alive and n2 gone", lambda: sorted(
        m["name"] for m in ops.status("n1")["members"] if m["state"] == "alive") == ["n1", "n3", "n4"])
    step("remove_node.yml -e target=n2 under traffic", t0)

    # The operator takes n2 out of the group; then uninstall it, first in check mode.
    t0 = time.monotonic()
    ops.inventory(["n1", "n3", "n4"])
    lo_before = ops.sh("n2", "ip -o addr show dev lo")
    assert WEB_IP in lo_before, lo_before  # the stopped speaker left its VIPs on lo
    ops.run("ansible-playbook -i inventory playbooks/uninstall.yml -e target=n2 --check")
    assert ops.sh("n2", "ip -o addr show dev lo") == lo_before
    assert ops.sh("n2", "test -f /etc/nocloudlb/memberlist.key && echo kept", check=False).strip() == "kept"
    step("uninstall.yml -e target=n2 --check", t0)

    t0 = time.monotonic()
    ops.run("ansible-playbook -i inventory playbooks/uninstall.yml -e target=n2")
    left = {
        "units": ops.sh("n2", "systemctl list-unit-files 'nocloudlb*' --no-legend; ls /etc/systemd/system "
                              "/etc/systemd/system/*.wants | grep nocloudlb", check=False).strip(),
        "files": ops.sh("n2", "ls -d /etc/nocloudlb /opt/nocloudlb /var/lib/nocloudlb /run/nocloudlb "
                              "/etc/sysctl.d/90-nocloudlb.conf /usr/local/bin/nocloudlb 2>/dev/null",
                        check=False).strip(),
        "users": ops.sh("n2", "getent passwd nocloudlb; getent group nocloudlb nocloudlb-key", check=False).strip(),
        "nft": ops.sh("n2", "nft list tables | grep nocloudlb", check=False).strip(),
        "lo": ops.sh("n2", "ip -o addr show dev lo | grep -v -e ' 127.0.0.1/8 ' -e ' ::1/128 '", check=False).strip(),
        "arp_ignore": ops.sh("n2", "cat /proc/sys/net/ipv4/conf/all/arp_ignore").strip(),
    }
    assert left == {"units": "", "files": "", "users": "", "nft": "", "lo": "", "arp_ignore": "0"}, left
    # the cluster serves on: n2's VIP from another node
    assert ops.sh("c1", f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://{WEB_IP}:8080/', "
                        "timeout=2).read().decode().strip())\"").strip() in ("n1", "n3", "n4")
    step("uninstall.yml -e target=n2", t0)
