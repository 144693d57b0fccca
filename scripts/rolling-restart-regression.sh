#!/usr/bin/env bash
# Defect 11 of issue 8, shown on the lab: the rolling-restart check of molecule/edges
# (molecule/edges/rolling.yml) FAILS against the speaker role as it was before the fix
# (its restart handler without `throttle: 1`, commit FIX^) and PASSES against this tree.
#
#   scripts/rolling-restart-regression.sh            # lab "rel" by default (LAB=name to change)
#
# The old role is this tree with roles/speaker/handlers/main.yml taken from FIX^ (the
# handler is the whole of the fix on the restart path; the rest of the role is unchanged),
# copied to a temporary directory outside the tree and removed at the end. Exit 0 only
# when the old role fails the check and the new one passes it. About 4 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
TREE=$PWD
LAB=${LAB:-rel}
export PATH="$TREE/.venv/bin:$PATH"
export ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks
FIX=$(git log --format=%h -S 'throttle: 1' -- roles/speaker/handlers/main.yml | tail -n 1)
[ -n "$FIX" ] || { echo "cannot find the fix commit of roles/speaker/handlers/main.yml" >&2; exit 2; }
WORK=$(mktemp -d /tmp/nocloudlb-rolling-regression.XXXXXX)
cleanup() {
    ansible-playbook -i molecule/edges/inventory molecule/_shared/destroy.yml -e lab_name="$LAB" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# the collection, importable as nocloud.loadbalancer, once from this tree and once from the old copy
mkdir -p "$WORK/new/ansible_collections/nocloud" "$WORK/old/ansible_collections/nocloud" "$WORK/oldtree"
ln -s "$TREE" "$WORK/new/ansible_collections/nocloud/loadbalancer"
git ls-files -z | xargs -0 cp --parents -t "$WORK/oldtree"
for f in molecule/edges/rolling.yml molecule/edges/verify.yml; do cp "$f" "$WORK/oldtree/$f"; done
git show "$FIX^:roles/speaker/handlers/main.yml" > "$WORK/oldtree/roles/speaker/handlers/main.yml"
ln -s "$WORK/oldtree" "$WORK/old/ansible_collections/nocloud/loadbalancer"
echo "fix commit: $(git log -1 --format='%h %s' "$FIX" | cut -c1-100)"
echo "old handler (from $FIX^):"; diff <(git show "$FIX^:roles/speaker/handlers/main.yml") roles/speaker/handlers/main.yml || true

run() {  # run COLLECTIONS PLAYBOOK ARGS...
    local coll=$1; shift
    ANSIBLE_COLLECTIONS_PATH="$coll" ansible-playbook -i molecule/edges/inventory -e lab_name="$LAB" "$@"
}
run "$WORK/new" molecule/_shared/destroy.yml >/dev/null 2>&1 || true
run "$WORK/new" molecule/_shared/create.yml >"$WORK/create.log" 2>&1 || { tail -n 40 "$WORK/create.log"; exit 2; }
run "$WORK/new" molecule/edges/converge.yml >"$WORK/converge.log" 2>&1 || { tail -n 40 "$WORK/converge.log"; exit 2; }

old_rc=0
(cd "$WORK/oldtree" && run "$WORK/old" molecule/edges/rolling.yml -e rolling_watchdog_sec=14) >"$WORK/old.log" 2>&1 || old_rc=$?
grep -E 'ROLLING|restarts overlapped' "$WORK/old.log" | sed 's/^/  old: /' || true
new_rc=0
run "$WORK/new" molecule/edges/rolling.yml -e rolling_watchdog_sec=15 >"$WORK/new.log" 2>&1 || new_rc=$?
grep -E 'ROLLING|restarts overlapped' "$WORK/new.log" | sed 's/^/  new: /' || true
echo "old role ($FIX^ handler): rolling check rc=$old_rc (must fail); this tree: rc=$new_rc (must pass)"
if [ "$old_rc" -eq 0 ] || [ "$new_rc" -ne 0 ]; then
    tail -n 30 "$WORK/old.log" "$WORK/new.log"
    exit 1
fi
echo "OK: the check fails before the fix and passes after it"
