#!/usr/bin/env bash
# Builds in release mode, starts a throwaway local etcd and runs the benchmark against it.
# Usage: scripts/bench.sh [N ...]   (default N = 2 8 64 256 1024)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release --example bench --quiet
read -r pid endpoint dir < <(scripts/etcd-local.sh --quota-backend-bytes=4294967296)
trap 'kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
echo "etcd $(etcd --version | head -1 | awk '{print $3}') at $endpoint, $(nproc) cores"
target/release/examples/bench "$endpoint" "$@"
