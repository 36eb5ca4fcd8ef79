#!/usr/bin/env bash
# Builds rdzv in release mode and installs the C library and the C++ binding under a prefix:
#   lib/librdzv.so.0.1.0, lib/librdzv.so.0 (the SONAME) and lib/librdzv.so -> it, lib/librdzv.a,
#   include/rdzv.h, include/rdzv/rdzv.hpp (and gloo.hpp, for programs that use Gloo),
#   lib/pkgconfig/rdzv.pc, lib/cmake/rdzv/ (find_package), share/doc/rdzv/LICENSE, and the
#   `rdzv` command (bin/rdzv: `rdzv run`, the torchrun replacement, and the operator commands).
# Usage: scripts/install.sh [PREFIX]   (default /usr/local; the pkg-config file is relocatable)
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-/usr/local}
cargo build --release --quiet -p rdzv-c --lib -p rdzv-cli --bin rdzv
# Where cargo built it: CARGO_TARGET_DIR (or cargo's configuration) if set, else target/.
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
cmake -S bindings/cpp -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_LIBDIR=lib \
  -DRDZV_BUILD_TESTS=OFF -DRDZV_BUILD_EXAMPLES=OFF -DRDZV_LIBRARY="$target/release/librdzv.so" >/dev/null
cmake --install "$build" --prefix "$prefix" >/dev/null
install -D -m 0755 "$target/release/rdzv" "$prefix/bin/rdzv"
echo "installed rdzv $(sed -n '/^version = "/{s/^version = "\(.*\)"/\1/p;q;}' Cargo.toml) under $prefix"
