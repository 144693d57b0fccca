# Copyright: nocloud.loadbalancer developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The migration's hold file, on real keepalived (2.2.7 here) in namespaces, read on the wire.

A migration to keepalived reloads the master first, then its backups, which learn the instance from that
reload. A backup that does not process the master's adverts within its master-down time after the reload
(0.3 s with advert_int 0.1; a reload that stalls on a loaded host) claims the VIP for a moment: a second
MAC. So the backups reload with the instance's hold file at 1 (FAULT: it never claims) and the migration
writes 0 once they have heard the master (roles/keepalived/tasks/migrate_keepalived.yml).

The test makes the stall certain instead of likely: the master's keepalived is frozen (SIGSTOP) for a
second, three master-down times. Held, the backup sends nothing for the VIP and never holds it; released,
the same freeze makes it claim the VIP (the control: the test can fail). Released with the master
advertising, it stays BACKUP.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from nocloudlb.core import keepalived as k
from speaker_harness import Capture, SpeakerCluster

VIP = "198.51.100.230"


def docs() -> list[dict]:
    return [
        {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool", "metadata": {"name": "web4"},
         "spec": {"addresses": ["198.51.100.230-198.51.100.239"]}},
        {"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement", "metadata": {"name": "lan"},
         "spec": {"interfaces": ["eth0"]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "prod"},
         "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
         "status": {"loadBalancer": {"ingress": [{"ip": VIP}]}}},
    ]


def test_a_held_backup_never_claims_the_vip_and_a_released_one_does(make_segment, tmp_path: Path):
    seg = make_segment(hosts=2, prefix="nkah")
    nodes = [{"name": f"n{i + 1}", "addresses": [h.ipv4], "interfaces": ["eth0"]} for i, h in enumerate(seg.hosts)]
    drain = {i: tmp_path / f"n{i + 1}" / "nocloudlb-drain" for i in range(2)}
    procs: dict[int, object] = {}

    def plan(i: int) -> k.Plan:
        return k.plan(docs(), nodes, {"profile": "fast", "script_user": "root", "drain_file": str(drain[i])})

    master = next(i for i in range(2) if plan(0).instances[0].master == f"n{i + 1}")
    backup = 1 - master
    inst = plan(backup).instances[0]
    hold = Path(k.hold_file(str(drain[backup]), inst.name))

    def start(i: int, only: set[str] | None) -> None:
        drain[i].parent.mkdir(exist_ok=True)
        conf = tmp_path / f"ka{i}.conf"
        conf.write_text(k.render(plan(i), f"n{i + 1}", only))
        log = open(tmp_path / f"ka{i}.log", "a")  # noqa: SIM115
        procs[i] = seg.popen(seg.hosts[i].ns, ["keepalived", "-n", "-l", "-D", "-f", str(conf),
                                               "-p", str(tmp_path / f"ka{i}.pid"),
                                               "-r", str(tmp_path / f"ka{i}.vrrp.pid")],
                             stdout=log, stderr=log)
        log.close()

    def holders() -> list[int]:
        return [i for i, h in enumerate(seg.hosts) if f" {VIP}/" in seg.run(h.ns, "ip -o addr show dev eth0").stdout]

    def log_has(i: int, text: str) -> bool:
        return text.lower() in (tmp_path / f"ka{i}.log").read_text().lower()

    def freeze_master(seconds: float) -> None:
        os.killpg(procs[master].pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.killpg(procs[master].pid, signal.SIGCONT)

    cap = Capture(seg, tmp_path / "arp.cap", expr="arp")
    try:
        start(master, None)
        start(backup, set())  # the backup runs keepalived without the instance, as before a migration
        SpeakerCluster.wait(lambda: holders() == [master], 15, "the master holds the VIP")
        mac = seg.hosts[backup].mac

        # The backup learns the instance by a reload, held: FAULT from its first moment
        hold.write_text("1\n")
        (tmp_path / f"ka{backup}.conf").write_text(k.render(plan(backup), f"n{backup + 1}"))
        t0 = time.time()
        os.killpg(procs[backup].pid, signal.SIGHUP)
        SpeakerCluster.wait(lambda: log_has(backup, f"({inst.name}) entering FAULT state"), 10,
                            "the reloaded backup's instance in FAULT")
        freeze_master(1.0)
        time.sleep(0.5)
        assert cap.gratuitous(VIP, mac, t0) == [], "a held backup announced the VIP"
        assert backup not in holders()

        # Released while the master advertises: BACKUP, and still silent
        SpeakerCluster.wait(lambda: holders() == [master], 10, "the master holds the VIP again")
        t1 = time.time()
        hold.write_text("0\n")
        SpeakerCluster.wait(lambda: log_has(backup, f"({inst.name}) Entering BACKUP STATE"), 10,
                            "the released instance in BACKUP")
        time.sleep(1.0)
        assert cap.gratuitous(VIP, mac, t1) == [], "a released backup claimed the VIP from a live master"
        assert holders() == [master]

        # The control: the same freeze of the master now makes the backup claim the VIP
        t2 = time.time()
        freeze_master(1.0)
        SpeakerCluster.wait(lambda: cap.gratuitous(VIP, mac, t2), 10, "the released backup's claim")
    finally:
        for p in procs.values():
            os.killpg(p.pid, signal.SIGCONT)
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=10)
        cap.proc.terminate()
        cap.proc.wait(timeout=5)
