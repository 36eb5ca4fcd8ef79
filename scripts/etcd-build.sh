#!/usr/bin/env bash
# Builds the etcd server of each version in scripts/etcd-versions (or the versions given) from
# its Go module, into a cache that later runs reuse: ${RDZV_CACHE:-~/.cache/rdzv}/etcd-vX.Y.Z/etcd.
# Prints one "VERSION DIR" line per version. Debian's etcd (3.4) comes from apt-get instead.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${RDZV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdzv}
versions=("$@")
[ ${#versions[@]} -gt 0 ] || mapfile -t versions < <(grep -v '^#' scripts/etcd-versions | grep .)
for v in "${versions[@]}"; do
  dir="$cache/etcd-$v"
  if [ ! -x "$dir/etcd" ]; then
    echo "building etcd $v from its Go module (once; cached in $dir)" >&2
    work=$(mktemp -d)
    (
      cd "$work"
      export GOTOOLCHAIN=local GOFLAGS=-mod=mod
      go mod init etcd-build >/dev/null 2>&1
      go get "go.etcd.io/etcd/server/v3@$v" >/dev/null 2>&1
      go build -trimpath -o etcd.partial go.etcd.io/etcd/server/v3
    )
    "$work/etcd.partial" --version | grep -q "etcd Version: ${v#v}" \
      || { echo "built etcd does not report version $v" >&2; exit 1; }
    mkdir -p "$dir"
    mv "$work/etcd.partial" "$dir/etcd" # rename last: an interrupted build leaves no binary
    rm -rf "$work"
  fi
  echo "$v $dir"
done
