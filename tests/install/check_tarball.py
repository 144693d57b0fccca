"""Check a built nocloud.loadbalancer tarball: print its size, fail on anything
private in it or anything the roles need missing from it.

    python check_tarball.py nocloud-loadbalancer-X.tar.gz galaxy.yml
"""

from __future__ import annotations

import fnmatch
import json
import sys
import tarfile
from pathlib import Path

import yaml

# What the speaker role builds the node wheelhouse from (pyproject.toml's
# package-dir: speaker/nocloudlb, speaker/nocloudlb/l2 and plugins/module_utils as
# nocloudlb.core; README.md is its readme) and what the playbooks import.
REQUIRED = [
    "MANIFEST.json", "FILES.json", "pyproject.toml", "README.md", "LICENSE",
    "speaker/nocloudlb/__init__.py", "speaker/nocloudlb/cli.py", "speaker/nocloudlb/daemon.py",
    "speaker/nocloudlb/l2/__init__.py", "plugins/module_utils/__init__.py",
    "roles/speaker/files/source_digest.py", "roles/speaker/meta/argument_specs.yml",
    "roles/lab/files/labctl.py", "playbooks/site.yml", "playbooks/drain.yml", "meta/runtime.yml",
    "playbooks/rolling_restart.yml", "playbooks/rotate_key.yml", "playbooks/migrate_to_speaker.yml",
    "playbooks/migrate_to_keepalived.yml",
]
# Never shipped: version control, virtualenvs, caches, build output, logs, keys.
PRIVATE = [
    ".git", ".git/*", ".venv/*", "*/.venv/*", ".ansible/*", ".cache/*", ".config/*", ".lab/*", ".ci/*",
    "*__pycache__*", "*.pyc", "*.egg-info*", "build/*", "dist/*", "tests/output/*", ".mypy_cache/*",
    ".ruff_cache/*", ".pytest_cache/*", ".hypothesis/*", "*.log", "*.key", "*.pem", ".env*", "*.tar.gz",
    "*/.molecule/*", "tests/install/output/*", "ansible.cfg",
]


def main() -> int:
    path, galaxy = Path(sys.argv[1]), Path(sys.argv[2])
    with tarfile.open(path) as tar:
        names = [m.name.removeprefix("./") for m in tar.getmembers()]
        files = [m for m in tar.getmembers() if m.isfile()]
        manifest = json.load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    size = path.stat().st_size
    unpacked = sum(m.size for m in files)
    print(f"  {path.name}: {size / 1024:.0f} KiB ({unpacked / 1024:.0f} KiB unpacked, {len(files)} files)")
    problems = []
    for req in REQUIRED:
        if req not in names:
            problems.append(f"missing {req} (the roles need it)")
    for name in names:
        for pat in PRIVATE:
            if fnmatch.fnmatch(name, pat):
                problems.append(f"{name} should not be shipped (matches {pat!r}; add it to build_ignore)")
                break
    declared = yaml.safe_load(galaxy.read_text()).get("dependencies") or {}
    shipped = manifest["collection_info"].get("dependencies") or {}
    if shipped != declared:
        problems.append(f"MANIFEST.json dependencies {shipped} differ from galaxy.yml's {declared}")
    if not declared:
        problems.append("galaxy.yml declares no dependencies, but the roles use ansible.posix and community.docker")
    top = sorted({n.split("/")[0] for n in names})
    print(f"  top level: {' '.join(top)}")
    print(f"  dependencies: {', '.join(f'{k} {v}' for k, v in declared.items())}")
    for p in problems:
        print(f"  PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
