#!/usr/bin/env bash
# Run a collection-level check (ansible-test sanity, ansible-lint) from a copy of
# the tree placed at .../ansible_collections/nocloud/loadbalancer, as those tools
# require. The copy holds only the files git would ship (tracked + not ignored),
# so virtualenvs, caches and tests/output never reach the scanners.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
what=${1:?usage: collection-tree.sh sanity|ansible-lint}
work=$(mktemp -d /tmp/nocloudlb-collection.XXXXXX)
trap 'rm -rf "$work"' EXIT
dest=$work/ansible_collections/nocloud/loadbalancer
mkdir -p "$dest"
git ls-files -z --cached --others --exclude-standard | rsync -a --from0 --files-from=- ./ "$dest/"
cd "$dest"
git init -q . && git add -A >/dev/null  # ansible-test lists files through git
case $what in
  sanity)
    # ansible-test downloads a pip bootstrap script from a host these machines
    # cannot reach; this stand-in does the same job with ensurepip.
    cache=$HOME/.ansible/test/cache
    mkdir -p "$cache"
    cat > "$cache/get_pip_24_2.py" <<'PY'
import subprocess, sys
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
args = [a for a in sys.argv[1:] if not a.startswith("-")]
subprocess.check_call([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "pip==24.2", *args])
PY
    "$top/.venv/bin/ansible-test" sanity --local --python 3.11 --requirements --color no
    ;;
  ansible-lint)
    # ansible-lint installs the collection it checks into ~/.ansible/collections: give it a
    # home of its own, so it neither leaves a copy in the user's nor picks up a stale one there.
    mkdir -p "$work/home"
    HOME=$work/home ANSIBLE_COLLECTIONS_PATH=$work "$top/.venv/bin/ansible-lint" --profile production --offline
    ;;
  *) echo "unknown check: $what" >&2; exit 2 ;;
esac
