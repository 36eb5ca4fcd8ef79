#!/usr/bin/env bash
# Runs examples/go-scheduler as a user of an installed rdzv would: installs the library under a
# scratch prefix (scripts/install.sh), builds the example's own Go module against it through
# pkg-config (the binding's default build, not -tags rdzv_dev), checks that it links the
# installed library, and runs its test: a real etcd, a job of `rdzv run` launchers (this
# repository's debug build) that the scheduler grows, drains, kills, closes and purges.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --bin rdzv
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
# A prefix of this run's own (two runs at once must not collide). Go's build cache does not
# key on what pkg-config answers, so the prefix goes into the cache key through CGO_CPPFLAGS
# (as in install-test.sh).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
scripts/install.sh "$prefix"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig" LD_LIBRARY_PATH="$prefix/lib"
export CGO_CPPFLAGS="-DRDZV_PREFIX_ID=$(printf %s "$prefix" | md5sum | cut -c1-12)"
export RDZV_BIN="$target/debug/rdzv"
cd examples/go-scheduler
unformatted=$(gofmt -l .)
[ -z "$unformatted" ] || { echo "gofmt: not formatted: $unformatted" >&2; exit 1; }
go vet ./...
go build -o "$work/go-scheduler" .
# ldd's output is captured, then matched (no pipe into grep -q under pipefail).
linked=$(ldd "$work/go-scheduler")
grep -q "librdzv.so.0 => $prefix/lib/librdzv.so.0" <<<"$linked" ||
  { echo "go-scheduler does not link the installed library:" >&2; echo "$linked" >&2; exit 1; }
go test -count=1 -v ./...
