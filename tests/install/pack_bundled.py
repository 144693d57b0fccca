"""Build Galaxy artifacts of the collections the ``ansible`` PyPI package bundles.

Galaxy is unreachable here, so the installed-collection test takes the
dependencies galaxy.yml declares (and theirs, read from each MANIFEST.json) from
the copies the ``ansible`` package ships, and builds each one with
``ansible-galaxy collection build`` from a copy whose galaxy.yml is written from
its MANIFEST.json (the bundled copies omit some files their FILES.json lists, so
they cannot be packed as they are).

    python pack_bundled.py --galaxy galaxy.yml --from SITE/ansible_collections \
        --out DIR --ansible-galaxy BIN
Prints one line per artifact written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

# galaxy.yml keys that MANIFEST.json's collection_info carries too
KEYS = ("namespace", "name", "version", "readme", "authors", "description", "license", "license_file",
        "tags", "dependencies", "repository", "documentation", "homepage", "issues")


def build(root: Path, out: Path, galaxy_bin: str) -> dict:
    info = json.loads((root / "MANIFEST.json").read_text())["collection_info"]
    with tempfile.TemporaryDirectory(prefix="nocloudlb-dep.") as tmp:
        src = Path(tmp, info["namespace"], info["name"])
        shutil.copytree(root, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "MANIFEST.json", "FILES.json"))
        meta = {k: info[k] for k in KEYS if info.get(k) not in (None, [], "")}
        meta.setdefault("readme", "README.md")
        meta.setdefault("authors", ["unknown"])
        meta["build_ignore"] = ["galaxy.yml.orig"]
        (src / "galaxy.yml").write_text(yaml.safe_dump(meta, sort_keys=False))
        subprocess.run([galaxy_bin, "collection", "build", "--force", "--output-path", str(out), str(src)],
                       check=True, stdout=subprocess.DEVNULL)
    return info


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--galaxy", required=True, help="galaxy.yml whose dependencies to build")
    ap.add_argument("--from", dest="src", required=True, help="the ansible package's ansible_collections directory")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ansible-galaxy", default="ansible-galaxy")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    todo = list((yaml.safe_load(Path(a.galaxy).read_text()).get("dependencies") or {}).items())
    done: set[str] = set()
    while todo:
        fqcn, spec = todo.pop(0)
        if fqcn in done:
            continue
        done.add(fqcn)
        root = Path(a.src, *fqcn.split("."))
        if not (root / "MANIFEST.json").is_file():
            print(f"pack_bundled: {fqcn} (wanted {spec}) is not bundled in {a.src}", file=sys.stderr)
            return 1
        info = build(root, out, a.ansible_galaxy)
        print(f"  {fqcn} {info['version']} (galaxy.yml wants {spec})")
        todo.extend((info.get("dependencies") or {}).items())
    return 0


if __name__ == "__main__":
    sys.exit(main())
