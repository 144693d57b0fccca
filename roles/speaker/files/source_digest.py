"""Print a JSON summary of the daemon's source: its version and a digest of every file
that goes into the nocloudlb wheel. The role names wheelhouses after the digest, so a
wheel is built once per source state and nodes reinstall only when the code changed."""

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
    print(json.dumps({"name": project["name"], "version": project["version"], "digest": digest.hexdigest()[:16]}))


if __name__ == "__main__":
    main()
