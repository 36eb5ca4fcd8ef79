#!/usr/bin/env bash
# Prints a directory where the library cargo built for PROFILE (debug, the default, or release)
# has the names an installed library has: its SONAME (librdzv.so.0), which every program
# linked against it records and looks for at run time, and librdzv.so (for -lrdzv), both links
# to cargo's librdzv.so. A program linked in the build tree with
#   -L"$dir" -Wl,-rpath,"$dir" -lrdzv
# then loads the library as one linked against an installed prefix does. cargo leaves only
# librdzv.so (a build script may write only in its own OUT_DIR), so the scripts, the C++ build
# and the Go binding's rdzv_dev build use this directory instead. Made in cargo's target
# directory (TARGET/dev-lib/PROFILE) on first use; the links are relative and follow later
# builds. Builds nothing: run cargo build first.
#
# Usage: dir=$(scripts/dev-lib.sh [debug|release])
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-debug}
case $profile in
  debug | release) ;;
  *) echo "usage: scripts/dev-lib.sh [debug|release]" >&2; exit 2 ;;
esac
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
built="$target/$profile/librdzv.so"
[ -f "$built" ] || { echo "dev-lib.sh: $built not found: build it first (cargo build$([ "$profile" = release ] && echo " --release"))" >&2; exit 1; }
soname=$(readelf -d "$built" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -n "$soname" ] || { echo "dev-lib.sh: $built has no SONAME" >&2; exit 1; }
dir="$target/dev-lib/$profile"
mkdir -p "$dir"
# Each link made once (scripts may run this side by side): one already there is kept.
link() { [ -L "$dir/$2" ] || ln -s "$1" "$dir/$2" 2>/dev/null || [ -L "$dir/$2" ]; }
link "../../$profile/librdzv.so" "$soname"
link "$soname" librdzv.so
echo "$dir"
