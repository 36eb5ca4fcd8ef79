#!/usr/bin/env bash
# Prints the directory of a virtual environment with zig and cargo-zigbuild (from the package
# registry), cached in ${RDZV_CACHE:-~/.cache/rdzv}/zigbuild-<version>: its bin/ has `zig` and
# `cargo-zigbuild`, the linker the cross and old-glibc builds use (scripts/wheel.sh --target,
# scripts/release.sh).
# `zig-env.sh --rust-target TRIPLE` also makes sure rustup has that target's standard library.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh

if [ "${1:-}" = --rust-target ]; then
  triple=${2:?zig-env.sh --rust-target takes a target triple}
  installed=$(rustup target list --installed)
  if ! grep -qx "$triple" <<<"$installed"; then
    rustup target add "$triple" >&2
  fi
  exit 0
fi

ZIG=(ziglang==0.17.1 cargo-zigbuild==0.24.1)
env="$(rdzv_cache)/zigbuild-0.24.1"
create() {
  python3 -m venv "$env"
  "$env/bin/python" -m pip install -q --no-cache-dir "${ZIG[@]}" >&2
  # cargo-zigbuild looks for `zig` on PATH; the package keeps it inside its module.
  ln -s "$("$env/bin/python" -c 'import ziglang, os; print(os.path.dirname(ziglang.__file__))')/zig" "$env/bin/zig"
}
cached_env "$env" "${ZIG[*]}" create
echo "$env"
