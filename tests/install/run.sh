#!/usr/bin/env bash
# The collection installed as users install it, and a lab deployed from there.
#
#   1. a fresh virtual environment with ansible-core only (no `ansible` package,
#      so no bundled collections);
#   2. `ansible-galaxy collection build` of this tree: its size printed, its
#      contents checked (what the roles need to build the node wheelhouse; nothing
#      private);
#   3. the dependencies galaxy.yml declares built as Galaxy artifacts from the
#      copies the `ansible` package bundles (Galaxy is unreachable here), and an
#      offline install of the collection alone must fail for want of them;
#   4. `ansible-galaxy collection install` from the tarball, then from a
#      requirements.yml pointing at it, into a repository laid out like an
#      existing infra repo (tests/install/infra: ansible.cfg, inventory,
#      group_vars, playbooks of its own);
#   5. from that repository only: the lab `fh` up (nocloud.loadbalancer.lab),
#      a site playbook that imports nocloud.loadbalancer.site, one that uses the
#      roles directly, and a check from the client that every VIP is answered by
#      the elected node's MAC and serves HTTP;
#   6. the playbooks by FQCN; docs/quickstart.md's commands run on that lab (nocloudlb from
#      the nodes' PATH, --version), the README's drain and undrain by FQCN from the infra
#      repository and the quickstart's from the checkout, each checked on the node, a VIP
#      watched moving; the other `ansible-playbook` lines of README.md, docs/howto.md and
#      docs/operations.md run as written (tests/install/doc_playbooks.py);
#   7. nothing left in ~/.ansible/collections, the lab down.
# Run as root: tests/install/run.sh  (KEEP=1 keeps the work directory and the lab)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
here=$top/tests/install
lab=fh
work=$(mktemp -d /tmp/nocloudlb-install.XXXXXX)
venv=$work/venv
infra=$work/infra
t0=$SECONDS
lab_up=0

home_collections() { find "$HOME/.ansible/collections" -maxdepth 3 2>/dev/null | sort || true; }
before=$(home_collections)

