#!/usr/bin/env bash
# The routers' own config checkers for the router role's tests (tests/unit/roles/test_router_render.py):
# `bird -p` (bird2 2.0.12), `gobgpd --dry-run` (gobgpd 3.10) and `vtysh --dryrun` (frr 8.4), from
# Debian's packages. The packages are downloaded and unpacked with `dpkg -x`, never installed: their
# maintainer scripts would start the daemons on this machine's network. Libraries the machine
# lacks come along the same way (lib* dependencies not installed, recursively) and the wrappers in
# DEST/bin set LD_LIBRARY_PATH. Nothing here starts a daemon.
#   scripts/fetch-router-tools.sh [DEST]    (default: .cache/routers in the checkout; idempotent)
# Exit 0 and DEST/bin/{bird,gobgpd,vtysh} run; otherwise non-zero with the reason on stderr.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-${NOCLOUDLB_ROUTER_TOOLS:-$ROOT/.cache/routers}}"
PACKAGES=(bird2 gobgpd frr)
mkdir -p "$(dirname "$DEST")"
exec 9>"$DEST.lock"
flock 9
if [ -f "$DEST/.ok" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
    echo "fetch-router-tools: needs apt-get and dpkg (Debian)" >&2
    exit 2
fi

WORK="$(mktemp -d "$DEST.tmp.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"   # apt's _apt user downloads into it

# The packages and the lib* packages they need that this machine lacks, breadth first.
want=("${PACKAGES[@]}")
declare -A seen=()
i=0
while [ "$i" -lt "${#want[@]}" ]; do
    pkg="${want[$i]}"; i=$((i + 1))
    [ -n "${seen[$pkg]:-}" ] && continue
    seen[$pkg]=1
    while read -r dep; do
        case "$dep" in lib*) ;; *) continue ;; esac
        dpkg -s "$dep" >/dev/null 2>&1 || want+=("$dep")
    done < <(apt-cache depends --important "$pkg" 2>/dev/null | sed -n 's/^ *\(Pre\)\{0,1\}Depends: \([a-z0-9][^ <>]*\)$/\2/p')
done
fetch=("${!seen[@]}")

cd "$WORK"
if ! apt-get download -q "${fetch[@]}" >download.log 2>&1; then
    # a fresh machine may have no package lists yet
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get download -q "${fetch[@]}" >download.log 2>&1 || {
        echo "fetch-router-tools: apt-get download ${fetch[*]} failed:" >&2; tail -5 download.log >&2; exit 3; }
fi
mkdir root bin
for deb in ./*.deb; do
    dpkg -x "$deb" root
done

libs="$DEST/root/usr/lib/x86_64-linux-gnu:$DEST/root/usr/lib/x86_64-linux-gnu/frr"
libs="$libs:$DEST/root/lib/x86_64-linux-gnu"
write_wrapper() {  # NAME PATH-INSIDE-ROOT
    # shellcheck disable=SC2016  # $LD_LIBRARY_PATH and $@ expand when the wrapper runs
    printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
        "$libs" "$DEST/root$2" >"bin/$1"
    chmod 755 "bin/$1"
}
write_wrapper bird /usr/sbin/bird
write_wrapper gobgpd /usr/bin/gobgpd
write_wrapper vtysh /usr/bin/vtysh
printf '%s\n' ./*.deb | sed 's#^\./##' >packages.txt
rm -f ./*.deb download.log

rm -rf "$DEST"
mv "$WORK" "$DEST"
trap - EXIT
# every library found, and each tool answers
for tool in bird gobgpd vtysh; do
    real="$(sed -n 's/.*exec "\([^"]*\)".*/\1/p' "$DEST/bin/$tool")"
    missing="$(LD_LIBRARY_PATH="${libs}" ldd "$real" | grep 'not found' || true)"
    [ -z "$missing" ] || { echo "fetch-router-tools: $tool lacks libraries: $missing" >&2; exit 4; }
done
"$DEST/bin/bird" --version >/dev/null 2>&1
"$DEST/bin/gobgpd" --version >/dev/null
"$DEST/bin/vtysh" --help >/dev/null
touch "$DEST/.ok"
echo "router tools in $DEST/bin: $(tr '\n' ' ' <"$DEST/packages.txt")"
