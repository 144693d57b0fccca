"""``nocloudlb status`` for people, against three real speakers in namespaces: the table,
-o json / -o yaml, --watch marking a change of owner with its time while the owner is
killed, and --cluster asking every member (its metrics endpoint) what it announces."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml
from nocloudlb.core.election import DRAIN_LABEL, election_order
from speaker_harness import SpeakerCluster, pool_docs, service_doc, spread_vips

pytestmark = pytest.mark.timeout(120)
NODES = ["n1", "n2", "n3"]


@pytest.fixture
def netns_prefix() -> str:
    return "nfh"


@pytest.fixture
def running(make_segment, tmp_path):
    """Three speakers, one VIP led by each, metrics served on every node's address."""
    vips = spread_vips(NODES)
    docs = pool_docs() + [service_doc(f"svc{i}", [ip]) for i, ip in enumerate(sorted(vips))]
    c = SpeakerCluster(make_segment(hosts=3), tmp_path, profile="fast", resources=docs)
    for n in NODES:
        c.write_config(n, c.config(n, metrics={"bind": "0.0.0.0:7472"}))
    c.start_all()
    return c, vips


def cli(c: SpeakerCluster, node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return c.seg.run(c.host(node).ns, [sys.executable, "-m", "nocloudlb.cli", "status", "--socket", c.sock(node),
                                       *args], check=check, timeout=30)


def test_table_json_and_yaml_say_who_owns_what_and_why(running):
    c, vips = running
    out = cli(c, "n1").stdout
    assert re.search(r"^node n1\s+ready yes\s+config ok\s+members 3/3 alive", out, re.M), out
    assert "\x1b[" not in out  # no colour when not on a terminal
    header = next(line for line in out.splitlines() if line.startswith("VIP"))
    assert header.split() == ["VIP", "SERVICE", "POOL", "OWNER", "THIS", "NODE", "REASON", "CONFLICT"]
    for ip, leader in vips.items():
        row = next(line for line in out.splitlines() if line.startswith(ip + " "))
        cols = row.split()
        assert cols[3] == leader, row
        assert cols[4:6] == (["owner", "-"] if leader == "n1" else ["backup", "notOwner"]), row
    # members: this node's own labels; peers gossip only the label keys some selector uses
    assert re.search(r"^n1\s+198\.51\.100\.11:7946\s+alive\s+rack=n1$", out, re.M), out
    assert re.search(r"^n2\s+198\.51\.100\.12:7946\s+alive\s+-$", out, re.M), out
    coloured = cli(c, "n1", "--color", "always").stdout
    assert "\x1b[32mowner" in coloured
    as_json = json.loads(cli(c, "n2", "-o", "json").stdout)
    as_yaml = yaml.safe_load(cli(c, "n2", "-o", "yaml").stdout)
    for doc in (as_json, as_yaml):
        assert doc["node"] == "n2" and {v["ip"]: v["leader"] for v in doc["vips"]} == vips
    assert json.loads(cli(c, "n2", "--json").stdout)["node"] == "n2"  # the old flag still works


def test_watch_marks_the_change_of_owner_with_its_time(running):
    c, vips = running
    ip = next(ip for ip, leader in vips.items() if leader == "n1")
    after = election_order(["n2", "n3"], ip)[0]
    argv = [sys.executable, "-m", "nocloudlb.cli", "status", "--socket", c.sock(after), "--watch",
            "--interval", "0.2", "--count", "40"]
    proc = c.seg.popen(c.host(after).ns, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # the first table is drawn
    t_kill = c.stop("n1", signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    first_table, _sep, changes = out.partition("\nCHANGES\n")
    assert re.search(rf"^{re.escape(ip)}\s+\S+\s+\S+\s+n1\s+backup", first_table, re.M), first_table
    m = re.search(rf"^(\d\d):(\d\d):(\d\d\.\d\d\d)  {re.escape(ip)} \(test/svc\d\): owner n1 -> {after}$",
                  changes, re.M)
    assert m, changes
    # the time printed is when the watcher saw the change: after the kill, within the death timers
    seen = time.localtime(t_kill)
    printed = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    killed = seen.tm_hour * 3600 + seen.tm_min * 60 + seen.tm_sec + (t_kill % 1)
    assert 0 <= (printed - killed) % 86400 < 15, (m.group(0), t_kill)


def test_cluster_asks_every_member_and_flags_vips_without_owner(running):
    c, vips = running
    res = cli(c, "n2", "--cluster", "-o", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    view = json.loads(res.stdout)
    assert [m["name"] for m in view["members"]] == NODES
    assert all(m["reachable"] and m["configLoaded"] and m["sameConfig"] for m in view["members"]), view
    for v in view["vips"]:
        assert v["elected"] == vips[v["ip"]] and v["announcedBy"] == [vips[v["ip"]]] and v["verdict"] == "ok", v
    table = cli(c, "n2", "--cluster").stdout
    assert re.search(r"^MEMBER\s+ADDRESS\s+STATE\s+VERSION\s+ASKED", table, re.M), table
    # drain every node: no node may announce, and --cluster says so and exits 1
    from nocloudlb.core.control_client import request

    for n in NODES:
        assert request(c.sock(n), {"cmd": "label", "set": {DRAIN_LABEL: ""}})["ok"]
    c.wait(lambda: not any(c.announcing(n, ip) for n in NODES for ip in vips), 15, "no node announcing")
    res = cli(c, "n2", "--cluster", "-o", "json", check=False)
    assert res.returncode == 1, res.stdout
    view = json.loads(res.stdout)
    assert {v["ip"]: (v["elected"], v["announcedBy"], v["verdict"]) for v in view["vips"]} == {
        ip: (None, [], "NO OWNER") for ip in vips}
    table = cli(c, "n2", "--cluster", check=False).stdout
    assert all(re.search(rf"^{re.escape(ip)}\s.*\snone\s+nobody\s+NO OWNER$", table, re.M) for ip in vips), table


def test_support_bundle_holds_status_config_and_neighbours_but_no_secret(running, tmp_path):
    import tarfile

    c, vips = running
    cfg = c.config("n1")
    # a BGPPeer password in the config must not reach the archive; nor the gossip key
    cfg["extraSecret"] = {"password": "hunter2-do-not-ship"}
    c.config_path("n1").with_name("bundle-config.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "bundle.tar.gz"
    res = c.seg.run(c.host("n1").ns, [sys.executable, "-m", "nocloudlb.cli", "support-bundle", "-o", str(out),
                                      "--socket", c.sock("n1"), "-c",
                                      str(c.config_path("n1").with_name("bundle-config.yaml"))], timeout=60)
    assert f"{out}:" in res.stdout, res.stdout
    with tarfile.open(out) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    manifest = json.loads(files["MANIFEST.json"])
    assert {"status.json", "keys.json", "config.yaml", "neighbours.json", "addresses.json", "journal.txt",
            "versions.json"} <= set(manifest)
    assert json.loads(files["status.json"])["node"] == "n1"
    assert manifest["status.json"]["error"] == "" and manifest["neighbours.json"]["error"] == ""
    assert yaml.safe_load(files["config.yaml"])["extraSecret"]["password"] == "<redacted>"
    assert any(a.get("ifname") == "lo" for a in json.loads(files["addresses.json"]))
    everything = "".join(files.values())
    assert "hunter2-do-not-ship" not in everything
    for key in c.keys:
        assert key not in everything
    assert oct(out.stat().st_mode & 0o777) == "0o600"


def test_vip_probe_playbook_writes_what_the_wire_says_for_prometheus(running, tmp_path):
    import os
    import shutil
    from pathlib import Path

    c, vips = running
    root = Path(__file__).resolve().parents[2]
    cols = tmp_path / "collections" / "ansible_collections" / "nocloud"
    cols.mkdir(parents=True)
    (cols / "loadbalancer").symlink_to(root, target_is_directory=True)
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    bindir = Path(sys.executable).parent
    env = {"ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections"), "ANSIBLE_HOME": str(tmp_path / "ah"),
           "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    extra = json.dumps({"probe_hosts": "localhost", "probe_textfile_dir": str(textdir),
                        "probe_addresses": [*sorted(vips), "198.51.100.239"],
                        "ansible_python_interpreter": sys.executable})
    res = c.seg.run(c.seg.client.ns, [str(bindir / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                                      str(root / "monitoring" / "vip-probe.yml"), "-e", extra],
                    env=env, timeout=120, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    text = (textdir / "nocloudlb_vip.prom").read_text()
    for ip in vips:
        assert f'nocloudlb_vip_answering_macs{{ip="{ip}"}} 1\n' in text, text
    assert 'nocloudlb_vip_answering_macs{ip="198.51.100.239"} 0\n' in text, text
    if shutil.which("promtool"):
        chk = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=30, check=False)
        assert chk.returncode == 0, chk.stdout + chk.stderr
