#!/usr/bin/env bash
# Checks the workspace's shape: the Rust library (rdzv, core/) builds nothing it does not use,
# in particular no command-line parser, which belongs to the `rdzv` command's crate (rdzv-cli),
# and no C library: no build script, no cbindgen, no cdylib or staticlib, which are the C
# library's crate's (rdzv-c, the repository's root); each published crate ships what it should
# and nothing of the repository around it (`cargo package --list`), and all three build from
# their packages as `cargo publish` would upload them (`--dry-run`). The tests' and the
# benchmarks' crates (and the tests' harness) are not published.
set -euo pipefail
cd "$(dirname "$0")/.."

deps=$(cargo tree -p rdzv -e normal --prefix none --format '{p}')
if grep -qE '^clap ' <<<"$deps"; then
  echo "the library crate depends on clap:" >&2
  cargo tree -p rdzv -e normal -i clap >&2
  exit 1
fi
echo "rdzv: $(sort -u <<<"$deps" | wc -l) crates in its normal dependency tree, clap not among them"
build=$(cargo tree -p rdzv -e build --prefix none --format '{p}' --depth 1)
if grep -qE '^cbindgen ' <<<"$build"; then
  echo "the Rust library runs cbindgen: the header is the C library's (rdzv-c)" >&2
  exit 1
fi
kinds=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "lib" in t["kind"] or "cdylib" in t["kind"] or "custom-build" in t["kind"]:
            print(p["name"], " ".join(sorted(t["kind"])))')
grep -qx "rdzv lib" <<<"$kinds" || { echo "rdzv must be a plain Rust library (no build script, cdylib or staticlib): $kinds" >&2; exit 1; }
grep -qx "rdzv-c cdylib staticlib" <<<"$kinds" || { echo "rdzv-c must be the C library alone (cdylib, staticlib): $kinds" >&2; exit 1; }
echo "rdzv: a Rust library alone (no build script, no cbindgen); rdzv-c: the cdylib and staticlib"

# The file lists, matched against what each crate must and must not ship.
list() { cargo package --list --allow-dirty --quiet -p "$1"; }
lib=$(list rdzv)
for must in src/lib.rs src/rendezvous/mod.rs src/blocking.rs Cargo.toml; do
  grep -qx "$must" <<<"$lib" || { echo "rdzv's package lacks $must" >&2; exit 1; }
done
if grep -E '^(tests|bindings|scripts|examples|benches|docs|cli|include)/|^src/ffi/|^build.rs$' <<<"$lib" >&2; then
  echo "rdzv's package ships the files above, which are not the Rust library's" >&2
  exit 1
fi
echo "rdzv: $(wc -l <<<"$lib") files"
clib=$(list rdzv-c)
for must in src/lib.rs build.rs cbindgen.toml include/rdzv.h src/ffi/rendezvous.rs LICENSE README.md CHANGELOG.md Cargo.toml; do
  grep -qx "$must" <<<"$clib" || { echo "rdzv-c's package lacks $must" >&2; exit 1; }
done
if grep -E '^(tests|bindings|scripts|examples|benches|docs|cli|core)/|^src/(rendezvous|store|backend)/' <<<"$clib" >&2; then
  echo "rdzv-c's package ships the files above, which are not the C library's" >&2
  exit 1
fi
echo "rdzv-c: $(wc -l <<<"$clib") files"
cli=$(list rdzv-cli)
for must in src/main.rs src/agent/mod.rs src/workers/mod.rs src/args/mod.rs src/settings/mod.rs src/host/mod.rs Cargo.toml; do
  grep -qx "$must" <<<"$cli" || { echo "rdzv-cli's package lacks $must" >&2; exit 1; }
done
if grep -E '^tests/' <<<"$cli" >&2; then
  echo "rdzv-cli's package ships its tests, which need the repository's harness" >&2
  exit 1
fi
echo "rdzv-cli: $(wc -l <<<"$cli") files"
publish=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    print(p["name"], "unpublished" if p["publish"] == [] else "published")')
for private in rdzv-tests rdzv-test-support rdzv-bench; do
  grep -qx "$private unpublished" <<<"$publish" || { echo "$private must not be published: $publish" >&2; exit 1; }
done

# A test file that nothing names would be left out silently: tests/ lists its targets, and
# tests/all/main.rs its areas.
for file in tests/*.rs; do
  name=$(basename "$file" .rs)
  [ "$name" = header ] && continue
  grep -qx "path = \"$name.rs\"" tests/Cargo.toml || { echo "tests/Cargo.toml has no [[test]] for $file" >&2; exit 1; }
done
for file in tests/all/*.rs tests/all/*/mod.rs; do
  name=$(basename "${file%/mod.rs}" .rs)
  [ "$name" = main ] && continue
  grep -qx "mod $name;" tests/all/main.rs || { echo "tests/all/main.rs does not declare mod $name ($file)" >&2; exit 1; }
done
echo "rdzv-tests: every tests/*.rs is a test target, every tests/all/ area a module of it"

# One version everywhere it is written: the workspace's (Cargo.toml) is the Python package's
# and the C++/CMake package's; the C header's version macros come from it at build time.
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
python_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' bindings/python/pyproject.toml)
cmake_version=$(sed -n 's/^project(rdzv_cpp VERSION \([0-9.]*\) .*/\1/p' bindings/cpp/CMakeLists.txt)
for pair in "bindings/python/pyproject.toml:$python_version" "bindings/cpp/CMakeLists.txt:$cmake_version"; do
  [ "${pair#*:}" = "$version" ] || { echo "${pair%%:*} says version '${pair#*:}', Cargo.toml $version" >&2; exit 1; }
done
echo "version $version in Cargo.toml, pyproject.toml and CMakeLists.txt"

# What `cargo publish` would upload, each built alone from its package (nothing is uploaded).
# One call for all three: rdzv-c and rdzv-cli depend on rdzv 0.1.0, which the registry does not
# have until it is published; published together, cargo resolves it to the package made here (a
# registry of its own under target/package). --allow-dirty: the check runs on work in progress too.
start=$SECONDS
# The packages of an earlier run stay under the same version, in target/package and unpacked in
# CARGO_HOME's sources of that local registry (a directory named without a host, "-HASH"): cargo
# would build the launcher against that stale copy of the library and fail on what changed since.
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
rm -rf "$target/package" "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/rdzv-"$version" \
  "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/rdzv-cli-"$version" \
  "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/rdzv-c-"$version"
# And the library built from that registry by an earlier run: cargo takes a registry crate of a
# given version as unchanging and would link the old build. Its dep-info names its sources.
for dep in "$target"/*/deps/rdzv-*.d; do
  [ -f "$dep" ] || continue
  if grep -q "/registry/src/-[^/]*/rdzv-$version/" "$dep"; then
    hash=${dep##*/rdzv-}
    hash=${hash%.d}
    deps=$(dirname "$dep")
    rm -rf "$(dirname "$deps")/.fingerprint/rdzv-$hash" "$deps/librdzv-$hash".* "$dep"
  fi
done
cargo publish --dry-run --allow-dirty --quiet -p rdzv -p rdzv-c -p rdzv-cli 2>&1 | { grep -vE '^warning: (ignoring (example|test) |aborting upload due to dry run)' || true; }
echo "rdzv, rdzv-c, rdzv-cli: cargo publish --dry-run builds all three from their packages ($((SECONDS - start)) s)"
