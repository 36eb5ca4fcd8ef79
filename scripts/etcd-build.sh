#!/usr/bin/env bash
# Builds the etcd server of each version in scripts/etcd-versions (or of the versions given,
# vX.Y.Z) from its Go module, into a cache that later runs reuse:
# ${RDZV_CACHE:-${XDG_CACHE_HOME:-~/.cache}/rdzv}/etcd-vX.Y.Z/etcd. Prints one "VERSION DIR"
# line per version on stdout; progress, build times and errors go to stderr. Debian's etcd
# (3.4) comes from apt-get instead.
#
# Uses the local Go toolchain only (GOTOOLCHAIN=local): it must be as new as the etcd version's
# go.mod asks, or the build fails saying so. Static (CGO_ENABLED=0), as etcd's release binaries
# are: the file runs on any Linux of its architecture, whatever its libc, which lets
# scripts/etcd-wheel.sh ship it as it is. A cached binary is used only if it reports its version
# and is static (one built before this was linked against libc: built again, once); a new one is
# verified, then renamed into place, so an interrupted build never leaves a binary behind.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${RDZV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdzv}
if [ $# -gt 0 ]; then
  versions=("$@")
else
  pinned=$(grep -v '^#' scripts/etcd-versions | grep .)
  mapfile -t versions <<<"$pinned"
fi

work=""
trap '[ -z "$work" ] || rm -rf "$work"' EXIT

reports() { # BINARY VERSION: the binary runs, says it is that version, and is static
  local out
  [ -x "$1" ] || return 1
  # Captured, then matched: piped into grep -q, which exits at its match, etcd could die of
  # SIGPIPE writing its next line and fail the check under pipefail.
  out=$("$1" --version 2>/dev/null) || return 1
  grep -qx "etcd Version: ${2#v}" <<<"$out" || return 1
  # Static: no program interpreter to load it (a cgo build asks for glibc's).
  out=$(readelf -lW "$1" 2>/dev/null) || return 1
  ! grep -q 'Requesting program interpreter' <<<"$out"
}

for v in "${versions[@]}"; do
  [[ $v =~ ^v3\.[0-9]+\.[0-9]+$ ]] || { echo "not an etcd release (vX.Y.Z): '$v'" >&2; exit 1; }
  dir="$cache/etcd-$v"
  if ! reports "$dir/etcd" "$v"; then
    echo "building etcd $v from its Go module (once; cached in $dir)" >&2
    start=$SECONDS
    work=$(mktemp -d -t rdzv-etcd-build.XXXXXX)
    if ! (
      # Chained: set -e does not apply inside an if condition. No -mod=mod, so that the build
      # cannot pick another version of anything than the one go get resolved.
      cd "$work" && export GOTOOLCHAIN=local GOFLAGS= GOWORK=off CGO_ENABLED=0 &&
        go mod init etcd-build &&
        go get "go.etcd.io/etcd/server/v3@$v" &&
        go build -trimpath -o etcd go.etcd.io/etcd/server/v3
    ) >"$work/build.log" 2>&1; then
      cat "$work/build.log" >&2
      echo "building etcd $v failed (with $(go version))" >&2
      exit 1
    fi
    reports "$work/etcd" "$v" || { echo "the etcd built for $v does not report that version, or is not static" >&2; exit 1; }
    mkdir -p "$dir"
    # Copied next to its final name, then renamed: the rename is atomic, the copy is not.
    cp "$work/etcd" "$dir/etcd.partial.$$"
    mv -f "$dir/etcd.partial.$$" "$dir/etcd"
    rm -rf "$work"
    work=""
    echo "built etcd $v in $((SECONDS - start)) s" >&2
  fi
  echo "$v $dir"
done
