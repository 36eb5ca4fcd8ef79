#!/usr/bin/env bash
# Runs every test of rdzv: installs what is missing, checks formatting and lints, then, against
# the newest etcd (built from its Go module, cached), the C ABI against the last release's
# (scripts/abi-check.sh, and its self-test), the Rust unit and integration tests (real
# etcd, real processes, the C program and header drift, and 90 s of random faults
# against a running job: tests/all/chaos), the C++, Go and Python bindings' suites, the demo, the
# README's quick starts, the installed library used from outside the repository and the Go
# scheduler example on it (launchers added, drained, killed); the Rust integration and fault
# suites again against every other etcd version (Debian's 3.4, 3.5, 3.6), but the few whose
# etcd use does not change with it (scripts/lib/etcd-test-targets.sh); real PyTorch
# (torchrun with the etcd-v3 backend) in a cached environment; and unmodified JAX, Lightning
# and DeepSpeed programs under rdzv run in cached environments (scripts/jax-env.sh and, layered
# on the PyTorch one, scripts/torch-frameworks-env.sh). RDZV_SKIP_TORCH=1 skips the PyTorch
# suites (the first run downloads about 5 GB). Prints each suite's time, the total, and one
# "N passed, N failed" line at the end.
#
# How it keeps to minutes: everything is compiled first, one build at a time (the checks that
# are builds themselves with it); then the suites run in lanes side by side. Most of a suite's
# time is spent waiting on purpose (leases, last calls, timeouts), not computing, so the lanes
# share the 2 cores well. A lane runs its suites one after the other; each suite's output goes
# to a log of its own, printed whole when the suite ends, so lines of two suites never mix.
# RDZV_TEST_LANES=1 runs every suite in one lane, one after the other, as before.
#
# Not here, for their cost (cross and static release builds, root filesystems, qemu): the
# checks of the wheels to publish and of the release files, scripts/wheel-check.sh and
# scripts/release-check.sh (docs/INSTALL.md).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
scripts/install-deps.sh

logs=$(mktemp -d -t rdzv-test.XXXXXX)
trap 'rm -rf "$logs"' EXIT

# suite NAME CMD...: runs CMD with its output in a log of its own, then prints the log whole
# (under a lock, so that two lanes' logs never interleave) with the suite's verdict and time.
# The verdict and time are kept for the summary, in the order the suites were declared.
declared=0
suite() {
  local name=$1 id start status
  shift
  declared=$((declared + 1))
  id=$(printf '%04d' "$declared")
  echo "$name" >"$logs/$id.name"
  start=$SECONDS
  if "$@" >"$logs/$id.log" 2>&1 </dev/null; then status=ok; else status=FAILED; fi
  echo "$status $((SECONDS - start))" >"$logs/$id.result"
  {
    flock 8
    echo "=== $name"
    cat "$logs/$id.log"
    echo "=== $name: $status ($((SECONDS - start)) s)"
  } 8>"$logs/print.lock"
}

