"""Build, on the controller, one wheelhouse per kind of node: the speaker's wheel and its
dependencies' wheels for each Python/CPU/C library the nodes run.

    build_wheelhouse.py --source DIR --cache DIR --digest D [--controller PLATFORM]
                        --platform PLATFORM [--platform ...] [--wheel-arg ARG ...] [--download-arg ARG ...]
    build_wheelhouse.py --print-platform      # on a node: its PLATFORM

A PLATFORM reads as ``linux-x86_64-py3.13-glibc2.41`` (what ``node_platform()`` below prints
on a node). The controller's own platform is built as before: ``pip wheel`` of the source,
which may compile what has no wheel. Any other platform gets the same versions (read from the
controller's wheelhouse, so every node runs the same code) as binary wheels made for it, from
the package index (``pip download --only-binary=:all: --platform ... --python-version ...``):
a node never compiles and never reaches an index. Each wheelhouse is built once, into a
temporary directory renamed at the end, so an interrupted build leaves nothing half-made.

Prints one JSON object: ``wheelhouses`` (platform -> directory) and ``built`` (the platforms
built by this run). Exits 2 with a one-line reason when a platform cannot be served.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

PLATFORM = re.compile(r"^linux-(?P<arch>[a-z0-9_]+)-py(?P<major>3)\.(?P<minor>\d+)-"
                      r"(?P<libc>glibc|musl)?(?P<lmajor>\d+)?\.?(?P<lminor>\d+)?$")
WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-")
# glibc releases older than these have no manylinux tag on the architecture
MANYLINUX_FLOOR = {"x86_64": 5, "i686": 5, "aarch64": 17, "ppc64le": 17, "s390x": 17, "armv7l": 17}
LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def node_platform() -> str:
    """This interpreter's platform in the form above (run on a node, and on the controller)."""
    import platform
    import sysconfig
    libc, version = platform.libc_ver()
    return (f"{sysconfig.get_platform()}-py{sys.version_info.major}.{sys.version_info.minor}-"
            f"{libc}{version}")


def pip_platforms(plat: str) -> tuple[list[str], str]:
    """(the --platform tags a node of `plat` installs, its X.Y Python) or raises ValueError."""
    m = PLATFORM.match(plat)
    if not m or not m["libc"] or not m["lmajor"]:
        raise ValueError(f"platform {plat!r} is not a Linux one with a known C library (glibc or musl)")
    arch, libc, lmajor, lminor = m["arch"], m["libc"], int(m["lmajor"]), int(m["lminor"] or 0)
    python = f"{m['major']}.{m['minor']}"
    if libc == "musl":
        return [f"musllinux_{lmajor}_{n}_{arch}" for n in range(lminor, -1, -1)], python
    floor = MANYLINUX_FLOOR.get(arch)
    if lmajor != 2 or floor is None:
        raise ValueError(f"platform {plat!r}: no manylinux wheels exist for glibc {lmajor}.{lminor} on {arch}")
    tags = [f"manylinux_2_{n}_{arch}" for n in range(lminor, floor - 1, -1)]
    tags += [f"{LEGACY[n]}_{arch}" for n in sorted(LEGACY, reverse=True) if floor <= n <= lminor]
    return tags, python


def pip(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()[-3:]
        raise RuntimeError("pip " + args[0] + " failed: " + " ".join(lines))


def build(dest: Path, make) -> bool:
    """Make `dest` with make(tmp) unless it exists; True when built now."""
    if dest.is_dir():
        return False
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    make(tmp)
    tmp.rename(dest)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--print-platform", action="store_true", help="print this Python's platform and exit")
    ap.add_argument("--source")
    ap.add_argument("--cache")
    ap.add_argument("--digest")
    ap.add_argument("--controller", default=None, help="the controller's platform (default: this Python's)")
    ap.add_argument("--platform", action="append", default=[])
    ap.add_argument("--wheel-arg", action="append", default=[], help="an argument for pip wheel (controller)")
    ap.add_argument("--download-arg", action="append", default=[], help="an argument for pip download (others)")
    a = ap.parse_args()
    if a.print_platform:
        print(node_platform())
        return 0
    if not (a.source and a.cache and a.digest):
        ap.error("--source, --cache and --digest are required")
    own = a.controller or node_platform()
    root = Path(a.cache) / a.digest
    quiet = ["--quiet", "--disable-pip-version-check"]
    out: dict[str, dict] = {"wheelhouses": {}, "built": []}
    try:
        home = root / own
        if build(home, lambda tmp: pip(["wheel", *quiet, "--wheel-dir", str(tmp), *a.wheel_arg, a.source])):
            out["built"].append(own)
        out["wheelhouses"][own] = str(home)
        wheels = sorted(p.name for p in home.glob("*.whl"))
        pins = [f"{m['name']}=={m['version']}" for w in wheels if (m := WHEEL.match(w)) and m["name"] != "nocloudlb"]
        ours = [home / w for w in wheels if w.startswith("nocloudlb-")]
        for plat in sorted(set(a.platform) - {own}):
            tags, python = pip_platforms(plat)

            def fetch(tmp: Path, tags=tags, python=python) -> None:
                for wheel in ours:  # pure Python: the same file serves every node
                    shutil.copy2(wheel, tmp / wheel.name)
                abi = "cp" + python.replace(".", "")
                pip(["download", *quiet, "--only-binary=:all:", "--dest", str(tmp), "--implementation", "cp",
                     "--python-version", python, "--abi", abi, "--abi", "abi3", "--abi", "none",
                     *[arg for t in tags for arg in ("--platform", t)], *a.download_arg, *pins])
            if build(root / plat, fetch):
                out["built"].append(plat)
            out["wheelhouses"][plat] = str(root / plat)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"cannot build the wheelhouse: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
