#!/usr/bin/env bash
# Builds the release files for Linux, for x86_64 and aarch64, from this machine (any Linux
# with Rust, cmake and Python 3; zig and cargo-zigbuild come from the package registry, cached:
# scripts/zig-env.sh), into OUTDIR (default dist/), printing each file's path:
#
#   rdzv-VERSION-linux-ARCH          the `rdzv` command, static (musl): runs on any Linux of
#                                    that architecture, whatever its libc, or none
#   rdzv-VERSION-linux-ARCH.tar.gz   for C, C++ and Go users: a prefix laid out as
#                                    scripts/install.sh lays one (lib/librdzv.so.X.Y.Z and its
#                                    links, lib/librdzv.a, include/, lib/pkgconfig/rdzv.pc,
#                                    lib/cmake/rdzv/, share/doc/rdzv/LICENSE) plus bin/rdzv
#                                    (the static command); unpack it anywhere, the pkg-config
#                                    and CMake files are relocatable
#
# The libraries are the build the wheels ship (scripts/wheel.sh --target: the same cargo
# command, linked by zig against glibc 2.17's symbols), so a release build after the wheels'
# compiles nothing again. The command is linked statically against musl, also by zig.
# Usage: scripts/release.sh [--target x86_64|aarch64] [OUTDIR]   (default: both architectures)
set -euo pipefail
cd "$(dirname "$0")/.."
GLIBC=2.28 # as scripts/wheel.sh
archs=(x86_64 aarch64)
if [ "${1:-}" = --target ]; then
  [[ ${2:-} =~ ^(x86_64|aarch64)$ ]] || { echo "release.sh: --target takes x86_64 or aarch64, not '${2:-}'" >&2; exit 2; }
  archs=("$2")
  shift 2
elif [[ ${1:-} == -* ]]; then
  echo "release.sh: unknown option '$1' (usage: release.sh [--target x86_64|aarch64] [OUTDIR])" >&2
  exit 2
fi
out=${1:-dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
version=$(sed -n '/^version = "/{s/^version = "\(.*\)"/\1/p;q;}' Cargo.toml)
zig_env=$(scripts/zig-env.sh)
export PATH="$zig_env/bin:$PATH"
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

for arch in "${archs[@]}"; do
  gnu=$arch-unknown-linux-gnu musl=$arch-unknown-linux-musl
  scripts/zig-env.sh --rust-target "$gnu"
  scripts/zig-env.sh --rust-target "$musl"
  # The library: the command setuptools-rust runs for the wheel (bindings/python/setup.py).
  cargo-zigbuild rustc --quiet --lib --manifest-path "$PWD/Cargo.toml" --release \
    --crate-type rlib --crate-type cdylib --crate-type staticlib --target "$gnu.$GLIBC"
  # The command, static; debug information stripped at the link, as the wheel strips it. In a
  # target directory of its own: it shares no compiled crate with the library's build (another
  # libc), and cargo would otherwise let only one of the two build at a time.
  cargo-zigbuild rustc --quiet -p rdzv-cli --bin rdzv --release --target "$musl" --target-dir "$target/static" \
    -- -C strip=debuginfo
  bin="$out/rdzv-$version-linux-$arch"
  cp "$target/static/$musl/release/rdzv" "$bin"
  info=$(file -b "$bin")
  [[ $info == *"statically linked"* || $info == *"static-pie linked"* ]] \
    || { echo "release.sh: $bin is not static: $info" >&2; exit 1; }
  echo "$bin"

  name="rdzv-$version-linux-$arch"
  cmake -S bindings/cpp -B "$stage/cmake-$arch" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_LIBDIR=lib \
    -DRDZV_BUILD_TESTS=OFF -DRDZV_BUILD_EXAMPLES=OFF -DRDZV_LIBRARY="$target/$gnu/release/librdzv.so" >/dev/null
  cmake --install "$stage/cmake-$arch" --prefix "$stage/$name" >/dev/null
  install -D -m 755 "$bin" "$stage/$name/bin/rdzv"
  tar -C "$stage" --owner=0 --group=0 --numeric-owner -czf "$out/$name.tar.gz" "$name"
  echo "$out/$name.tar.gz"
done
