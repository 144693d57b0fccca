"""labctl: a lab of systemd hosts in Linux namespaces, with faults and captures.

Each host is an overlay of one cached Debian image, booted with systemd as PID 1 in its
own PID, mount, network, UTS, IPC and cgroup namespaces (see ../../../docs/lab.md).
Hosts are wired with veth pairs into Linux bridges (one per segment) that live in a
private "fabric" network namespace, so lab traffic never reaches the machine's links.

Everything a lab creates is recorded under one state directory
(``/var/lib/nocloudlb-lab/<lab>/``) before it is created, so ``down`` (alias
``cleanup``) removes it all again, also after a crashed run, from that record alone.

Command line: ``labctl.py --help``. Python: ``Lab(name).up(topology)``, ``Lab(name).fault_*``,
``Lab(name).capture_start(...)``, ``read_events(pcap)``. Standard library only, plus
scapy for the capture reader and PyYAML to read topology files written in YAML.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import datetime
import errno
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

STATE_ROOT = Path(os.environ.get("NLAB_STATE_ROOT", "/var/lib/nocloudlb-lab"))
CACHE_ROOT = Path(os.environ.get("NLAB_CACHE_ROOT", "/var/cache/nocloudlb-lab"))
PREFIX = "nlab"
CG_MOUNT_ROOT = "/sys/fs/cgroup"
SOURCES_FILE = Path("/etc/apt/sources.list.d/debian.sources")

# Bump when the image recipe (customize_image) changes: it is part of the cache key.
IMAGE_RECIPE = "4"
BASE_PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "iproute2", "procps",
    "frr", "frr-pythontools", "keepalived", "arping", "tcpdump", "iputils-ping", "nftables",
    "curl", "ca-certificates", "netcat-openbsd", "less",
    "jq",  # the docs' journalctl | jq lines run on nodes (tests/install/own_hosts.py)
    "bird2",  # the router role's BIRD routers (molecule/bgp's r3)
]
# Units that have no job in a namespace host, or would touch the machine, or just add load.
MASKED_UNITS = [
    "systemd-udevd.service", "systemd-udevd-control.socket", "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service", "systemd-udev-settle.service", "systemd-networkd-wait-online.service",
    "getty@tty1.service", "console-getty.service", "getty-static.service", "serial-getty@.service",
    "systemd-sysctl.service", "systemd-modules-load.service", "kmod-static-nodes.service",
    "systemd-remount-fs.service", "systemd-random-seed.service", "systemd-firstboot.service",
    "apt-daily.timer", "apt-daily-upgrade.timer", "man-db.timer", "e2scrub_all.timer",
    "e2scrub_reap.service", "fstrim.timer", "dpkg-db-backup.timer", "systemd-tmpfiles-clean.timer",
    "sys-kernel-debug.mount", "sys-kernel-tracing.mount", "sys-kernel-config.mount",
    "sys-fs-fuse-connections.mount", "dev-hugepages.mount", "dev-mqueue.mount",
]
# Installed by the packages and enabled by them, but only wanted where a host asks for them.
DISABLED_BY_DEFAULT = ["frr.service", "keepalived.service", "ssh.service", "bird.service"]
# Every image has these packages and an ordinary user (SSH_USER, passwordless sudo), with sshd
# disabled: one image per release serves hosts with and without `ssh: true` (a second flavour
# would cost a debootstrap of minutes for two small packages). A host with `ssh: true` gets sshd
# enabled, its own host key, and the controller's key (one key pair per lab, under the lab's
# state directory). The controller reaches them from a
# namespace of the lab's own that is wired into the segments (controller_ns), never from the
# machine's network namespace.
SSH_PACKAGES = ["openssh-server", "sudo"]
SSH_USER = "operator"
# Releases whose systemd deprecates cgroup v1 (257 in trixie; 258 drops it): their hosts boot on
# the machine's unified (v2) hierarchy (see cgroup_hierarchies), whatever the other hosts use.
# (Checked here: trixie's systemd 257 also reached "running" on the v1 layout bookworm hosts get.)
CGROUP_V2_RELEASES = {"trixie", "forky", "sid"}

NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
HOST_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
SEGMENT_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
RELEASE_RE = re.compile(r"^[a-z]{2,20}$")

BOOT_SH = r"""#!/bin/sh
# PID 1 of a lab host until it execs systemd. Args: ROOT NAME CGROUP CONSOLE_FILE
set -eu
ROOT="$1"; NAME="$2"; CG="$3"; CONSOLE="$4"
# CG: the host's directory in the named systemd hierarchy (cgroup v1), or "v2" on a
# machine with only the unified hierarchy.
mount --make-rprivate /
hostname "$NAME"
mount --bind "$ROOT" "$ROOT"
mount -t proc -o nosuid,nodev,noexec proc "$ROOT/proc"
# /proc/sys read-only except net (which is this host's own), as systemd-nspawn does.
mount --bind "$ROOT/proc/sys" "$ROOT/proc/sys"
mount --bind "$ROOT/proc/sys/net" "$ROOT/proc/sys/net"
mount -o remount,bind,ro "$ROOT/proc/sys"
# A fresh sysfs, read-only, mounted inside the new netns: it shows this host's links only.
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$ROOT/sys"
if [ "$CG" = v2 ]; then
    # inside the cgroup namespace made at boot, this mount's root is the host's own directory
    mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$ROOT/sys/fs/cgroup"
else
    mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs "$ROOT/sys/fs/cgroup"
    mkdir "$ROOT/sys/fs/cgroup/systemd"
    mount --bind "$CG" "$ROOT/sys/fs/cgroup/systemd"
fi
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$ROOT/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$ROOT/tmp"
# A private /dev with the usual nodes; the console is a log file, not the machine's.
mount -t tmpfs -o mode=755,nosuid tmpfs "$ROOT/dev"
for d in null zero full random urandom tty; do
    touch "$ROOT/dev/$d"; mount --bind "/dev/$d" "$ROOT/dev/$d"
done
if [ -e /dev/net/tun ]; then
    mkdir "$ROOT/dev/net"; touch "$ROOT/dev/net/tun"; mount --bind /dev/net/tun "$ROOT/dev/net/tun"
fi
touch "$ROOT/dev/console"; mount --bind "$CONSOLE" "$ROOT/dev/console"
mkdir "$ROOT/dev/pts" "$ROOT/dev/shm" "$ROOT/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$ROOT/dev/pts"
ln -s pts/ptmx "$ROOT/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$ROOT/dev/shm"
mount -t mqueue -o nosuid,nodev,noexec mqueue "$ROOT/dev/mqueue"
ln -s /proc/self/fd "$ROOT/dev/fd"
for i in 0:stdin 1:stdout 2:stderr; do ln -s "/proc/self/fd/${i%%:*}" "$ROOT/dev/${i#*:}"; done
# pivot_root (not chroot), so that nsenter lands in this host's filesystem.
cd "$ROOT"
pivot_root . .
umount -l .
cd /
exec env -i container=nocloudlb-lab /lib/systemd/systemd --log-target=journal
"""


class LabError(Exception):
    """A lab operation failed; the message says what and where."""


# ---------------------------------------------------------------- small helpers


def now_iso(ts: float | None = None) -> str:
    ts = time.time() if ts is None else ts
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="microseconds")


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Any:
    """A preexec_fn: the child gets SIGKILL when the process that started it dies.

    A helper (ip, mount, ...) of a labctl killed mid-up would otherwise finish on its own
    after the kill, and could attach a namespace or mount an overlay after a cleanup had
    already looked for them.
    """
    parent = os.getpid()

    def preexec() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def run(cmd: list[str], *, check: bool = True, input: str | None = None, timeout: float | None = 60,
        capture: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a helper command to completion; it dies with this process (see _die_with_parent)."""
    try:
        res = subprocess.run(cmd, input=input, text=True, timeout=timeout, check=False,
                             stdout=subprocess.PIPE if capture else None,
                             stderr=subprocess.PIPE if capture else None, preexec_fn=_die_with_parent())
    except FileNotFoundError as exc:
        raise LabError(f"command not found: {cmd[0]}") from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"command timed out after {timeout}s: {' '.join(cmd)}") from exc
    if check and res.returncode != 0:
        err = (res.stderr or "").strip() or (res.stdout or "").strip()
        raise LabError(f"command failed (rc={res.returncode}): {' '.join(cmd)}: {err}")
    return res


def wait_for(pred: Callable[[], Any], timeout: float, step: float = 0.02) -> Any:
    """Ask ``pred`` every ``step`` s until it answers something true, or ``timeout`` s have passed:
    its last answer (for scripts that watch a lab, such as the molecule scenarios' verify)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def timed(pred: Callable[[], Any], timeout: float, step: float = 0.02) -> float | None:
    """Seconds until ``pred`` answered something true (``wait_for``), None when it never did."""
    t0 = time.monotonic()
    return time.monotonic() - t0 if wait_for(pred, timeout, step) else None


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def proc_start_time(pid: int) -> int | None:
    """The process' start time in clock ticks since boot, or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm may contain spaces and parentheses; fields after the last ')' are fixed.
    return int(stat.rsplit(")", 1)[1].split()[19])


def pid_alive(pid: int | None, start: int | None) -> bool:
    """True if pid runs and is the same process that was recorded (guards against PID reuse)."""
    if not pid:
        return False
    st = proc_start_time(pid)
    if st is None:
        return False
    if start is not None and st != start:
        return False
    # a zombie is not alive
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def mountpoints() -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4]
        out.append(mp.encode().decode("unicode_escape"))
    return out


def mounts_under(path: Path) -> list[str]:
    base = str(path.resolve())
    return [m for m in mountpoints() if m == base or m.startswith(base + "/")]


def safe_rmtree(path: Path) -> None:
    """Remove a tree, after detaching every mount below it; refuse if a mount is left."""
    if not path.exists():
        return
    for mp in sorted(mounts_under(path), key=len, reverse=True):
        run(["umount", "-l", mp], check=False)
    left = mounts_under(path)
    if left:
        raise LabError(f"refusing to remove {path}: still mounted: {left}")
    shutil.rmtree(path)


def mac_for(*parts: str) -> str:
    digest = hashlib.sha256("/".join(parts).encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in digest[:5])


# ---------------------------------------------------------------- base image


def machine_release() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    raise LabError("/etc/os-release has no VERSION_CODENAME: cannot tell which Debian release to bootstrap")


def debian_mirror(release: str, sources: Path = SOURCES_FILE, fallback: str | None = None) -> str:
    """The URIs: of the stanza in a deb822 sources file whose Suites include the release itself.

    With fallback (a release, normally the machine's own), a release the file does not name
    (trixie on a bookworm machine) is fetched from the mirror that serves the fallback.
    """
    if not sources.exists():
        raise LabError(f"{sources} not found: pass --mirror")
    for want in (release, fallback):
        if not want:
            continue
        for stanza in sources.read_text().split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith((" ", "#")):
                    key, val = line.split(":", 1)
                    fields[key.strip()] = val.strip()
            if want in fields.get("Suites", "").split() and fields.get("URIs"):
                return fields["URIs"].split()[0]
    raise LabError(f"{sources} has no stanza with Suites: {release}: pass --mirror")


