#!/usr/bin/env bash
# Prints the directory of a Debian root filesystem with Python 3 (python3, venv, pip) for
# SUITE and ARCH (a Debian architecture: amd64, arm64), made once by mmdebstrap and cached in
# ${RDZV_CACHE:-~/.cache/rdzv}/rootfs-SUITE-ARCH (about 100 MB, a minute to make).
# Used by scripts/wheel-check.sh to run the wheels on another architecture (under qemu-user)
# and on an older glibc (bullseye: glibc 2.31).
#
# The packages are only extracted (mmdebstrap --variant=extract), not configured: nothing of
# the other architecture runs while the tree is made, so no binfmt_misc registration is needed.
# The Debian mirror is RDZV_DEBIAN_MIRROR, else the first one this machine's apt uses.
# Usage: scripts/rootfs.sh SUITE ARCH
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh
suite=${1:?usage: rootfs.sh SUITE ARCH} arch=${2:?usage: rootfs.sh SUITE ARCH}
PACKAGES=python3,python3-venv,python3-pip
dir="$(rdzv_cache)/rootfs-$suite-$arch"
make_rootfs() {
  command -v mmdebstrap >/dev/null || { echo "rootfs.sh: mmdebstrap is missing (apt-get install mmdebstrap)" >&2; exit 1; }
  local mirror=${RDZV_DEBIAN_MIRROR:-}
  if [ -z "$mirror" ]; then
    mirror=$(apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' 2>/dev/null | grep -v -- '-security' | head -n1 || true)
    [ -n "$mirror" ] || { echo "rootfs.sh: no Debian mirror in apt's configuration: set RDZV_DEBIAN_MIRROR" >&2; exit 1; }
  fi
  mmdebstrap --quiet --variant=extract --architectures="$arch" --include="$PACKAGES" "$suite" "$dir" "$mirror" >&2
}
cached_env "$dir" "$suite $arch $PACKAGES" make_rootfs
echo "$dir"