# lane FN ARGS...: the suites of one lane, the function FN, run in the background. Each lane
# numbers its suites from a block of its own, so the summary keeps the order of declaration.
lanes=()
lane() {
  local base=$(( (${#lanes[@]} + 1) * 100 ))
  if [ "${RDZV_TEST_LANES:-}" = 1 ]; then
    declared=$base
    "$@"
  else
    ( declared=$base; "$@" ) &
    lanes+=($!)
  fi
}

# The cached Python environments are mostly downloads: on a fresh machine they are made in the
# background while etcd and rdzv compile, and a suite that needs one waits on its lock.
if [ "${RDZV_SKIP_TORCH:-0}" != 1 ]; then
  (scripts/torch-env.sh && scripts/torch-frameworks-env.sh) >"$logs/envs-torch.log" 2>&1 &
fi
(scripts/jax-env.sh; scripts/mypy-env.sh) >"$logs/envs-other.log" 2>&1 &

# etcd: Debian's (3.4, from apt-get) and the pinned versions built from their Go modules
# (scripts/etcd-versions, cached). The newest goes first on PATH for every suite.
etcd_version() { "$1/etcd" --version | awk '/^etcd Version:/ {print $3}'; }
debian_etcd=$(dirname "$(command -v etcd)")
built=$(scripts/etcd-build.sh) # fails the command if any pinned version fails to build
mapfile -t built <<<"$built"
newest=${built[-1]#* }
export PATH="$newest:$PATH"
echo "etcd for every suite: $(etcd_version "$newest") ($newest)"

# Every build first, one at a time: the library the C, C++, Go and Python tests load (cargo
# test does not build the cdylib), every test program, and the release builds the install
# checks use. After this, no suite compiles Rust, so no lane waits on another's build.
echo "=== building"
build_start=$SECONDS
cargo build --quiet
cargo test --quiet --no-run 2>&1 | { grep -v '^ *Executable ' || true; }
cargo build --release --quiet -p rdzv-c --lib -p rdzv-cli --bin rdzv -p rdzv-bench --bin soak
echo "=== building: done ($((SECONDS - build_start)) s)"
# The bindings' suites are pointed at the library just built, in cargo's target directory
# (CARGO_TARGET_DIR or cargo's configuration, else target/); the Go binding's own flags name
# target/debug, and CGO_LDFLAGS come before them.
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
lib="$target/debug"
# The C++, Go and Python suites start their etcd with this program (tests/fixtures), built above.
export RDZV_ETCD_TEST_SERVER="$lib/etcd-test-server"

# The checks that compile (clippy, the crates' packages, the ABI self-test's modified copies)
# run here too, before the lanes, for the same reason.
suite "rustfmt" cargo fmt --all --check
suite "docs: every test a doc names exists, and each parity row's test uses its flag" python3 scripts/docs-check.py
suite "clippy" cargo clippy --workspace --all-targets --quiet -- -D warnings
suite "crates: the library alone depends on no command-line parser; what each published crate ships" scripts/crates-check.sh
suite "C ABI: the library keeps 0.1.0's ABI (abidiff against abi/)" scripts/abi-check.sh "$lib/librdzv.so"
suite "C ABI check's self-test: a removed function, changed signature, struct and status fail; additions pass" scripts/abi-check.sh --self-test

# The lanes. The newest etcd's Rust suites in one; each older etcd's in its own (the same
# compiled tests, another server); the bindings and the demo in one; the README quick starts and the install checks in one; the
# framework suites, which find their cached environments by themselves, in one.
rust_newest() {
  suite "rust tests (unit, etcd integration, processes, C ABI, header, chaos) on etcd $(etcd_version "$newest")" \
    env RDZV_TORCH_PYTHON= RDZV_TORCH_FRAMEWORKS_PYTHON= RDZV_JAX_PYTHON= cargo test --no-fail-fast
}
# The protocol against every other etcd version people run: each Rust test target that starts
# etcd; unit and doc tests need no etcd.
. scripts/lib/etcd-test-targets.sh
integration=()
while read -r name; do integration+=(--test "$name"); done < <(etcd_test_targets)
mapfile -t skips < <(etcd_test_skips)
older_etcd() {
  suite "rust integration and fault suites on etcd $(etcd_version "$1") (but chaos, the upgrade, valgrind, scale)" \
    env PATH="$1:$PATH" cargo test --no-fail-fast "${integration[@]}" -- "${skips[@]}"
}
bindings() {
  if [ -d bindings/cpp ]; then
    suite "c++ binding (ctest)" bash -c 'cmake -S bindings/cpp -B bindings/cpp/build -DCMAKE_BUILD_TYPE=Debug -DRDZV_LIBRARY="$1" >/dev/null &&
      cmake --build bindings/cpp/build -j2 >/dev/null && ctest --test-dir bindings/cpp/build --output-on-failure' _ "$lib/librdzv.so"
  fi
  if [ -d bindings/go ]; then
    suite "go binding (go vet, go test -race)" env CGO_LDFLAGS="-L$lib -Wl,-rpath,$(scripts/dev-lib.sh debug)" bash -c 'cd bindings/go && test -z "$(gofmt -l .)" && go vet -tags rdzv_dev ./... && go test -tags rdzv_dev -race -count=1 ./...'
  fi
  if [ -d bindings/python ]; then
    # mypy checks the annotations the package ships (py.typed); /dev/null: no cache to share.
    suite "python binding (pytest, mypy)" env RDZV_LIBRARY="$lib/librdzv.so" bash -c 'python3 -m pytest -q bindings/python/tests &&
      mypy_python=$(scripts/mypy-env.sh) && (cd bindings/python && "$mypy_python" -m mypy --cache-dir=/dev/null)'
  fi
  suite "demo" scripts/demo.sh
  # A short soak (8 jobs of 4 nodes with churn, about 2 minutes): calls that fail only under
  # the load of many jobs, keys left behind, a database that grows. Its speed goals are asked
  # for only on a quiet machine (docs/RELIABILITY.md), not beside the other lanes.
  suite "soak: 8 jobs of 4 nodes with churn on one etcd for 60 s: no failed call, no key left, database bounded" \
    env RDZV_PREBUILT=1 scripts/soak.sh --duration 60s --retention 10s --runs 8 --nodes 4 -- --solo 15s --alternate 15s
}
# What users copy and install, in a lane of its own (the longest chain of the bindings').
installs() {
  suite "README quick starts (C, C++, Go, Python), as printed" scripts/readme-quickstart.sh
  suite "installed: prefix, pkg-config, find_package, Go module, Python wheel" scripts/install-test.sh
  suite "go scheduler example on the installed library: rdzv run launchers added, drained, killed, closed, purged" scripts/go-scheduler-test.sh
}
frameworks() {
  # The environment is made once (5.4 GB, 1.5 to 3 minutes), then reused in a fraction of a second.
  if [ "${RDZV_SKIP_TORCH:-0}" != 1 ]; then
    suite "python binding with PyTorch (real torchrun), and DDP under rdzv run" bash -c \
      'python=$(scripts/torch-env.sh) && t=bindings/python/tests &&
       RDZV_LIBRARY="$1" "$python" -m pytest -q $t/test_torch.py $t/test_torchrun.py $t/test_torch_backend.py $t/test_inprocess_torch.py &&
       RDZV_TORCH_PYTHON="$python" cargo test --quiet --test launcher_torch' _ "$lib/librdzv.so"
    suite "Lightning and DeepSpeed under rdzv run (Lightning as under torchrun)" bash -c \
      'python=$(scripts/torch-frameworks-env.sh) &&
       RDZV_TORCH_FRAMEWORKS_PYTHON="$python" cargo test --quiet --test launcher_torch_frameworks'
  else
    echo "=== python binding with PyTorch (real torchrun), Lightning, DeepSpeed: skipped (RDZV_SKIP_TORCH=1)"
  fi
  # JAX from the registry (about 600 MB once); skipped only where the registry has no build of it
  # for this machine (jax-env.sh exits 3 then, saying why).
  suite "JAX under rdzv run --framework=jax (collectives, node loss)" bash -c \
    'python=$(scripts/jax-env.sh) || { [ $? -eq 3 ] && echo "skipped: no JAX for this machine in the registry" && exit 0; exit 1; }
     RDZV_JAX_PYTHON="$python" cargo test --quiet --test launcher_jax'
}

lane rust_newest
for entry in "${built[@]:0:${#built[@]}-1}"; do lane older_etcd "${entry#* }"; done
lane older_etcd "$debian_etcd"
lane bindings
lane installs
lane frameworks
# A lane that died between its suites (not by a suite's failure) counts as a failure.
lanes_failed=0
for pid in "${lanes[@]}"; do wait "$pid" || lanes_failed=$((lanes_failed + 1)); done

# The summary: every suite in the order declared, with its time; the failures; the total.
passed=0
failed=$lanes_failed
failures=()
echo "=== summary"
for name_file in "$logs"/*.name; do
  id=$(basename "$name_file" .name)
  name=$(cat "$name_file")
  if [ -f "$logs/$id.result" ]; then
    read -r status secs <"$logs/$id.result"
  else
    status="never finished" secs=-
  fi
  printf '%6s s  %-6s %s\n' "$secs" "$status" "$name"
  if [ "$status" = ok ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("$name")
  fi
done
[ "$lanes_failed" -eq 0 ] || echo "$lanes_failed lane(s) ended without running all their suites"
# Why each failed suite failed, last, where a reader of only the end of the output sees it:
# Rust tests' panics with their messages, else the suite's last lines.
for result in "$logs"/*.result; do
  [ -f "$result" ] || continue
  read -r status _ <"$result"
  [ "$status" = ok ] && continue
  id=$(basename "$result" .result)
  echo "=== why: $(cat "$logs/$id.name")"
  if grep -q "panicked at" "$logs/$id.log"; then
    # Each panic with the 6 lines after it, 80 lines at most (awk: no pipe to cut short).
    awk '/^---- .* stdout ----|panicked at/ {n = 7} n > 0 {print; n--; if (++shown == 80) exit}' "$logs/$id.log"
  else
    tail -n 20 "$logs/$id.log"
  fi
done
for name in "${failures[@]}"; do echo "failed: $name"; done
echo "total: $((SECONDS - started)) s"
echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