def image_packages(extra: Iterable[str] = ()) -> list[str]:
    return sorted(set(BASE_PACKAGES) | set(extra) | set(SSH_PACKAGES))


def image_key(release: str, mirror: str, packages: list[str]) -> str:
    blob = json.dumps({"release": release, "mirror": mirror, "packages": packages, "recipe": IMAGE_RECIPE},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def customize_image(root: Path) -> None:
    etc = root / "etc"
    sysd = etc / "systemd" / "system"
    for unit in MASKED_UNITS:
        link = sysd / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
    for unit in DISABLED_BY_DEFAULT:
        for wants in sysd.glob("*.wants"):
            if (wants / unit).is_symlink():
                (wants / unit).unlink()
    jd = etc / "systemd" / "journald.conf.d"
    jd.mkdir(parents=True, exist_ok=True)
    (jd / "nocloudlb-lab.conf").write_text("[Journal]\nStorage=volatile\nRuntimeMaxUse=16M\nForwardToConsole=no\n")
    (etc / "machine-id").write_text("")
    for p in (root / "var/cache/apt/archives").glob("*.deb"):
        p.unlink()
    customize_ssh_image(root)


def customize_ssh_image(root: Path) -> None:
    """sshd for the hosts that enable it: no shared host keys (each host gets its own), SSH_USER with
    passwordless sudo."""
    etc = root / "etc"
    for key in (etc / "ssh").glob("ssh_host_*"):
        key.unlink()
    (etc / "ssh" / "sshd_config.d").mkdir(parents=True, exist_ok=True)
    (etc / "ssh" / "sshd_config.d" / "nocloudlb-lab.conf").write_text(
        "# nocloudlb lab: keys only, the host's own key (seeded per host by labctl)\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin no\nUseDNS no\n")
    # Debian has a system group "operator" (base-passwd, gid 37): the user's primary group is "users"
    run(["chroot", str(root), "useradd", "--create-home", "--shell", "/bin/bash", "--no-user-group", "--gid", "users",
         SSH_USER])
    run(["chroot", str(root), "usermod", "--password", "*", SSH_USER])  # no password, but not locked
    sudoers = etc / "sudoers.d" / "nocloudlb-lab"
    sudoers.write_text(f"{SSH_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    sudoers.chmod(0o440)


# Every lab host's systemd (and its units) takes inotify instances, all counted against root:
# the kernel's default of 128 runs out at about a dozen hosts across the labs of one machine
# (seen here: hosts of a ten-host lab failed to boot). Raising a limit changes nothing else.
INOTIFY_MIN_INSTANCES = 1024


def ensure_inotify_instances(log: Any = None) -> None:
    """Raise fs.inotify.max_user_instances to INOTIFY_MIN_INSTANCES if it is lower (never lowers it)."""
    path = Path("/proc/sys/fs/inotify/max_user_instances")
    try:
        current = int(path.read_text().strip())
        if current < INOTIFY_MIN_INSTANCES:
            path.write_text(f"{INOTIFY_MIN_INSTANCES}\n")
            if log:
                log(f"fs.inotify.max_user_instances raised from {current} to {INOTIFY_MIN_INSTANCES} "
                    "(each lab host's systemd needs several)")
    except (OSError, ValueError):
        pass  # not ours to fix: hosts that fail to boot are reported by up as usual


def ensure_image(extra_packages: Iterable[str] = (), release: str | None = None, mirror: str | None = None,
                 log: Any = None) -> tuple[Path, bool]:
    """Return (path, built): the cached base image for this release and package list, built if missing.

    release defaults to the machine's own. Every image has sshd (disabled) and SSH_USER.

    Built in a temporary directory and renamed into place at the end, under a lock, so a
    crashed build leaves no half image (its leftovers are removed by the next build).
    """
    release = release or machine_release()
    mirror = mirror or debian_mirror(release, fallback=machine_release())
    packages = image_packages(extra_packages)
    key = image_key(release, mirror, packages)
    final = CACHE_ROOT / f"base-{release}-{key}"
    marker = final / "etc" / "nocloudlb-lab-image.json"
    if marker.exists():
        return final, False
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with flock(CACHE_ROOT / ".lock"):
        if marker.exists():
            return final, False
        for stale in CACHE_ROOT.glob(".build-*"):
            safe_rmtree(stale)
        if final.exists():  # a directory without marker cannot come from us finishing; drop it
            safe_rmtree(final)
        build = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=CACHE_ROOT))
        rootfs = build / "rootfs"
        if log:
            log(f"building base image {final.name} ({len(packages)} packages) from {mirror}")
        t0 = time.monotonic()
        try:
            run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", release, str(rootfs), mirror],
                timeout=1800)
            customize_image(rootfs)
            (rootfs / "etc" / "nocloudlb-lab-image.json").write_text(json.dumps(
                {"release": release, "mirror": mirror, "packages": packages, "recipe": IMAGE_RECIPE,
                 "built": now_iso(), "seconds": round(time.monotonic() - t0, 1)}, indent=1))
            if mounts_under(rootfs):
                raise LabError(f"debootstrap left mounts under {rootfs}: {mounts_under(rootfs)}")
            os.rename(rootfs, final)
        finally:
            safe_rmtree(build)
    return final, True


def prune_images(keep: Iterable[Path] = ()) -> list[str]:
    """Remove cached base images that no lab under STATE_ROOT uses and that are not in keep."""
    used = {str(Path(k)) for k in keep}
    for sf in STATE_ROOT.glob("*/state.json"):
        with contextlib.suppress(ValueError, OSError):
            sd = json.loads(sf.read_text())
            used.add(sd.get("image", ""))
            used.update(sd.get("images", {}).values())
    removed = []
    with flock(CACHE_ROOT / ".lock"):
        for img in CACHE_ROOT.glob("base-*"):
            if str(img) not in used:
                safe_rmtree(img)
                removed.append(str(img))
    return removed


# ---------------------------------------------------------------- topology


