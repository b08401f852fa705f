#!/usr/bin/env bash
# The README's first command (scripts/setup.sh) in a fresh Debian 12 root, so that an install step
# missing from scripts/ turns CI red. CI runs on a machine that keeps what earlier sessions installed
# by hand: there a missing package stays hidden unless the build starts from nothing.
#
#   bash .ci/fresh-root.sh            # setup.sh of the committed HEAD in a fresh root
#   bash .ci/fresh-root.sh --tests    # ... then scripts/test.sh there too
#
# Needs root and the Debian mirror this machine's apt uses. The pristine root (debootstrap
# minbase) is made once and cached in /var/tmp; each run works on a copy of it. Mounts live in a
# private mount namespace (unshare -m), so they vanish with the run and the copy can be removed.
set -euo pipefail
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
shared=$(cd "$repo/../shared" 2>/dev/null && pwd || true)
run_tests=0; [[ ${1:-} == --tests ]] && run_tests=1
base=/var/tmp/flexh2o-debian12.base
work=/var/tmp/flexh2o-debian12.work

[[ $(id -u) -eq 0 ]] || { echo "fresh-root: needs root (debootstrap, chroot)" >&2; exit 2; }
mirror=$( (cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true) \
  | awk '/^(URIs:|deb) / && $2 !~ /security/ {print $2; exit}')
[[ -n $mirror ]] || { echo "fresh-root: no Debian mirror found in /etc/apt" >&2; exit 2; }
if ! command -v debootstrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

if [[ ! -f $base/.complete ]]; then
  rm -rf "$base"
  echo "== fresh-root: making a pristine Debian 12 root (cached in $base)"
  debootstrap --variant=minbase --include=ca-certificates,git,sudo bookworm "$base" "$mirror" \
    >/var/tmp/flexh2o-debian12.log 2>&1 \
    || { echo "fresh-root: debootstrap failed, see /var/tmp/flexh2o-debian12.log" >&2; exit 2; }
  touch "$base/.complete"
fi

rm -rf "$work"
cp -a "$base" "$work"
trap 'rm -rf "$work"' EXIT
cp /etc/resolv.conf "$work/etc/resolv.conf" 2>/dev/null || true
# This machine's apt sources (with its updates and security suites) replace debootstrap's one line.
if cp /etc/apt/sources.list.d/*.sources "$work/etc/apt/sources.list.d/" 2>/dev/null; then
  rm -f "$work/etc/apt/sources.list"
fi
mkdir -p "$work/src"
git clone -q "$repo" "$work/src/project"     # committed work only, as a clean clone
[[ -n $shared ]] && cp -a "$shared" "$work/src/shared"

# The host's compiler cache, shared with the root: an object is reused only for the same
# preprocessed source and compiler (CMakeLists.txt hashes paths relative to the tree), so a
# header or library missing in the root still fails there.
cache=$( (command -v ccache >/dev/null && ccache -k cache_dir) || true)
if [[ -n $cache ]]; then mkdir -p "$cache" "$work/root/.cache/ccache"; fi

# Runs one command inside the root, with /proc, /sys and /dev (and the compiler cache) mounted in
# a private namespace.
in_root() {
  unshare --mount --propagation private bash -c '
    set -e; w=$1; cache=$2; shift 2
    for m in proc sys dev; do mount --rbind "/$m" "$w/$m"; done
    [[ -z $cache ]] || mount --bind "$cache" "$w/root/.cache/ccache"
    exec chroot "$w" /usr/bin/env -i HOME=/root CI=true \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -c "cd /src/project && $*"
  ' in_root "$work" "$cache" "$@"
}

echo "== fresh-root: scripts/setup.sh in a fresh Debian 12 root (HEAD $(git -C "$repo" rev-parse --short HEAD))"
SECONDS=0
in_root bash scripts/setup.sh || { echo "FRESH ROOT: scripts/setup.sh failed after ${SECONDS}s" >&2; exit 1; }
echo "== fresh-root: setup passed in ${SECONDS}s"
if (( run_tests )); then
  SECONDS=0
  in_root bash scripts/test.sh || { echo "FRESH ROOT: scripts/test.sh failed after ${SECONDS}s" >&2; exit 1; }
  echo "== fresh-root: tests passed in ${SECONDS}s"
fi