cleanup() {
    rc=$?
    if [ "${KEEP:-0}" = 1 ]; then
        echo "KEEP=1: work directory $work, lab $lab left up"
        exit "$rc"
    fi
    if [ "$lab_up" = 1 ]; then
        (cd "$infra" && "$venv/bin/ansible-playbook" playbooks/lab.yml -e lab_action=down >/dev/null 2>&1) \
            || echo "install-test: could not take the lab $lab down (ansible-playbook playbooks/lab.yml -e lab_action=down)" >&2
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT

step() { printf '\n=== [%3ss] %s\n' "$((SECONDS - t0))" "$*"; }
fail() { echo "install-test: FAILED: $*" >&2; exit 1; }

# Everything below runs with ansible-core from $venv, the infra repository's own
# ansible.cfg, and nothing from the caller's Ansible environment.
unset ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH ANSIBLE_COLLECTIONS_PATHS ANSIBLE_ROLES_PATH ANSIBLE_LIBRARY \
      ANSIBLE_INVENTORY VIRTUAL_ENV PYTHONPATH
export PATH=$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export ANSIBLE_FORCE_COLOR=0 ANSIBLE_NOCOLOR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

step "a virtual environment with ansible-core only"
core=$(grep -E '^ansible-core==' "$top/requirements-dev.txt")
python3 -m venv "$venv"
"$venv/bin/pip" install -q "$core" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
"$venv/bin/python" -c 'import ansible.release as r; print("ansible-core", r.__version__)'
if "$venv/bin/python" -c 'import ansible_collections' 2>/dev/null; then
    fail "the test environment has bundled collections (the ansible package); it must have ansible-core only"
fi

step "build the Galaxy tarball"
"$venv/bin/ansible-galaxy" collection build --output-path "$work/dist" "$top" >/dev/null
tarball=$(ls "$work"/dist/nocloud-loadbalancer-*.tar.gz)
"$venv/bin/python" "$here/check_tarball.py" "$tarball" "$top/galaxy.yml"

step "the dependencies galaxy.yml declares, built from the ansible package's bundled copies"
bundled=${BUNDLED_COLLECTIONS:-$(find "$top/.venv/lib" -maxdepth 3 -path "*/site-packages/ansible_collections" 2>/dev/null | head -n1)}
[ -n "$bundled" ] || fail "no ansible package in $top/.venv (make venv) to take the dependencies from"
"$venv/bin/python" "$here/pack_bundled.py" --galaxy "$top/galaxy.yml" --from "$bundled" --out "$work/vendor" \
    --ansible-galaxy "$venv/bin/ansible-galaxy"

step "an offline install of the collection alone fails: its dependencies are declared"
# (each install sees only its own target path: a copy in ~/.ansible/collections must not satisfy it)
if out=$(cd "$work" && ANSIBLE_COLLECTIONS_PATH=$work/alone "$venv/bin/ansible-galaxy" collection install --offline \
        -p "$work/alone" "$tarball" 2>&1); then
    echo "$out"; fail "the collection installed without its dependencies: galaxy.yml declares none"
fi
echo "$out" | grep -E 'ansible\.posix|community\.docker' | head -n 3 | sed 's/^/  /'
echo "$out" | grep -qE 'ansible\.posix|community\.docker' || { echo "$out"; fail "the refusal did not name a dependency"; }

step "install from the tarball"
(cd "$work" && ANSIBLE_COLLECTIONS_PATH=$work/from-tarball "$venv/bin/ansible-galaxy" collection install --offline \
    -p "$work/from-tarball" \
    "$tarball" "$work"/vendor/*.tar.gz 2>/dev/null | grep -E 'was installed successfully')
for what in module:nocloud.loadbalancer.pool_validate module:nocloud.loadbalancer.vip_owner_info \
            role:nocloud.loadbalancer.speaker role:nocloud.loadbalancer.lab; do
    ANSIBLE_COLLECTIONS_PATH=$work/from-tarball "$venv/bin/ansible-doc" -t "${what%%:*}" "${what#*:}" >/dev/null \
        || fail "ansible-doc -t ${what%%:*} ${what#*:} does not render from the installed collection"
done
echo "  ansible-doc renders the modules and roles from the installed copy"

step "an infra repository of its own, installing from requirements.yml"
cp -a "$here/infra" "$infra"
mkdir -p "$infra/vendor"
cp "$tarball" "$work"/vendor/*.tar.gz "$infra/vendor/"
{
    echo "---"
    echo "# what this repository runs: nocloud.loadbalancer and the collections it declares"
    echo "collections:"
    for f in "$infra"/vendor/*.tar.gz; do
        printf '  - name: vendor/%s\n    type: file\n' "$(basename "$f")"
    done
} > "$infra/requirements.yml"
cd "$infra"
ansible-galaxy collection install --offline -r requirements.yml | grep -E 'was installed successfully'
ansible-galaxy collection list 2>/dev/null | grep -E '^[a-z_]+\.[a-z_0-9]+ ' | grep -v '^ansible\._' | sed 's/^/  /'
listed=$(ansible-galaxy collection list --format json 2>/dev/null | "$venv/bin/python" -c \
    'import json,sys; print(" ".join(sorted(c for p in json.load(sys.stdin).values() for c in p if not c.startswith("ansible._"))))')
want="ansible.posix community.docker community.library_inventory_filtering_v1 nocloud.loadbalancer"
[ "$listed" = "$want" ] || fail "collections visible to the infra repo: '$listed', expected '$want'"
[ -d collections/ansible_collections/nocloud/loadbalancer ] || fail "not installed into ./collections"

step "the lab $lab, from the infra repository"
ansible-playbook playbooks/lab.yml -e lab_action=down >/dev/null 2>&1 || true  # a run killed before its cleanup
lab_up=1
ansible-playbook playbooks/lab.yml | grep -E '"msg": "lab|^PLAY RECAP|ok=' || true
[ -s "/var/lib/nocloudlb-lab/$lab/inventory.yml" ] || fail "the lab wrote no inventory"
# the lab's hosts and how to reach them (nsenter PIDs) become part of our inventory
cp "/var/lib/nocloudlb-lab/$lab/inventory.yml" inventory/10-lab.yml

run_playbook() {
    local log=$work/$1.log
    if ! ansible-playbook "playbooks/$1" >"$log" 2>&1; then
        tail -n 60 "$log"
        fail "ansible-playbook playbooks/$1 (log above)"
    fi
    grep -A20 '^PLAY RECAP' "$log" | grep -E 'ok=' | sed 's/^/  /'
}

step "playbooks/site.yml: our web servers, then import_playbook nocloud.loadbalancer.site (the README's line)"
"$venv/bin/python" "$here/doc_playbooks.py" --infra "$infra" deploy || fail "the README's site.yml line (above)"
[ -d "$infra/.cache/wheelhouse" ] || fail "the wheelhouse was not built from the installed collection"
echo "  wheelhouse built from the installed collection: $(find "$infra/.cache/wheelhouse" -name '*.whl' -printf '%f ')"

step "playbooks/speakers.yml: the roles directly, then speaker_info on every node"
run_playbook speakers.yml

step "a broken venv on n2 (no pip, as python3-venv missing leaves it) and no nocloudlb on the PATH: rebuilt"
labctl=(python3 "$infra/collections/ansible_collections/nocloud/loadbalancer/roles/lab/files/labctl.py")
"${labctl[@]}" exec -n "$lab" n2 -- sh -c \
    'rm -rf /opt/nocloudlb/venv/lib/python3*/site-packages/pip /opt/nocloudlb/venv/bin/pip* /usr/local/bin/nocloudlb'
if "${labctl[@]}" exec -n "$lab" n2 -- /opt/nocloudlb/venv/bin/python -c 'import pip' 2>/dev/null; then
    fail "n2's venv still has pip: the breakage was not made"
fi
run_playbook speakers.yml
grep -E 'Remove a broken virtual environment' -A4 "$work/speakers.yml.log" | grep -E '^changed: \[n2\]' >/dev/null \
    || { grep -E 'Remove a broken virtual environment' -A4 "$work/speakers.yml.log"; fail "the role did not remove n2's broken venv"; }
"${labctl[@]}" exec -n "$lab" n2 -- /opt/nocloudlb/venv/bin/python -c 'import pip' \
    || fail "n2's venv has no pip after the role ran"
version=$("${labctl[@]}" exec -n "$lab" n2 -- nocloudlb --version) || fail "nocloudlb is not on n2's PATH after the role ran"
echo "  n2's venv rebuilt (the broken one removed), nocloudlb on the PATH again: $(echo "$version" | tr '\n' ' ')"

step "playbooks/check.yml: every VIP from the client"
run_playbook check.yml
grep -oE '"msg": "[^"]+ -> [^"]+"' "$work/check.yml.log" | sed 's/"msg": /  /'

step "the playbooks by FQCN from the infra repository, and the old hyphenated names as aliases"
for pb in site drain rolling_restart rotate_key migrate_to_speaker migrate_to_keepalived; do
    ansible-playbook --syntax-check "nocloud.loadbalancer.$pb" >/dev/null 2>"$work/syntax.err" \
        || { cat "$work/syntax.err"; fail "ansible-playbook --syntax-check nocloud.loadbalancer.$pb"; }
done
C=collections/ansible_collections/nocloud/loadbalancer
for pb in rolling-restart rotate-key migrate-to-speaker migrate-to-keepalived; do
    ansible-playbook --syntax-check "$C/playbooks/$pb.yml" >/dev/null 2>"$work/syntax.err" \
        || { cat "$work/syntax.err"; fail "ansible-playbook --syntax-check $C/playbooks/$pb.yml"; }
done
echo "  nocloud.loadbalancer.{site,drain,rolling_restart,rotate_key,migrate_to_speaker,migrate_to_keepalived} resolve;"
echo "  playbooks/{rolling-restart,rotate-key,migrate-to-speaker,migrate-to-keepalived}.yml import them"

step "docs/quickstart.md's commands on the lab, with the installed collection's labctl; the README's drain"
# nocloudlb from the nodes' PATH; the README's drain and undrain by FQCN in the infra repository,
# the quickstart's in the checkout (its ansible.cfg and .lab/collections link, made by make venv)
"$venv/bin/python" "$here/quickstart.py" --lab "$lab" --doc "$top/docs/quickstart.md" \
    --labctl "$infra/collections/ansible_collections/nocloud/loadbalancer/roles/lab/files/labctl.py" \
    --readme "$top/README.md" --infra "$infra" --top "$top" \
    || fail "the quickstart's commands (above)"

step "the ansible-playbook lines of docs/howto.md and docs/operations.md, as written, in the infra repository"
"$venv/bin/python" "$here/doc_playbooks.py" --infra "$infra" day2 || fail "a documented ansible-playbook line (above)"

step "nothing left in ~/.ansible/collections"
after=$(home_collections)
if [ "$before" != "$after" ]; then
    diff <(echo "$before") <(echo "$after") || true
    fail "$HOME/.ansible/collections changed during the test"
fi
if find "$HOME/.ansible/collections" -path '*nocloud/loadbalancer*' -maxdepth 4 2>/dev/null | grep -q .; then
    echo "  note: ~/.ansible/collections holds a nocloud.loadbalancer from before this test (not ours)"
fi
echo "  unchanged"

step "done: installed from the tarball and from requirements.yml, lab $lab deployed and checked in $((SECONDS - t0)) s"
