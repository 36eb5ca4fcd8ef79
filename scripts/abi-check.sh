#!/usr/bin/env bash
# Checks that librdzv keeps the C ABI of the release in abi/ (the README's ABI policy): the
# exported functions, their signatures, and the structs and enums they reach, as libabigail's
# abidw reads them from the library's debug information. Removing or changing anything of the
# baseline fails; additions pass. Handles the header declares opaque are compared by name only.
#
# Usage: scripts/abi-check.sh [LIBRARY]   check LIBRARY (built with debug info), by default the
#                                        debug build of the library, built first
#        scripts/abi-check.sh --update    replace the baseline with the library built now (at a
#                                        release: abi/librdzv-VERSION.abi, the crate's version)
#        scripts/abi-check.sh --self-test prove the check: build modified copies of the crate (a
#                                        function removed, a signature, a struct and a status
#                                        value changed: must fail; a function and a status
#                                        added: must pass)
# Needs abidw and abidiff (Debian's abigail-tools; scripts/install-deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

for tool in abidw abidiff; do
  command -v $tool >/dev/null || { echo "$tool not found: apt-get install abigail-tools" >&2; exit 1; }
done
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The public interface of a library, written to $2: abidw's dump (stable type ids, no paths or
# source lines) reduced to what the exported functions reach (scripts/lib/abi_public.py).
public_abi() {
  abidw --no-show-locs --no-comp-dir-path --no-corpus-path --type-id-style hash \
    --out-file "$work/dump.abi" "$1" &&
    python3 "$root/scripts/lib/abi_public.py" "$root/include/rdzv.h" "${RDZV_ABI_CRATE:-rdzv}" <"$work/dump.abi" >"$2"
}

shopt -s nullglob
baselines=(abi/librdzv-*.abi)
baseline=${baselines[0]:-}
[ ${#baselines[@]} -eq 1 ] || [ "${1:-}" = --update ] \
  || { echo "expected exactly one baseline abi/librdzv-VERSION.abi, found: ${baselines[*]:-none}" >&2; exit 1; }

# Compares a library with the baseline; prints abidiff's report, returns its status (bit 1:
# abidiff failed, 4: the ABI changed, 8: incompatibly; 1 as well when the dump failed). Added
# functions are left out of the report and the status (--no-added-syms); new enumerators are
# harmless to abidiff by default. Anything else reported is a break: a removed function, a
# changed parameter or return, a struct's size, fields or offsets, an enumerator's value.
compare() {
  public_abi "$1" "$work/current.abi" || return 1
  abidiff --no-added-syms "$baseline" "$work/current.abi"
}

# The workspace's default members, as the test command builds them first: a build of rdzv-c
# alone unifies its dependencies' features differently (the launcher's hyper and tonic
# features are not in it), so it would build the library again, rewriting the librdzv.so
# that the other suites' workers are loading meanwhile.
build() {
  cargo build --quiet
  echo "$target/debug/librdzv.so"
}

case "${1:-}" in
--update)
  lib=$(build)
  version=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "rdzv-c"))')
  public_abi "$lib" "$work/new.abi"
  rm -f "${baselines[@]}"
  cp "$work/new.abi" "abi/librdzv-$version.abi"
  echo "wrote abi/librdzv-$version.abi from $lib"
  ;;