def load_topology(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    """Read and validate a topology (a dict, or a YAML/JSON file); returns the normalised form."""
    if isinstance(source, dict):
        data = copy.deepcopy(source)
        where = "topology"
    else:
        path = Path(source)
        if not path.exists():
            raise LabError(f"topology file not found: {path}")
        text = path.read_text()
        where = str(path)
        try:
            data = json.loads(text)
        except ValueError:
            import yaml  # PyYAML; only needed for YAML files

            data = yaml.safe_load(text)
    return validate_topology(data, where)


def _err(where: str, field: str, value: Any, why: str) -> LabError:
    return LabError(f"{where}: {field}: {why} (got {value!r})")


def validate_topology(data: Any, where: str = "topology") -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _err(where, "(top level)", type(data).__name__, "must be a mapping")
    if data.get("normalized") is True:  # already the output of this function
        return data
    unknown = set(data) - {"name", "segments", "hosts", "extra_packages"}
    if unknown:
        raise _err(where, "(top level)", sorted(unknown),
                   "unknown keys; allowed: name, segments, hosts, extra_packages")
    name = data.get("name", "lab")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _err(where, "name", name, "must match [a-z][a-z0-9]{0,9}")
    segs = data.get("segments")
    if not isinstance(segs, dict) or not segs:
        raise _err(where, "segments", segs, "must be a non-empty mapping of segment name to settings")
    segments: dict[str, dict[str, Any]] = {}
    for sname, sval in segs.items():
        if not isinstance(sname, str) or not SEGMENT_RE.match(sname):
            raise _err(where, "segments", sname, "segment names must match [a-z][a-z0-9]{0,11}")
        sval = sval or {}
        if not isinstance(sval, dict) or set(sval) - {"mtu"}:
            raise _err(where, f"segments.{sname}", sval, "settings may only contain mtu")
        mtu = sval.get("mtu", 1500)
        if not isinstance(mtu, int) or not 576 <= mtu <= 9000:
            raise _err(where, f"segments.{sname}.mtu", mtu, "must be an integer 576..9000")
        segments[sname] = {"mtu": mtu}
    hosts_in = data.get("hosts")
    if not isinstance(hosts_in, dict) or not hosts_in:
        raise _err(where, "hosts", hosts_in, "must be a non-empty mapping of host name to settings")
    hosts: dict[str, dict[str, Any]] = {}
    seen_addr: dict[str, str] = {}
    for hname, hval in hosts_in.items():
        f = f"hosts.{hname}"
        if not isinstance(hname, str) or not HOST_RE.match(hname):
            raise _err(where, "hosts", hname, "host names must match [a-z][a-z0-9]{0,9}")
        if not isinstance(hval, dict):
            raise _err(where, f, hval, "must be a mapping")
        unknown = set(hval) - {"groups", "interfaces", "routes", "forwarding", "services", "vars", "release", "ssh"}
        if unknown:
            raise _err(where, f, sorted(unknown),
                       "unknown keys; allowed: groups, interfaces, routes, forwarding, services, vars, release, ssh")
        groups = hval.get("groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) and re.match(r"^[a-z_][a-z0-9_]*$", g)
                                                   for g in groups):
            raise _err(where, f"{f}.groups", groups, "must be a list of group names ([a-z_][a-z0-9_]*)")
        ifaces_in = hval.get("interfaces")
        if not isinstance(ifaces_in, list) or not ifaces_in:
            raise _err(where, f"{f}.interfaces", ifaces_in, "must be a non-empty list")
        ifaces = []
        nets: list[ipaddress.IPv4Interface | ipaddress.IPv6Interface] = []
        for i, iv in enumerate(ifaces_in):
            fi = f"{f}.interfaces[{i}]"
            if not isinstance(iv, dict) or set(iv) - {"segment", "addresses"}:
                raise _err(where, fi, iv, "must be a mapping with segment and addresses")
            seg = iv.get("segment")
            if seg not in segments:
                raise _err(where, f"{fi}.segment", seg, f"not a declared segment ({', '.join(segments)})")
            addrs = []
            for a in iv.get("addresses", []) or []:
                try:
                    ifa = ipaddress.ip_interface(a)
                except ValueError as exc:
                    raise _err(where, f"{fi}.addresses", a, f"not an address with prefix: {exc}") from None
                if ifa.network.prefixlen == ifa.max_prefixlen and "/" not in str(a):
                    raise _err(where, f"{fi}.addresses", a, "needs a prefix length, e.g. 198.51.100.11/24")
                if str(ifa.ip) in seen_addr:
                    raise _err(where, f"{fi}.addresses", a, f"address already used by {seen_addr[str(ifa.ip)]}")
                seen_addr[str(ifa.ip)] = hname
                addrs.append(str(ifa))
                nets.append(ifa)
            ifaces.append({"name": f"eth{i}", "segment": seg, "addresses": addrs, "mac": mac_for(hname, str(i)),
                           "port": f"{hname}-e{i}"})
        routes = []
        for j, rv in enumerate(hval.get("routes", []) or []):
            fr = f"{f}.routes[{j}]"
            if not isinstance(rv, dict) or set(rv) != {"to", "via"}:
                raise _err(where, fr, rv, "must be a mapping with exactly to and via")
            try:
                via = ipaddress.ip_address(rv["via"])
            except ValueError:
                raise _err(where, f"{fr}.via", rv["via"], "not an IP address") from None
            to = rv["to"]
            if to != "default":
                try:
                    net = ipaddress.ip_network(to)
                except ValueError:
                    raise _err(where, f"{fr}.to", to, "not a network (or 'default')") from None
                if net.version != via.version:
                    raise _err(where, f"{fr}.via", rv["via"], f"address family differs from to={to}")
            if not any(n.version == via.version and via in n.network for n in nets):
                raise _err(where, f"{fr}.via", rv["via"], "not on any subnet of this host's interfaces")
            routes.append({"to": str(to), "via": str(via)})
        fwd = hval.get("forwarding", False)
        if not isinstance(fwd, bool):
            raise _err(where, f"{f}.forwarding", fwd, "must be true or false")
        services = hval.get("services", []) or []
        if not isinstance(services, list) or not all(isinstance(s, str) and re.match(r"^[A-Za-z0-9@_.-]+$", s)
                                                     for s in services):
            raise _err(where, f"{f}.services", services, "must be a list of unit names to enable, e.g. [frr]")
        hvars = hval.get("vars", {}) or {}
        if not isinstance(hvars, dict):
            raise _err(where, f"{f}.vars", hvars, "must be a mapping of extra inventory variables")
        hosts[hname] = {"groups": groups, "interfaces": ifaces, "routes": routes, "forwarding": fwd,
                        "services": services, "vars": hvars}
        # release and ssh are recorded only when given, so existing topologies normalise (and hash) as before
        if "release" in hval:
            rel = hval["release"]
            if not isinstance(rel, str) or not RELEASE_RE.match(rel):
                raise _err(where, f"{f}.release", rel, "must be a Debian codename, e.g. bookworm or trixie")
            hosts[hname]["release"] = rel
        if "ssh" in hval:
            if not isinstance(hval["ssh"], bool):
                raise _err(where, f"{f}.ssh", hval["ssh"], "must be true or false")
            if hval["ssh"]:
                if not any(":" not in a for i in ifaces for a in i["addresses"]):
                    raise _err(where, f"{f}.ssh", True, "needs an IPv4 address on one of the host's interfaces")
                hosts[hname]["ssh"] = True
    extra = data.get("extra_packages", []) or []
    if not isinstance(extra, list) or not all(isinstance(p, str) and re.match(r"^[a-z0-9][a-z0-9+.-]+$", p)
                                              for p in extra):
        raise _err(where, "extra_packages", extra, "must be a list of Debian package names")
    return {"name": name, "segments": segments, "hosts": hosts, "extra_packages": sorted(extra), "normalized": True}


def topology_hash(topo: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(topo, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the lab


class Lab:
    """One lab, identified by name; all of its state lives in ``STATE_ROOT/<name>``."""

    def __init__(self, name: str, state_root: Path | None = None):
        if not NAME_RE.match(name):
            raise LabError(f"lab name: must match [a-z][a-z0-9]{{0,9}} (got {name!r})")
        self.name = name
        self.dir = (state_root or STATE_ROOT) / name
        self.state_file = self.dir / "state.json"
        self.fault_log = self.dir / "faults.jsonl"
        self.inventory_file = self.dir / "inventory.yml"

    # -- names
    @property
    def fabric_ns(self) -> str:
        return f"{PREFIX}-{self.name}-fabric"

    def host_ns(self, host: str) -> str:
        return f"{PREFIX}-{self.name}-{host}"

    @property
    def controller_ns(self) -> str:
        """The namespace from which the controller reaches ssh hosts (a hyphen: never a host's)."""
        return f"{PREFIX}-{self.name}-ssh-ctl"

    @property
    def ssh_dir(self) -> Path:
        return self.dir / "ssh"

    @property
    def ssh_key(self) -> Path:
        """The controller's private key for SSH_USER on the lab's ssh hosts."""
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def ssh_inventory_file(self) -> Path:
        return self.dir / "ssh-inventory.yml"

    @staticmethod
    def host_image(st: dict[str, Any], host: str) -> Path:
        return Path(st.get("images", {}).get(host, st["image"]))

    def cgroup_name(self, host: str) -> str:
        return f"{PREFIX}-{self.name}-{host}"

    def cgroup_dirs(self, host: str) -> dict[str, Path]:
        """The host's cgroup directories, one per hierarchy (systemd, freezer, memory, ..., unified)."""
        st = self.load_state() or {}
        rec = st.get("hosts", {}).get(host, {})
        if not rec.get("cgroups"):
            raise LabError(f"host {host!r} of lab {self.name!r} has no cgroups recorded (is it up?)")
        return {k: Path(v) for k, v in rec["cgroups"].items()}

    def host_dir(self, host: str) -> Path:
        return self.dir / "hosts" / host

    # -- state
    def load_state(self) -> dict[str, Any] | None:
        if not self.state_file.exists():
            return None
        return json.loads(self.state_file.read_text())

    def save_state(self, state: dict[str, Any]) -> None:
        write_atomic(self.state_file, json.dumps(state, indent=1, sort_keys=True))

    def _lock(self) -> contextlib.AbstractContextManager[None]:
        return flock(self.dir.parent / f".{self.name}.lock")

    def state(self) -> dict[str, Any]:
        st = self.load_state()
        if not st or "topology" not in st:
            raise LabError(f"lab {self.name!r} is not up (no {self.state_file})")
        return st

    def hosts(self) -> list[str]:
        return list(self.state()["topology"]["hosts"])

    def pid(self, host: str) -> int:
        """The machine-level PID of the host's PID 1 (what nsenter and ansible_nsenter_pid take)."""
        st = self.state()
        h = st["hosts"].get(host)
        if h is None:
            raise LabError(f"host {host!r} is not in lab {self.name!r} (hosts: {', '.join(st['topology']['hosts'])})")
        if not pid_alive(h.get("pid"), h.get("pid_start")):
            raise LabError(f"host {host!r} of lab {self.name!r} is not running")
        return int(h["pid"])

    # -- up
    def up(self, topology: dict[str, Any] | str | Path, *, wait: bool = True, timeout: float = 120,
           log: Any = None) -> dict[str, Any]:
        topo = load_topology(topology)
        topo["name"] = self.name
        t0 = time.monotonic()
        # one image per release the hosts ask for; most topologies need just the default
        flavours: dict[str | None, Path] = {}
        built = False
        host_images: dict[str, str] = {}
        for host, hv in topo["hosts"].items():
            fl = hv.get("release")
            if fl not in flavours:
                flavours[fl], b = ensure_image(topo["extra_packages"], release=fl, log=log)
                built |= b
            host_images[host] = str(flavours[fl])
        image = flavours.get(None) or Path(next(iter(host_images.values())))
        ssh_hosts = [h for h, hv in topo["hosts"].items() if hv.get("ssh")]
        ensure_inotify_instances(log)
        with self._lock():
            st = self.load_state()
            thash = topology_hash(topo)
            if st and st.get("topology_hash") not in (None, thash):
                raise LabError(f"lab {self.name!r} is up with a different topology; run down first")
            changed = built
            if not st:
                st = {"name": self.name, "created": now_iso(), "hosts": {}, "fabric_ns": self.fabric_ns,
                      "captures": {}, "faults": {}}
                changed = True
            st.update({"topology": topo, "topology_hash": thash, "image": str(image)})
            if any(v != str(image) for v in host_images.values()):
                st["images"] = host_images
            if ssh_hosts:
                st["controller_ns"] = self.controller_ns  # recorded before it is made
            self.dir.mkdir(parents=True, exist_ok=True)
            self.save_state(st)
            changed |= self._ensure_fabric(topo)
            if ssh_hosts:
                changed |= self._ensure_ssh_key()
            booted = []
            for host in topo["hosts"]:
                h = st["hosts"].get(host, {})
                if pid_alive(h.get("pid"), h.get("pid_start")):
                    if not netns_handle_ok(self.host_ns(host), h["pid"]):  # a crash right after boot
                        replace_netns_handle(self.host_ns(host), h["pid"])
                        changed = True
                    continue
                self._boot_host(st, host)
                booted.append(host)
                changed = True
            for host in topo["hosts"]:  # also repairs links of hosts that survived a crashed run
                changed |= self._wire_host(st, host)
            changed |= self._write_inventory(st)
            if ssh_hosts:
                changed |= self._ensure_controller(st)
                changed |= self._write_ssh_inventory(st)
        result: dict[str, Any] = {"changed": changed, "lab": self.name, "booted": booted,
                                  "inventory": str(self.inventory_file), "image": str(image), "image_built": built}
        if ssh_hosts:
            result.update({"ssh_inventory": str(self.ssh_inventory_file), "controller_ns": self.controller_ns,
                           "images": host_images})
        if wait:
            result["system_state"] = self.wait_running(timeout=timeout)
        result["seconds"] = round(time.monotonic() - t0, 2)
        return result

    def _ensure_fabric(self, topo: dict[str, Any]) -> bool:
        ns = self.fabric_ns
        changed = False
        if not netns_handle_ok(ns):  # missing, or left half-made by a crashed run
            replace_netns_handle(ns)
            changed = True
            for key in ("net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"):
                run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}=1"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
        links = ip_links(ns)
        for seg, sval in topo["segments"].items():
            br = f"br-{seg}"
            if br not in links:
                run(["ip", "-n", ns, "link", "add", br, "mtu", str(sval["mtu"]), "type", "bridge",
                     "mcast_snooping", "0", "stp_state", "0", "forward_delay", "0"])
                run(["ip", "-n", ns, "link", "set", br, "up"])
                changed = True
        return changed

    def _seed_host_files(self, st: dict[str, Any], host: str, upper: Path) -> None:
        topo = st["topology"]
        h = topo["hosts"][host]
        etc = upper / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hostname").write_text(host + "\n")
        if not (etc / "machine-id").exists():
            (etc / "machine-id").write_text(uuid.uuid4().hex + "\n")
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback", f"127.0.1.1 {host}"]
        for other, ov in topo["hosts"].items():
            for iface in ov["interfaces"]:
                for a in iface["addresses"]:
                    lines.append(f"{a.split('/')[0]} {other}-{iface['name']} {other}")
        (etc / "hosts").write_text("\n".join(lines) + "\n")
        wants = etc / "systemd" / "system" / "multi-user.target.wants"
        for svc in h["services"]:
            unit = svc if "." in svc else f"{svc}.service"
            wants.mkdir(parents=True, exist_ok=True)
            link = wants / unit
            if not link.is_symlink():
                link.symlink_to(f"/lib/systemd/system/{unit}")
            if unit == "frr.service":
                base = self.host_image(st, host) / "etc" / "frr" / "daemons"
                daemons = base.read_text()
                for d in ("bgpd", "bfdd"):
                    daemons = re.sub(rf"^{d}=no", f"{d}=yes", daemons, flags=re.M)
                (etc / "frr").mkdir(exist_ok=True)
                (etc / "frr" / "daemons").write_text(daemons)
        if h.get("ssh"):
            self._seed_ssh_files(st, host, upper)

    def _ensure_ssh_key(self) -> bool:
        """The controller's key pair for the lab's ssh hosts (made once per lab)."""
        if self.ssh_key.exists() and self.ssh_key.with_suffix(".pub").exists():
            return False
        self.ssh_dir.mkdir(parents=True, exist_ok=True)
        self.ssh_key.unlink(missing_ok=True)
        self.ssh_key.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"nocloudlb-lab-{self.name}", "-f",
             str(self.ssh_key)])
        return True

    def _seed_ssh_files(self, st: dict[str, Any], host: str, upper: Path) -> None:
        """sshd enabled, the host's own ssh host key, and the controller's key in SSH_USER's authorized_keys."""
        image = self.host_image(st, host)
        wants = upper / "etc" / "systemd" / "system" / "multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        if not (wants / "ssh.service").is_symlink():
            (wants / "ssh.service").symlink_to("/lib/systemd/system/ssh.service")
        hostkey = upper / "etc" / "ssh" / "ssh_host_ed25519_key"
        if not hostkey.exists():
            hostkey.parent.mkdir(parents=True, exist_ok=True)
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host}", "-f", str(hostkey)])
        pw = next(ln.split(":") for ln in (image / "etc" / "passwd").read_text().splitlines()
                  if ln.startswith(SSH_USER + ":"))
        uid, gid, home = int(pw[2]), int(pw[3]), pw[5].lstrip("/")
        # directories made in the upper layer give the merged directory their owner and mode: copy the image's
        parts = Path(home).parts + (".ssh",)
        for i in range(1, len(parts) + 1):
            rel = Path(*parts[:i])
            d = upper / rel
            if not d.exists():
                d.mkdir()
                lower = image / rel
                if lower.exists():
                    ls = lower.stat()
                    os.chown(d, ls.st_uid, ls.st_gid)
                    d.chmod(ls.st_mode & 0o7777)
                else:
                    os.chown(d, uid, gid)
                    d.chmod(0o700)
        ak = upper / home / ".ssh" / "authorized_keys"
        ak.write_text(self.ssh_key.with_suffix(".pub").read_text())
        os.chown(ak, uid, gid)
        ak.chmod(0o600)

    def _boot_host(self, st: dict[str, Any], host: str) -> None:
        self._stop_host(st, host)  # leftovers of a dead run of this host, if any
        boot_sh = self.dir / "boot.sh"
        if not boot_sh.exists() or boot_sh.read_text() != BOOT_SH:
            write_atomic(boot_sh, BOOT_SH)
        hd = self.host_dir(host)
        upper, work, root = hd / "upper", hd / "work", hd / "root"
        for d in (upper, work, root):
            d.mkdir(parents=True, exist_ok=True)
        # One directory per cgroup hierarchy, below this process' own cgroup there. With the
        # cgroup namespace made at boot, the host's systemd sees these as its roots, so the
        # hierarchies it mounts and the unit cgroups it creates stay inside them.
        v2 = st["topology"]["hosts"][host].get("release") in CGROUP_V2_RELEASES
        cgs = {k: mnt / own.lstrip("/") / self.cgroup_name(host)
               for k, (mnt, own) in cgroup_hierarchies(v2=v2).items()}
        rec = st["hosts"].setdefault(host, {})
        rec.update({"overlay": str(root), "cgroups": {k: str(v) for k, v in cgs.items()}, "netns": self.host_ns(host),
                    "pid": None, "pid_start": None, "launcher": None, "launcher_start": None})
        self.save_state(st)  # record before creating
        self._seed_host_files(st, host, upper)
        if str(root.resolve()) not in mountpoints():
            run(["mount", "-t", "overlay", "overlay", "-o",
                 f"lowerdir={self.host_image(st, host)},upperdir={upper},workdir={work}", str(root)])
        for k, d in cgs.items():
            d.mkdir(exist_ok=True)
            if k == "cpuset":  # a new cpuset has no CPUs or memory nodes until given some
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((d.parent / f).read_text())
        set_frozen(cgs, False)
        console = hd / "console.log"
        console.touch()
        procs_files = [str(d / "cgroup.procs") for d in cgs.values()]

        def join_cgroups() -> None:
            for f in procs_files:
                with open(f, "w") as fh:
                    fh.write(str(os.getpid()))

        with open(console, "ab") as out:
            proc = subprocess.Popen(
                ["unshare", "--fork", "--pid", "--mount", "--net", "--uts", "--ipc", "--cgroup",
                 "sh", str(self.dir / "boot.sh"), str(root), host, str(cgs.get("systemd", "v2")), str(console)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, preexec_fn=join_cgroups,
                start_new_session=True, close_fds=True)
        rec["launcher"], rec["launcher_start"] = proc.pid, proc_start_time(proc.pid)
        self.save_state(st)
        deadline = time.monotonic() + 10
        child = None
        while time.monotonic() < deadline and child is None:
            for p in cgroup_pids(main_cgroup(cgs)):
                # the host's PID 1 is unshare's forked child; boot.sh's short-lived helpers are in the
                # cgroup too, and after the kernel's PIDs wrap (pid_max 32768 here) one may be listed
                # first: taking it gave a PID that was gone a moment later (netns attach failed)
                if p != proc.pid and parent_pid(p) == proc.pid:
                    child = p
                    break
            else:
                if proc.poll() is not None:
                    raise LabError(f"host {host}: launcher exited with {proc.returncode}; see {console}")
                time.sleep(0.02)
        if child is None:
            raise LabError(f"host {host}: no PID 1 appeared within 10 s; see {console}")
        rec["pid"], rec["pid_start"] = child, proc_start_time(child)
        rec["booted_at"] = now_iso()
        self.save_state(st)
        replace_netns_handle(self.host_ns(host), child)

    def _wire_host(self, st: dict[str, Any], host: str) -> bool:
        """Connect the host's interfaces to their segments and configure them; idempotent.

        Returns True if a link had to be created (first boot, or repair after a crash).
        """
        topo = st["topology"]
        h = topo["hosts"][host]
        fab, hns = self.fabric_ns, self.host_ns(host)
        sysctls = ["net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
                   "net.ipv6.conf.all.accept_ra=0", "net.ipv6.conf.default.accept_ra=0"]
        if h["forwarding"]:
            sysctls += ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"]
        run(["ip", "netns", "exec", hns, "sysctl", "-qw", *sysctls])
        fab_links = {li["ifname"]: li for li in json.loads(run(["ip", "-n", fab, "-j", "link", "show"]).stdout)}
        host_links = set(ip_links(hns))
        created = False
        batch_fab, batch_host = [], ["link set lo up"]
        for iface in h["interfaces"]:
            mtu = topo["segments"][iface["segment"]]["mtu"]
            if iface["port"] in fab_links and iface["name"] not in host_links:
                # the port's peer is not in this host's namespace: the pair of a namespace that is
                # gone (restart: the kernel removes the old one's links asynchronously after
                # `ip netns del`) or elsewhere. Remove it now rather than race that, and make a new pair.
                self._remove_port(fab, iface["port"])
                del fab_links[iface["port"]]
            if iface["port"] not in fab_links:
                if iface["name"] in host_links:  # half of a pair from an interrupted run
                    run(["ip", "-n", hns, "link", "del", iface["name"]])
                run(["ip", "-n", fab, "link", "add", iface["port"], "mtu", str(mtu), "type", "veth", "peer", "name",
                     iface["name"], "address", iface["mac"], "mtu", str(mtu), "netns", hns])
                created = True
            if iface["port"] not in fab_links or fab_links[iface["port"]].get("master") != f"br-{iface['segment']}":
                # only for new or unfinished ports: a port taken down by a fault stays down
                batch_fab += [f"link set {iface['port']} master br-{iface['segment']}",
                              f"link set {iface['port']} up"]
            batch_host.append(f"link set {iface['name']} up")
            for a in iface["addresses"]:
                batch_host.append(f"addr replace {a} dev {iface['name']}" + (" nodad" if ":" in a else ""))
        for r in h["routes"]:
            to = r["to"] if r["to"] != "default" else ("::/0" if ":" in r["via"] else "0.0.0.0/0")
            batch_host.append(f"route replace {to} via {r['via']}")
        if batch_fab:
            run(["ip", "-n", fab, "-b", "-"], input="\n".join(batch_fab) + "\n")
        run(["ip", "-n", hns, "-b", "-"], input="\n".join(batch_host) + "\n")
        return created

    @staticmethod
    def _remove_port(fab: str, port: str, timeout: float = 10.0) -> None:
        """Delete a switch port (and so its veth peer), also while the kernel is deleting it itself."""
        deadline = time.monotonic() + timeout
        while port in ip_links(fab):
            run(["ip", "-n", fab, "link", "del", port], check=False)  # fails when the kernel got there first
            if port not in ip_links(fab):
                return
            if time.monotonic() > deadline:
                raise LabError(f"switch port {port} in {fab} still there {timeout:.0f} s after deleting it")
            time.sleep(0.1)

    def ssh_address(self, host: str, st: dict[str, Any] | None = None) -> str:
        """The IPv4 address the controller namespace reaches host's sshd at (its first one)."""
        h = (st or self.state())["topology"]["hosts"][host]
        return next(a.split("/")[0] for i in h["interfaces"] for a in i["addresses"] if ":" not in a)

    def controller_links(self, st: dict[str, Any]) -> list[dict[str, str]]:
        """One link per segment that an ssh host reaches, with the controller's address there.

        The address is the highest of the subnet of the first ssh host's address on that
        segment that no host uses (198.51.100.254/24 for 198.51.100.0/24).
        """
        topo = st["topology"]
        used = {a.split("/")[0] for h in topo["hosts"].values() for i in h["interfaces"] for a in i["addresses"]}
        out: list[dict[str, str]] = []
        for seg in topo["segments"]:
            nets = [ipaddress.ip_interface(a).network for h in topo["hosts"].values() if h.get("ssh")
                    for i in h["interfaces"] if i["segment"] == seg for a in i["addresses"] if ":" not in a]
            if not nets:
                continue
            net = nets[0]
            free = next((ip for ip in reversed(list(net.hosts())) if str(ip) not in used), None)
            if free is None:
                raise LabError(f"segment {seg}: no free address in {net} for the ssh controller")
            n = len(out)
            out.append({"segment": seg, "port": f"ctl-{n}", "name": f"eth{n}",
                        "address": f"{free}/{net.prefixlen}"})
        return out

    def _ensure_controller(self, st: dict[str, Any]) -> bool:
        """The controller namespace: lo and one veth per segment with ssh hosts, IPv4 only, no routes.

        Nothing in it forwards (a new namespace has forwarding off) and it has no link to the
        machine: commands run in it (controller_cmd) reach the lab's segments and nothing else.
        """
        ns, fab = self.controller_ns, self.fabric_ns
        changed = False
        if not netns_handle_ok(ns):
            replace_netns_handle(ns)
            run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                 "net.ipv6.conf.default.disable_ipv6=1"])
            changed = True
        fab_links = set(ip_links(fab))
        ns_links = set(ip_links(ns))
        batch = ["link set lo up"]
        for li in self.controller_links(st):
            if li["port"] not in fab_links or li["name"] not in ns_links:
                if li["port"] in fab_links:
                    self._remove_port(fab, li["port"])
                if li["name"] in ns_links:
                    run(["ip", "-n", ns, "link", "del", li["name"]])
                run(["ip", "-n", fab, "link", "add", li["port"], "type", "veth", "peer", "name", li["name"],
                     "address", mac_for("ssh-ctl", li["segment"]), "netns", ns])
                run(["ip", "-n", fab, "link", "set", li["port"], "master", f"br-{li['segment']}", "up"])
                changed = True
            batch += [f"link set {li['name']} up", f"addr replace {li['address']} dev {li['name']}"]
        run(["ip", "-n", ns, "-b", "-"], input="\n".join(batch) + "\n")
        return changed

    def controller_cmd(self, cmd: list[str], user: str | None = None) -> list[str]:
        """cmd run in the controller namespace (as root, or as user through runuser)."""
        return ["ip", "netns", "exec", self.controller_ns, *(["runuser", "-u", user, "--"] if user else []), *cmd]

    def _write_ssh_inventory(self, st: dict[str, Any]) -> bool:
        """An inventory of the ssh hosts as Ansible reaches real machines: ssh as SSH_USER, become with sudo.

        Use it from the controller namespace (controller_cmd); known_hosts pins each host's own key.
        """
        topo = st["topology"]
        lines = []
        hostvars: dict[str, Any] = {}
        groups: dict[str, dict[str, Any]] = {}
        for host, h in topo["hosts"].items():
            if not h.get("ssh"):
                continue
            addr = self.ssh_address(host, st)
            pub = (self.host_dir(host) / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"{addr} {pub[0]} {pub[1]}")
            hostvars[host] = {"ansible_host": addr, "lab_release": h.get("release") or machine_release(),
                              "lab_groups": h["groups"], **h["vars"]}
            for g in h["groups"]:
                groups.setdefault(g, {"hosts": {}})["hosts"][host] = None
        kh = "\n".join(lines) + "\n"
        if not self.known_hosts.exists() or self.known_hosts.read_text() != kh:
            write_atomic(self.known_hosts, kh)
            self.known_hosts.chmod(0o644)
        inv = {"all": {
            "vars": {"ansible_connection": "ssh", "ansible_user": SSH_USER, "ansible_become": True,
                     "ansible_python_interpreter": "/usr/bin/python3",
                     "ansible_ssh_private_key_file": str(self.ssh_key),
                     "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts} "
                                                "-o StrictHostKeyChecking=yes -o GlobalKnownHostsFile=/dev/null",
                     "lab_name": self.name, "lab_state_dir": str(self.dir), "lab_controller_ns": self.controller_ns},
            "hosts": hostvars,
            "children": groups,
        }}
        text = json.dumps(inv, indent=1, sort_keys=True) + "\n"
        if self.ssh_inventory_file.exists() and self.ssh_inventory_file.read_text() == text:
            return False
        write_atomic(self.ssh_inventory_file, text)
        self.ssh_inventory_file.chmod(0o644)
        return True

    def _write_inventory(self, st: dict[str, Any]) -> bool:
        topo = st["topology"]
        groups: dict[str, dict[str, Any]] = {}
        hostvars: dict[str, Any] = {}
        for host, h in topo["hosts"].items():
            v4 = [a for i in h["interfaces"] for a in i["addresses"] if ":" not in a]
            v6 = [a for i in h["interfaces"] for a in i["addresses"] if ":" in a]
            hostvars[host] = {
                "ansible_nsenter_pid": st["hosts"][host]["pid"],
                "lab_interfaces": [{k: i[k] for k in ("name", "segment", "mac", "addresses")} for i in h["interfaces"]],
                "lab_ipv4": v4[0].split("/")[0] if v4 else None,
                "lab_ipv6": v6[0].split("/")[0] if v6 else None,
                "lab_groups": h["groups"],
                **h["vars"],
            }
            for g in h["groups"]:
                groups.setdefault(g, {"hosts": {}})["hosts"][host] = None
        inv = {"all": {
            "vars": {"ansible_connection": "community.docker.nsenter", "ansible_python_interpreter": "/usr/bin/python3",
                     "lab_name": self.name, "lab_state_dir": str(self.dir)},
            "hosts": hostvars,
            "children": groups,
        }}
        # JSON is YAML too: Ansible reads this file as an inventory, and from_json reads it in tasks.
        text = json.dumps(inv, indent=1, sort_keys=True) + "\n"
        if self.inventory_file.exists() and self.inventory_file.read_text() == text:
            return False
        write_atomic(self.inventory_file, text)
        return True

    def host_state(self, host: str) -> str:
        res = self.exec(host, ["systemctl", "is-system-running"], check=False, timeout=20)
        return res.stdout.strip() or f"unknown (rc={res.returncode})"

    def wait_running(self, timeout: float = 120, hosts: Iterable[str] | None = None) -> dict[str, Any]:
        """Wait until every host's systemd finished booting; returns {host: state or state + failed units}."""
        pending = list(hosts or self.hosts())
        deadline = time.monotonic() + timeout
        out: dict[str, Any] = {}
        settled = {"running", "degraded", "maintenance", "stopping"}
        while pending:
            # --wait blocks until boot finished, but fails at once while systemd's socket is not up yet
            procs = {h: self.popen_exec(h, ["systemctl", "is-system-running", "--wait"]) for h in pending}
            for h, p in procs.items():
                try:
                    so = p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0]
                    out[h] = (so or "").strip() or "starting"
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()
                    out[h] = "timeout"
            pending = [h for h in pending if out[h] not in settled and out[h] != "timeout"]
            if pending:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        for h, s in out.items():
            if s != "running":
                failed = self.exec(h, ["systemctl", "list-units", "--state=failed", "--plain", "--no-legend"],
                                   check=False, timeout=20).stdout
                out[h] = {"state": s, "failed": [ln.split()[0] for ln in failed.splitlines() if ln.strip()]}
        return out

    # -- exec
    def nsenter_cmd(self, host: str, cmd: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.pid(host)), "-m", "-u", "-i", "-n", "-p", "-C", "--", *cmd]

    def _join_host_cgroups(self, host: str) -> Any:
        cgs = self.cgroup_dirs(host)
        # joining a frozen host would freeze the command too: then stay outside
        files = [] if is_frozen(cgs) else [str(d / "cgroup.procs") for d in cgs.values()]

        def join() -> None:
            for f in files:
                with open(f, "w") as fh:
                    fh.write(str(os.getpid()))

        return join

    def exec(self, host: str, cmd: list[str], *, check: bool = True, timeout: float | None = 60,
             input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run cmd inside host (its namespaces and cgroups, so freeze and restart affect it too)."""
        full = self.nsenter_cmd(host, cmd)
        try:
            res = subprocess.run(full, input=input, text=True, timeout=timeout, capture_output=True, check=False,
                                 preexec_fn=self._join_host_cgroups(host))
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"{host}: timed out after {timeout}s: {' '.join(cmd)}") from exc
        if check and res.returncode != 0:
            raise LabError(f"{host}: command failed (rc={res.returncode}): {' '.join(cmd)}: {res.stderr.strip()}")
        return res

    def popen_exec(self, host: str, cmd: list[str], **kw: Any) -> subprocess.Popen[str]:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen(self.nsenter_cmd(host, cmd), text=True, preexec_fn=self._join_host_cgroups(host),
                                **kw)

    # -- status
    def status(self) -> dict[str, Any]:
        st = self.load_state()
        if not st or "topology" not in st:
            return {"lab": self.name, "up": False}
        hosts = {}
        for host in st["topology"]["hosts"]:
            h = st["hosts"].get(host, {})
            alive = pid_alive(h.get("pid"), h.get("pid_start"))
            frozen = False
            with contextlib.suppress(LabError, FileNotFoundError):
                frozen = is_frozen(self.cgroup_dirs(host))
            hosts[host] = {"pid": h.get("pid"), "alive": alive, "frozen": frozen,
                           "state": self.host_state(host) if alive and not frozen else ("frozen" if frozen else "down")}
        return {"lab": self.name, "up": all(v["alive"] for v in hosts.values()), "hosts": hosts,
                "inventory": str(self.inventory_file), "fabric_ns": self.fabric_ns,
                "active_faults": list(st.get("faults", {})), "captures": list(st.get("captures", {}))}

    # -- down
    def _stop_host(self, st: dict[str, Any], host: str) -> bool:
        """Stop one host and remove its namespace and cgroups, from the recorded state only."""
        rec = st["hosts"].get(host)
        if not rec:
            return False
        changed = False
        cgs = {k: Path(v) for k, v in rec.get("cgroups", {}).items()}
        with contextlib.suppress(FileNotFoundError):
            set_frozen(cgs, False)
        # Kill until nothing is left: the recorded PID 1 and launcher, and every process in the
        # host's cgroups. Enumerate again each round, since a process may fork between the read of
        # cgroup.procs and the kill (a launcher whose PID 1 was not recorded yet, say); killing
        # the PID namespace's init takes the rest of the namespace with it.
        deadline = time.monotonic() + 20
        while True:
            if rec.get("launcher"):  # a launcher that is our own child (restart) stays a zombie until reaped
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(rec["launcher"], os.WNOHANG)
            victims = {p for d in cgs.values() for p in cgroup_pids(d)}
            victims |= {rec[k] for k in ("pid", "launcher") if pid_alive(rec.get(k), rec.get(f"{k}_start"))}
            victims.discard(os.getpid())
            if not victims:
                break
            if time.monotonic() > deadline:
                raise LabError(f"host {host}: processes still alive 20 s after SIGKILL: {sorted(victims)}")
            for p in sorted(victims):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
                    changed = True
            time.sleep(0.05)
        with contextlib.suppress(ChildProcessError):
            # reap a launcher that is our own child (restart within one process)
            while os.waitpid(-1, os.WNOHANG) != (0, 0):
                pass
        ns = rec.get("netns")
        if ns and ns in netns_list():
            run(["ip", "netns", "del", ns])
            changed = True
        for d in cgs.values():
            if d.exists():
                remove_cgroup_tree(d)
                changed = True
        rec["pid"] = rec["launcher"] = None
        self.save_state(st)
        return changed

    def down(self) -> dict[str, Any]:
        """Remove the lab: hosts, namespaces, mounts, cgroups, captures, state. Also after a crashed run."""
        if not self.dir.exists():
            return {"changed": False, "lab": self.name}
        with self._lock():
            st = self.load_state() or {"hosts": {}, "captures": {}}
            changed = False
            for cap in list(st.get("captures", {}).values()):
                if pid_alive(cap.get("pid"), cap.get("pid_start")):
                    os.kill(cap["pid"], signal.SIGKILL)
                    changed = True
            for host in list(st.get("hosts", {})):
                changed |= self._stop_host(st, host)
            ctl = st.get("controller_ns")
            if ctl and ctl in netns_list():
                run(["ip", "netns", "del", ctl])
                changed = True
            fab = st.get("fabric_ns")
            if fab and fab in netns_list():
                run(["ip", "netns", "del", fab])
                changed = True
            for mp in sorted(mounts_under(self.dir), key=len, reverse=True):
                run(["umount", mp], check=False)
                if mp in mountpoints():
                    run(["umount", "-l", mp])
                changed = True
            safe_rmtree(self.dir)
        # the state directory existed, so something was removed even if every process had died
        return {"changed": True, "lab": self.name, "processes_killed": changed}

    # -- faults
    def _log_fault(self, event: dict[str, Any]) -> None:
        ts = event.setdefault("ts", time.time())
        event.setdefault("time", now_iso(ts))
        with open(self.fault_log, "a") as fh:
            fh.write(json.dumps(event, sort_keys=True) + "\n")

    def _add_fault(self, kind: str, undo: dict[str, Any] | None, **info: Any) -> dict[str, Any]:
        fid = f"{kind}-{uuid.uuid4().hex[:8]}"
        ev = {"event": "fault", "id": fid, "kind": kind, **info}
        self._log_fault(ev)
        if undo is not None:
            with self._lock():
                st = self.state()
                st.setdefault("faults", {})[fid] = {"kind": kind, "undo": undo, "ts": ev["ts"], **info}
                self.save_state(st)
        return ev

    def faults(self) -> list[dict[str, Any]]:
        """Every fault event logged so far (fault and undo records, with timestamps)."""
        if not self.fault_log.exists():
            return []
        return [json.loads(ln) for ln in self.fault_log.read_text().splitlines() if ln.strip()]

    def active_faults(self) -> dict[str, Any]:
        return dict(self.state().get("faults", {}))

    def fault_kill(self, host: str, *, unit: str | None = None, comm: str | None = None,
                   pid: int | None = None, sig: int = signal.SIGKILL) -> dict[str, Any]:
        """kill -9 a process inside host: a unit's main process, every process named comm, or a PID in the host.

        Undo (for unit) restarts the unit; a killed process without a unit cannot be brought back.
        """
        if sum(x is not None for x in (unit, comm, pid)) != 1:
            raise LabError("fault kill: give exactly one of unit, comm, pid")
        targets: list[int] = []
        if unit:
            main = self.exec(host, ["systemctl", "show", "-p", "MainPID", "--value", unit]).stdout.strip()
            if not main or main == "0":
                raise LabError(f"fault kill: unit {unit!r} has no main process on {host}")
            self.exec(host, ["kill", f"-{int(sig)}", main])
            targets = [int(main)]
        elif pid is not None:
            self.exec(host, ["kill", f"-{int(sig)}", str(pid)])
            targets = [pid]
        else:
            self.pid(host)
            for p in cgroup_pids(main_cgroup(self.cgroup_dirs(host)), recursive=True):
                try:
                    if Path(f"/proc/{p}/comm").read_text().strip() == comm:
                        os.kill(p, sig)
                        targets.append(p)
                except (FileNotFoundError, ProcessLookupError):
                    continue
            if not targets:
                raise LabError(f"fault kill: no process named {comm!r} on {host}")
        undo = {"op": "start-unit", "host": host, "unit": unit} if unit else None
        return self._add_fault("kill", undo, host=host, unit=unit, comm=comm, pids=targets, signal=int(sig))

    def fault_freeze(self, host: str, *, method: str = "cgroup", silent: bool = True) -> dict[str, Any]:
        """Stop every process of host at once (cgroup freezer, or SIGSTOP of each): a hung machine.

        A frozen process cannot answer, but the host's kernel still would (ARP, ICMP echo, TCP
        handshakes). With silent (default) the host's frames are also dropped at its switch
        port(s), so it falls silent like a hung machine; silent=False freezes only the processes
        (a hung daemon on a live kernel).
        """
        self.pid(host)
        if method not in ("cgroup", "sigstop"):
            raise LabError(f"fault freeze: method must be cgroup or sigstop (got {method!r})")
        tag = None
        if silent:
            ports = ", ".join(json.dumps(i["port"]) for i in self.state()["topology"]["hosts"][host]["interfaces"])
            tag = self._nft_add([f"iifname {{ {ports} }} drop", f"oifname {{ {ports} }} drop"])
        pids: list[int] = []
        if method == "cgroup":
            cgs = self.cgroup_dirs(host)
            # A freeze can stay FREEZING when a task was busy in the kernel as it was asked (disk I/O on
            # a loaded machine; a vfork parent waiting on a child): the older freezer-subsystem docs say
            # to write FROZEN again, and runc's freezer also thaws and asks again when that does not
            # help. So: ask again every half second, and every fourth time thaw first.
            set_frozen(cgs, True)
            start = asked = time.monotonic()
            tries = 0
            while not is_frozen(cgs):
                now = time.monotonic()
                if now - start > 30:
                    raise LabError(f"fault freeze: {host} was not frozen within 30 s ({tries} tries)")
                if now - asked > 0.5:
                    tries += 1
                    if tries % 4 == 0:
                        set_frozen(cgs, False)
                    set_frozen(cgs, True)
                    asked = now
                time.sleep(0.01)
        else:
            pids = cgroup_pids(main_cgroup(self.cgroup_dirs(host)), recursive=True)
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGSTOP)
        return self._add_fault("freeze", {"op": "thaw", "host": host, "method": method, "pids": pids, "nft": tag},
                               host=host, method=method, silent=silent)

    def fault_link_down(self, host: str, iface: str = "eth0") -> dict[str, Any]:
        """Take host's link down at the switch port (the host sees carrier loss, like a pulled cable)."""
        port = self._port(host, iface)
        run(["ip", "-n", self.fabric_ns, "link", "set", port, "down"])
        return self._add_fault("link-down", {"op": "link-up", "port": port}, host=host, iface=iface, port=port)

    def fault_partition(self, side_a: Iterable[str], side_b: Iterable[str]) -> dict[str, Any]:
        """Drop every frame between hosts of side_a and hosts of side_b, in both directions, in the fabric.

        Frames are matched by bridge port on shared segments, and IP packets by address (so routed
        paths through a router are cut too). Traffic within a side and to other hosts flows on.
        """
        a, b = sorted(set(side_a)), sorted(set(side_b))
        topo = self.state()["topology"]
        for h in a + b:
            if h not in topo["hosts"]:
                raise LabError(f"fault partition: unknown host {h!r}")
        if not a or not b or set(a) & set(b):
            raise LabError(f"fault partition: sides must be non-empty and disjoint (got {a} and {b})")

        def ports(hs: list[str]) -> list[str]:
            return [i["port"] for h in hs for i in topo["hosts"][h]["interfaces"]]

        def addrs(hs: list[str], v6: bool) -> list[str]:
            return [x.split("/")[0] for h in hs for i in topo["hosts"][h]["interfaces"] for x in i["addresses"]
                    if (":" in x) == v6]

        rules = []
        for x, y in ((a, b), (b, a)):
            rules.append(f'iifname {{ {", ".join(map(json.dumps, ports(x)))} }} '
                         f'oifname {{ {", ".join(map(json.dumps, ports(y)))} }} drop')
            for fam, v6 in (("ip", False), ("ip6", True)):
                ax, ay = addrs(x, v6), addrs(y, v6)
                if ax and ay:
                    rules.append(f"{fam} saddr {{ {', '.join(ax)} }} {fam} daddr {{ {', '.join(ay)} }} drop")
        fid_rules = self._nft_add(rules)
        return self._add_fault("partition", {"op": "nft-delete", "comment": fid_rules}, side_a=a, side_b=b)

    def fault_loss(self, host: str, percent: int, *, direction: str = "both") -> dict[str, Any]:
        """Drop percent % of host's frames at its switch port(s), chosen at random per frame (nftables numgen).

        direction: "in" (frames to the host), "out" (frames from it) or "both" (each independently).
        """
        if not isinstance(percent, int) or not 0 < percent <= 100:
            raise LabError(f"fault loss: percent must be an integer 1..100 (got {percent!r})")
        if direction not in ("in", "out", "both"):
            raise LabError(f"fault loss: direction must be in, out or both (got {direction!r})")
        topo = self.state()["topology"]
        if host not in topo["hosts"]:
            raise LabError(f"fault loss: unknown host {host!r}")
        ports = ", ".join(json.dumps(i["port"]) for i in topo["hosts"][host]["interfaces"])
        rules = []
        if direction in ("out", "both"):
            rules.append(f"iifname {{ {ports} }} numgen random mod 100 < {percent} drop")
        if direction in ("in", "both"):
            rules.append(f"oifname {{ {ports} }} numgen random mod 100 < {percent} drop")
        tag = self._nft_add(rules)
        return self._add_fault("loss", {"op": "nft-delete", "comment": tag}, host=host, percent=percent,
                               direction=direction)

    def fault_restart(self, host: str, *, hard: bool = False, wait: bool = True,
                      timeout: float = 90) -> dict[str, Any]:
        """Restart a host: graceful poweroff (or, hard, a power cut), then boot it again on the same disk.

        The host comes back with a new PID; the inventory is rewritten. Nothing to undo.
        """
        old = self.pid(host)
        ev = self._add_fault("restart", None, host=host, hard=hard, old_pid=old)
        if not hard:
            os.kill(old, signal.SIGRTMIN + 4)  # systemd: poweroff.target
            deadline = time.monotonic() + 30
            while pid_alive(old, None) and time.monotonic() < deadline:
                time.sleep(0.1)
        with self._lock():
            st = self.state()
            self._stop_host(st, host)
            self._boot_host(st, host)
            self._wire_host(st, host)
            self._write_inventory(st)
        state = self.wait_running(timeout=timeout, hosts=[host])[host] if wait else None
        new = self.pid(host)
        self._log_fault({"event": "restarted", "id": ev["id"], "host": host, "new_pid": new, "state": state})
        return {**ev, "new_pid": new, "state": state}

    def undo(self, fault_id: str) -> dict[str, Any]:
        with self._lock():
            st = self.state()
            rec = st.get("faults", {}).get(fault_id)
            if rec is None:
                active = ", ".join(st.get("faults", {})) or "none"
                raise LabError(f"undo: no active fault {fault_id!r} (active: {active})")
        u = rec["undo"]
        op = u["op"]
        if op == "thaw":
            if u["method"] == "cgroup":
                set_frozen(self.cgroup_dirs(u["host"]), False)
            else:
                for p in u["pids"]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGCONT)
            if u.get("nft"):
                self._nft_delete(u["nft"])
        elif op == "link-up":
            run(["ip", "-n", self.fabric_ns, "link", "set", u["port"], "up"])
        elif op == "nft-delete":
            self._nft_delete(u["comment"])
        elif op == "start-unit":
            self.exec(u["host"], ["systemctl", "reset-failed", u["unit"]], check=False)
            self.exec(u["host"], ["systemctl", "start", u["unit"]])
        else:
            raise LabError(f"undo: unknown undo operation {op!r}")
        with self._lock():
            st = self.state()
            st["faults"].pop(fault_id, None)
            self.save_state(st)
        ev = {"event": "undo", "id": fault_id, "kind": rec["kind"]}
        self._log_fault(ev)
        return ev

    def undo_all(self) -> list[dict[str, Any]]:
        return [self.undo(fid) for fid in list(self.active_faults())]

    def _port(self, host: str, iface: str) -> str:
        topo = self.state()["topology"]
        if host not in topo["hosts"]:
            raise LabError(f"unknown host {host!r}")
        for i in topo["hosts"][host]["interfaces"]:
            if i["name"] == iface:
                return str(i["port"])
        raise LabError(f"host {host!r} has no interface {iface!r}")

    def _nft_add(self, rules: list[str]) -> str:
        tag = f"nlab-{uuid.uuid4().hex[:10]}"
        script = ["table bridge nlab_faults {", "  chain forward {",
                  "    type filter hook forward priority 0; policy accept;", "  }", "}"]
        script += [f'add rule bridge nlab_faults forward {r} comment "{tag}"' for r in rules]
        run(["ip", "netns", "exec", self.fabric_ns, "nft", "-f", "-"], input="\n".join(script) + "\n")
        return tag

    def _nft_delete(self, tag: str) -> None:
        out = run(["ip", "netns", "exec", self.fabric_ns, "nft", "-j", "list", "chain", "bridge", "nlab_faults",
                   "forward"]).stdout
        handles = [e["rule"]["handle"] for e in json.loads(out)["nftables"]
                   if "rule" in e and e["rule"].get("comment") == tag]
        cmds = [f"delete rule bridge nlab_faults forward handle {h}" for h in handles]
        if cmds:
            run(["ip", "netns", "exec", self.fabric_ns, "nft", "-f", "-"], input="\n".join(cmds) + "\n")

    # -- captures
    def capture_start(self, segment: str, name: str | None = None, bpf: str | None = None) -> dict[str, Any]:
        """Start tcpdump on a segment's bridge (in the fabric); returns {name, pcap, pid}."""
        st = self.state()
        if segment not in st["topology"]["segments"]:
            raise LabError(f"capture: unknown segment {segment!r} (segments: {', '.join(st['topology']['segments'])})")
        name = name or f"{segment}-{int(time.time() * 1000)}"
        if not re.match(r"^[A-Za-z0-9_.-]+$", name):
            raise LabError(f"capture: name must match [A-Za-z0-9_.-]+ (got {name!r})")
        cdir = self.dir / "captures"
        cdir.mkdir(exist_ok=True)
        pcap, errf = cdir / f"{name}.pcap", cdir / f"{name}.log"
        cmd = ["ip", "netns", "exec", self.fabric_ns, "tcpdump", "-i", f"br-{segment}", "-n", "-s", "0", "-U",
               "--immediate-mode", "-Z", "root", "-w", str(pcap)] + ([bpf] if bpf else [])
        with open(errf, "w") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)
        rec = {"name": name, "segment": segment, "pcap": str(pcap), "pid": proc.pid,
               "pid_start": proc_start_time(proc.pid), "started": now_iso()}
        with self._lock():
            st = self.state()
            st.setdefault("captures", {})[name] = rec
            self.save_state(st)
        deadline = time.monotonic() + 10
        while "listening on" not in errf.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"capture: tcpdump did not start: {errf.read_text().strip()}")
            time.sleep(0.02)
        return rec

    def capture_stop(self, name: str) -> dict[str, Any]:
        with self._lock():
            st = self.state()
            rec = st.get("captures", {}).pop(name, None)
            if rec is None:
                raise LabError(f"capture: no running capture {name!r}")
            self.save_state(st)
        if pid_alive(rec["pid"], rec["pid_start"]):
            os.kill(rec["pid"], signal.SIGINT)
            deadline = time.monotonic() + 10
            while pid_alive(rec["pid"], rec["pid_start"]) and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(rec["pid"], os.WNOHANG)
                time.sleep(0.02)
            if pid_alive(rec["pid"], rec["pid_start"]):
                os.kill(rec["pid"], signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(rec["pid"], os.WNOHANG)
        rec["stopped"] = now_iso()
        return rec


# ---------------------------------------------------------------- system helpers


def main_cgroup(cgs: dict[str, Path]) -> Path:
    """The directory that holds every process of a host: named systemd (v1) or unified (v2)."""
    return cgs["systemd"] if "systemd" in cgs else cgs["unified"]


def set_frozen(cgs: dict[str, Path], frozen: bool) -> None:
    if "freezer" in cgs:
        (cgs["freezer"] / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
    else:
        (cgs["unified"] / "cgroup.freeze").write_text("1" if frozen else "0")


def is_frozen(cgs: dict[str, Path]) -> bool:
    if "freezer" in cgs:
        return (cgs["freezer"] / "freezer.state").read_text().strip() == "FROZEN"
    return "frozen 1" in (cgs["unified"] / "cgroup.events").read_text().splitlines()


def cgroup_hierarchies(v2: bool = False) -> dict[str, tuple[Path, str]]:
    """Every cgroup hierarchy mounted under /sys/fs/cgroup: {name: (mount point, this process' cgroup there)}.

    name is the mount point's last component (cpu, memory, freezer, systemd, unified, ...); a
    cgroup2 mount is always "unified". Cgroup v1 (the named systemd and the freezer hierarchy)
    is used where the machine has it; otherwise, or with NLAB_CGROUP=v2 or v2 (a host whose
    systemd refuses v1), only the unified one.
    """
    own: dict[frozenset[str], str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        ctrls, path = line.split(":", 2)[1:]
        own[frozenset(ctrls.split(",")) if ctrls else frozenset()] = path
    out: dict[str, tuple[Path, str]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, post = line.split(" - ", 1)
        fstype, _src, superopts = post.split()[:3]
        mnt = pre.split()[4]
        if fstype not in ("cgroup", "cgroup2") or not (mnt + "/").startswith(CG_MOUNT_ROOT + "/"):
            continue
        if fstype == "cgroup2":
            key: frozenset[str] = frozenset()
            if key in own:
                out["unified"] = (Path(mnt), own[key])
            continue
        else:
            key = frozenset(o for o in superopts.split(",") if o not in ("rw", "ro") and "=" not in o or
                            o.startswith("name="))
        if key in own:
            out[Path(mnt).name] = (Path(mnt), own[key])
    v1 = "systemd" in out and "freezer" in out and os.environ.get("NLAB_CGROUP") != "v2" and not v2
    if v1:
        return out
    if "unified" not in out:
        raise LabError(f"no usable cgroups: need the named systemd and freezer v1 hierarchies or cgroup v2 "
                       f"under {CG_MOUNT_ROOT} (found {sorted(out)})")
    return {"unified": out["unified"]}


def netns_list() -> list[str]:
    d = Path("/run/netns")
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def netns_handle_ok(name: str, pid: int | None = None) -> bool:
    """True if /run/netns/NAME is a live namespace handle (given pid: the one of pid's netns).

    `ip netns add` and `ip netns attach` create the file first and bind-mount the namespace on it
    second: a run killed in between leaves a plain file, which `ip netns exec` refuses with
    "setting the network namespace ... failed: Invalid argument".
    """
    path = Path("/run/netns") / name
    try:
        have = path.stat()
    except OSError:
        return False
    if pid is None:
        return str(path) in mountpoints()
    try:
        want = os.stat(f"/proc/{pid}/ns/net")
    except OSError:
        return False
    return (have.st_dev, have.st_ino) == (want.st_dev, want.st_ino)


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` (None when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def replace_netns_handle(name: str, pid: int | None = None) -> None:
    """Drop a stale /run/netns/NAME (`ip netns del` ignores a missing mount) and make it again."""
    if name in netns_list():
        run(["ip", "netns", "del", name], check=False)
    run(["ip", "netns", "attach", name, str(pid)] if pid is not None else ["ip", "netns", "add", name])


def ip_links(ns: str) -> list[str]:
    out = run(["ip", "-n", ns, "-j", "link", "show"]).stdout
    return [link["ifname"] for link in json.loads(out)]


def cgroup_subdirs(d: Path) -> list[Path]:
    """d and every cgroup below it, deepest first.

    A running host's systemd creates and removes unit cgroups all the time (more so while it
    boots), so a directory seen here may be gone a moment later: os.walk skips directories that
    vanish while it walks (Path.rglob raised FileNotFoundError for them).
    """
    if not d.is_dir():
        return []
    return [Path(top) for top, _dirs, _files in os.walk(d, topdown=False)]


def cgroup_pids(d: Path, recursive: bool = True) -> list[int]:
    """PIDs in cgroup d (and, with recursive, in every cgroup below it); [] if d does not exist."""
    pids: list[int] = []
    for sub in cgroup_subdirs(d) if recursive else [d]:
        try:
            pids += [int(x) for x in (sub / "cgroup.procs").read_text().split()]
        except OSError:  # removed meanwhile (ENOENT, or ENODEV for a cgroup being destroyed)
            continue
    return pids


def remove_cgroup_tree(d: Path, timeout: float = 10) -> None:
    """Remove cgroup d and every cgroup below it, deepest first.

    The caller has killed every process in it. rmdir answers EBUSY while a killed task has not
    finished exiting, so retry until timeout; then name the cgroups and PIDs still there.
    """
    deadline = time.monotonic() + timeout
    while True:
        busy: list[str] = []
        for sub in cgroup_subdirs(d):
            try:
                sub.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise LabError(f"cannot remove cgroup {sub}: {exc.strerror}") from exc
                busy.append(str(sub))
        if not d.exists():
            return
        if time.monotonic() > deadline:
            raise LabError(f"cannot remove cgroup {d}: still busy after {timeout} s: {busy}; "
                           f"PIDs left: {cgroup_pids(d)}")
        time.sleep(0.05)


# ---------------------------------------------------------------- capture reader


def read_events(pcap: str | Path, kinds: Iterable[str] = ("arp", "ndp", "bgp")) -> list[dict[str, Any]]:
    """Timestamped ARP, NDP and BGP events from a pcap file, in capture order.

    ARP: op (request/reply), sender/target MAC and IP, gratuitous (sender IP == target IP).
    NDP: type (ns/na/rs/ra/redirect), src/dst IP, target, flags (router/solicited/override), lladdr.
    BGP: TCP control events on port 179 (syn/fin/rst) and BGP messages (open/update/notification/
    keepalive/route-refresh); updates list announced and withdrawn prefixes. A BGP message split
    across TCP segments is reported as type "partial".
    """
    from scapy.contrib import bgp as sbgp  # noqa: F401  (binds the BGP layers)
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import (
        ICMPv6ND_NA,
        ICMPv6ND_NS,
        ICMPv6ND_RA,
        ICMPv6ND_Redirect,
        ICMPv6ND_RS,
        ICMPv6NDOptDstLLAddr,
        ICMPv6NDOptSrcLLAddr,
        IPv6,
    )
    from scapy.layers.l2 import ARP, Ether
    from scapy.utils import PcapReader

    kinds = set(kinds)
    events: list[dict[str, Any]] = []
    nd_types = [(ICMPv6ND_NS, "ns"), (ICMPv6ND_NA, "na"), (ICMPv6ND_RS, "rs"), (ICMPv6ND_RA, "ra"),
                (ICMPv6ND_Redirect, "redirect")]
    bgp_types = {1: "open", 2: "update", 3: "notification", 4: "keepalive", 5: "route-refresh"}
    with PcapReader(str(pcap)) as reader:
        for pkt in reader:
            t = float(pkt.time)
            eth = {"src_mac": pkt[Ether].src, "dst_mac": pkt[Ether].dst} if Ether in pkt else {}
            if "arp" in kinds and ARP in pkt:
                a = pkt[ARP]
                events.append({"t": t, "kind": "arp", "op": {1: "request", 2: "reply"}.get(a.op, str(a.op)),
                               "sender_mac": a.hwsrc, "sender_ip": a.psrc, "target_mac": a.hwdst,
                               "target_ip": a.pdst, "gratuitous": a.psrc == a.pdst, **eth})
                continue
            if "ndp" in kinds and IPv6 in pkt:
                for cls, typ in nd_types:
                    if cls in pkt:
                        nd = pkt[cls]
                        ev: dict[str, Any] = {"t": t, "kind": "ndp", "type": typ, "src_ip": pkt[IPv6].src,
                                              "dst_ip": pkt[IPv6].dst, **eth}
                        if hasattr(nd, "tgt"):
                            ev["target"] = nd.tgt
                        if typ == "na":
                            ev["flags"] = {"router": bool(nd.R), "solicited": bool(nd.S), "override": bool(nd.O)}
                        for opt in (ICMPv6NDOptSrcLLAddr, ICMPv6NDOptDstLLAddr):
                            if opt in pkt:
                                ev["lladdr"] = pkt[opt].lladdr
                        events.append(ev)
                        break
                else:
                    pass
            if "bgp" in kinds and TCP in pkt and 179 in (pkt[TCP].sport, pkt[TCP].dport):
                tcp = pkt[TCP]
                ipl = pkt[IP] if IP in pkt else pkt[IPv6] if IPv6 in pkt else None
                base = {"t": t, "kind": "bgp", "src_ip": ipl.src if ipl else None, "dst_ip": ipl.dst if ipl else None,
                        "sport": tcp.sport, "dport": tcp.dport}
                flags = str(tcp.flags)
                for fl, name in (("S", "tcp-syn"), ("F", "tcp-fin"), ("R", "tcp-rst")):
                    if fl in flags:
                        events.append({**base, "type": name + ("-ack" if fl == "S" and "A" in flags else "")})
                payload = bytes(tcp.payload)
                while len(payload) >= 19 and payload[:16] == b"\xff" * 16:
                    length = int.from_bytes(payload[16:18], "big")
                    if length < 19 or length > len(payload):
                        events.append({**base, "type": "partial"})
                        break
                    msg, payload = payload[:length], payload[length:]
                    ev = {**base, "type": bgp_types.get(msg[18], str(msg[18]))}
                    if msg[18] == 2:
                        ev.update(_bgp_update_prefixes(msg))
                    events.append(ev)
    return events


def _bgp_update_prefixes(msg: bytes) -> dict[str, list[str]]:
    from scapy.contrib.bgp import BGPHeader, BGPPAMPReachNLRI, BGPPAMPUnreachNLRI, BGPUpdate

    out: dict[str, list[str]] = {"announce": [], "withdraw": []}
    try:
        upd = BGPHeader(msg)[BGPUpdate]
    except Exception:  # a malformed update is reported without prefixes
        return out
    out["withdraw"] += [r.prefix for r in upd.withdrawn_routes]
    out["announce"] += [r.prefix for r in upd.nlri]
    for attr in upd.path_attr:
        val = attr.attribute
        if isinstance(val, BGPPAMPReachNLRI):
            out["announce"] += [r.prefix for r in getattr(val, "nlri", [])]
        elif isinstance(val, BGPPAMPUnreachNLRI):
            afi = getattr(val, "afi_safi_specific", None)
            out["withdraw"] += [r.prefix for r in getattr(afi, "withdrawn_routes", [])]
    return out


# ---------------------------------------------------------------- CLI


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=1, sort_keys=True, default=str))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labctl", description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--state-root", type=Path, default=None, help=f"default {STATE_ROOT}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def with_name(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("-n", "--name", default=None, help="lab name (default: the topology's name, else lab)")
        p.add_argument("-t", "--topology", default=None, help="topology file; gives the lab name")
        return p

    p = sub.add_parser("image", help="build (or find) the cached base image")
    p.add_argument("--extra-packages", default="", help="comma-separated packages beyond the base list")
    p.add_argument("--prune", action="store_true", help="also remove other cached images no lab uses")
    p.add_argument("--release", default=None, help="Debian release (default: the machine's)")
    p = sub.add_parser("up", help="bring a lab up from a topology file (idempotent)")
    p.add_argument("-t", "--topology", required=True)
    p.add_argument("-n", "--name", default=None, help="lab name (default: the topology's name)")
    p.add_argument("--strict", action="store_true", help="fail unless every host is running")
    p.add_argument("--no-wait", action="store_true")
    p.add_argument("--timeout", type=float, default=120)
    with_name(sub.add_parser("down", help="remove a lab and everything it created"))
    with_name(sub.add_parser("cleanup", help="same as down; for a crashed run"))
    with_name(sub.add_parser("status", help="hosts, PIDs, system state, active faults"))
    p = with_name(sub.add_parser("inventory", help="print the inventory file path"))
    p.add_argument("--ssh", action="store_true", help="the inventory of the ssh hosts (use it from controller-exec)")
    p = with_name(sub.add_parser("controller-exec", help="run a command in the namespace that reaches ssh hosts"))
    p.add_argument("-u", "--user", default=None, help="run it as this local user (runuser)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p = with_name(sub.add_parser("exec", help="run a command in a host"))
    p.add_argument("host")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p = with_name(sub.add_parser("enter", help="print the nsenter command line for a host"))
    p.add_argument("host")
    p = with_name(sub.add_parser("fault", help="inject or undo a fault"))
    fs = p.add_subparsers(dest="fault", required=True)
    q = fs.add_parser("kill")
    q.add_argument("host")
    g = q.add_mutually_exclusive_group(required=True)
    g.add_argument("--unit")
    g.add_argument("--comm")
    g.add_argument("--pid", type=int)
    q = fs.add_parser("freeze")
    q.add_argument("host")
    q.add_argument("--method", choices=["cgroup", "sigstop"], default="cgroup")
    q.add_argument("--not-silent", action="store_true", help="freeze processes only; the kernel still answers")
    q = fs.add_parser("link-down")
    q.add_argument("host")
    q.add_argument("--iface", default="eth0")
    q = fs.add_parser("partition")
    q.add_argument("side_a", help="comma-separated hosts")
    q.add_argument("side_b", help="comma-separated hosts")
    q = fs.add_parser("loss")
    q.add_argument("host")
    q.add_argument("percent", type=int)
    q.add_argument("--direction", choices=["in", "out", "both"], default="both")
    q = fs.add_parser("restart")
    q.add_argument("host")
    q.add_argument("--hard", action="store_true")
    q = fs.add_parser("undo")
    q.add_argument("id", nargs="?")
    q.add_argument("--all", action="store_true")
    fs.add_parser("list")
    fs.add_parser("log")
    p = with_name(sub.add_parser("capture", help="packet captures on a segment"))
    cs = p.add_subparsers(dest="capture", required=True)
    q = cs.add_parser("start")
    q.add_argument("segment")
    q.add_argument("--id", default=None)
    q.add_argument("--filter", default=None, help="tcpdump filter expression")
    q = cs.add_parser("stop")
    q.add_argument("id")
    q = cs.add_parser("read")
    q.add_argument("pcap")
    q.add_argument("--kinds", default="arp,ndp,bgp")

    a = ap.parse_args(argv)
    try:
        if getattr(a, "name", "x") is None:
            a.name = load_topology(a.topology)["name"] if a.topology else "lab"
        if a.cmd == "image":
            path, built = ensure_image([x for x in a.extra_packages.split(",") if x], release=a.release,
                                       log=lambda m: print(m, file=sys.stderr))
            _print({"image": str(path), "changed": built, "pruned": prune_images([path]) if a.prune else []})
        elif a.cmd == "up":
            topo = load_topology(a.topology)
            lab = Lab(a.name or topo["name"], a.state_root)
            res = lab.up(topo, wait=not a.no_wait, timeout=a.timeout, log=lambda m: print(m, file=sys.stderr))
            _print(res)
            if a.strict and any(v != "running" for v in res.get("system_state", {}).values()):
                print(f"labctl: error: not every host is running: {res['system_state']}", file=sys.stderr)
                return 3
        elif a.cmd in ("down", "cleanup"):
            _print(Lab(a.name, a.state_root).down())
        elif a.cmd == "status":
            _print(Lab(a.name, a.state_root).status())
        elif a.cmd == "inventory":
            lab = Lab(a.name, a.state_root)
            print(lab.ssh_inventory_file if a.ssh else lab.inventory_file)
        elif a.cmd == "controller-exec":
            lab = Lab(a.name, a.state_root)
            if not lab.state().get("controller_ns"):
                raise LabError(f"lab {lab.name!r} has no ssh hosts, so no controller namespace")
            cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
            return subprocess.run(lab.controller_cmd(cmd or ["/bin/bash"], a.user), check=False).returncode
        elif a.cmd == "exec":
            lab = Lab(a.name, a.state_root)
            cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
            proc = subprocess.run(lab.nsenter_cmd(a.host, cmd or ["/bin/bash"]), check=False,
                                  preexec_fn=lab._join_host_cgroups(a.host))
            return proc.returncode
        elif a.cmd == "enter":
            print(" ".join(Lab(a.name, a.state_root).nsenter_cmd(a.host, ["/bin/bash", "-l"])))
        elif a.cmd == "fault":
            lab = Lab(a.name, a.state_root)
            if a.fault == "kill":
                _print(lab.fault_kill(a.host, unit=a.unit, comm=a.comm, pid=a.pid))
            elif a.fault == "freeze":
                _print(lab.fault_freeze(a.host, method=a.method, silent=not a.not_silent))
            elif a.fault == "link-down":
                _print(lab.fault_link_down(a.host, a.iface))
            elif a.fault == "partition":
                _print(lab.fault_partition(a.side_a.split(","), a.side_b.split(",")))
            elif a.fault == "loss":
                _print(lab.fault_loss(a.host, a.percent, direction=a.direction))
            elif a.fault == "restart":
                _print(lab.fault_restart(a.host, hard=a.hard))
            elif a.fault == "undo":
                if a.all:
                    _print(lab.undo_all())
                elif a.id:
                    _print(lab.undo(a.id))
                else:
                    raise LabError("fault undo: give an id or --all")
            elif a.fault == "list":
                _print(lab.active_faults())
            elif a.fault == "log":
                _print(lab.faults())
        elif a.cmd == "capture":
            if a.capture == "read":
                _print(read_events(a.pcap, [k for k in a.kinds.split(",") if k]))
            else:
                lab = Lab(a.name, a.state_root)
                if a.capture == "start":
                    _print(lab.capture_start(a.segment, a.id, a.filter))
                else:
                    _print(lab.capture_stop(a.id))
    except LabError as exc:
        print(f"labctl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
