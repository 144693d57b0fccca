"""Print a JSON summary of the daemon's source: its version, a digest of every file
that goes into the nocloudlb wheel, and the version of the collection it ships in. The
role names wheelhouses after the digest, so a wheel is built once per source state and
nodes reinstall only when the code changed."""

import hashlib
import json
import sys
import tomllib
from pathlib import Path


def main() -> None:
    root = Path(sys.argv[1]).resolve()
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    digest = hashlib.sha256()
    files = [root / "pyproject.toml"]
    for folder in ("speaker/nocloudlb", "plugins/module_utils"):
        files += [p for p in (root / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    print(json.dumps({"name": project["name"], "version": project["version"], "digest": digest.hexdigest()[:16],
                      "collection_version": collection_version(root)}))


def collection_version(root: Path) -> str:
    """The collection's version: MANIFEST.json in an installed collection, galaxy.yml in a checkout."""
    try:
        return str(json.loads((root / "MANIFEST.json").read_text())["collection_info"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        for line in (root / "galaxy.yml").read_text().splitlines():
            if line.startswith("version:"):
                return line.partition(":")[2].split("#")[0].strip().strip("'\"") or "unknown"
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
