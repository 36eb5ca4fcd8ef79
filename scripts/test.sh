#!/usr/bin/env bash
# Runs every test of rdzv: installs what is missing, checks formatting and lints, then the
# Rust unit and integration tests (real etcd, real processes, the C program and header
# drift), and the C++, Go and Python bindings' suites against real etcd servers they start.
# Prints one "N passed, N failed" line at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

passed=0
failed=0
suite() {
  local name=$1
  shift
  echo "=== $name"
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "=== $name FAILED"; fi
}

# cargo test does not build the cdylib the C, C++, Go and Python tests load: build it first.
cargo build --quiet
suite "rustfmt" cargo fmt --check
suite "clippy" cargo clippy --all-targets --quiet -- -D warnings
suite "rust tests (unit, etcd integration, processes, C ABI, header)" cargo test
if [ -d bindings/cpp ]; then
  suite "c++ binding (ctest)" bash -c 'cmake -S bindings/cpp -B bindings/cpp/build -DCMAKE_BUILD_TYPE=Debug >/dev/null &&
    cmake --build bindings/cpp/build -j2 >/dev/null && ctest --test-dir bindings/cpp/build --output-on-failure'
fi
if [ -d bindings/go ]; then
  suite "go binding (go vet, go test -race)" bash -c 'cd bindings/go && test -z "$(gofmt -l .)" && go vet ./... && go test -race -count=1 ./...'
fi
if [ -d bindings/python ]; then
  suite "python binding (pytest)" python3 -m pytest -q bindings/python/tests
fi
suite "demo" scripts/demo.sh
suite "README C quick start, as printed" scripts/readme-quickstart.sh

echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