--self-test)
  # Modified copies of the C library's crate, a package (and library) named rdzv_abi_mutant in
  # a workspace of its own:
  # built in the same target directory, they reuse its dependencies. The name must differ:
  # cargo keys a workspace member's build (its build script's output, the header among it) by
  # name, version and path inside the workspace, which a copy named rdzv would share with the
  # library, overwriting its generated header.
  export CARGO_TARGET_DIR="$target" RDZV_ABI_CRATE=rdzv_abi_mutant
  copy() {
    rm -rf "$work/src-copy" && mkdir "$work/src-copy"
    git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/src-copy"
    edit Cargo.toml $'[package]\nname = "rdzv-c"\n' $'[package]\nname = "rdzv_abi_mutant"\n'
    edit Cargo.toml $'name = "rdzv"\ncrate-type' $'name = "rdzv_abi_mutant"\ncrate-type'
    edit Cargo.toml $'[profile.dev.package.rdzv-c]\n' $'[profile.dev.package.rdzv_abi_mutant]\n'
    edit Cargo.toml $'\nmembers = [".", "core", "cli", "tests", "tests/common", "benches"]\ndefault-members = [".", "core", "cli", "tests", "tests/common"]\n' $'\nmembers = [".", "core"]\n'
  }
  # Edits a file of the copy: python replace, which must match exactly once.
  edit() {
    python3 - "$work/src-copy/$1" "$2" "$3" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
assert text.count(old) == 1, f"{path}: {old!r} found {text.count(old)} times"
open(path, "w").write(text.replace(old, new))
PY
  }
  build_copy() { (cd "$work/src-copy" && cargo build --quiet --offline -p rdzv_abi_mutant --lib) && echo "$target/debug/librdzv_abi_mutant.so"; }
  failures=0

  echo "--- a function removed, a signature, a struct and a status value changed: must fail"
  copy
  edit src/ffi/rendezvous.rs $'#[no_mangle]\npub extern "C" fn rdzv_num_lost(' $'pub extern "C" fn rdzv_num_lost('
  edit src/ffi/boundary.rs 'fn rdzv_error_status(error: *const rdzv_error_t)' 'fn rdzv_error_status(error: *const rdzv_error_t, _extra: u32)'
  edit src/ffi/rendezvous.rs $'    pub rank: u32,\n    /// Number of members of the round.\n    pub world_size: u32,' \
    $'    pub world_size: u32,\n    /// Number of members of the round.\n    pub rank: u32,'
  edit src/ffi/boundary.rs 'RDZV_ERR_TIMEOUT = 3,' 'RDZV_ERR_TIMEOUT = 30,'
  lib=$(build_copy)
  if report=$(compare "$lib"); then
    echo "FAIL: the check passed a library that breaks the ABI:" >&2
    failures=$((failures + 1))
  elif status=$? && [ $((status & 3)) -ne 0 ]; then
    echo "FAIL: could not compare (status $status)" >&2
    failures=$((failures + 1))
  else
    # Each change must be named in the report, not only one of them.
    for want in "1 Removed function" "rdzv_num_lost" "rdzv_error_status" "parameter 2 of type 'u32' was added" \
      "rdzv_round_t" "'u32 rank' offset changed" "'rdzv_status_t::RDZV_ERR_TIMEOUT' from value '3' to '30'"; do
      grep -qF -- "$want" <<<"$report" || { echo "FAIL: the report does not say: $want" >&2; failures=$((failures + 1)); }
    done
  fi
  echo "$report"

  echo "--- a function and a status added: must pass"
  copy
  edit src/ffi/boundary.rs $'    RDZV_ERR_CANCELLED = 9,\n}' $'    RDZV_ERR_CANCELLED = 9,\n    RDZV_ERR_SELF_TEST_ADDED = 10,\n}'
  cat >>"$work/src-copy/src/ffi/version.rs" <<'RS'

/// Added by scripts/abi-check.sh --self-test: an addition keeps the ABI.
#[no_mangle]
pub extern "C" fn rdzv_abi_self_test_added() -> u32 {
    1
}
RS
  lib=$(build_copy)
  grep -q ' rdzv_abi_self_test_added$' <<<"$(nm -D --defined-only "$lib")" || { echo "FAIL: the added function is not exported" >&2; failures=$((failures + 1)); }
  if report=$(compare "$lib"); then
    echo "passed, as it should"
  else
    echo "FAIL: the check refused a library that only adds a function and a status:" >&2
    failures=$((failures + 1))
  fi
  echo "$report"
  [ "$failures" -eq 0 ] && echo "self-test: the check fails on each break and passes an addition"
  [ "$failures" -eq 0 ]
  ;;
-h | --help)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  ;;
-*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
  ;;
*)
  lib=${1:-$(build)}
  if report=$(compare "$lib"); then
    echo "$lib keeps the ABI of $baseline"
  else
    status=$?
    echo "$report"
    if [ $((status & 3)) -ne 0 ]; then
      echo "could not compare $lib with $baseline (status $status)" >&2
    else
      echo "$lib breaks the ABI of $baseline (abidiff status $status): the C ABI may only grow" >&2
      echo "(README, ABI policy); a deliberate break moves the SONAME and, at its release, the baseline" >&2
    fi
    exit 1
  fi
  ;;
esac
