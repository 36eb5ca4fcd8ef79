#!/usr/bin/env bash
# Checks the release files of scripts/release.sh against a throwaway etcd on this machine:
#   - each static `rdzv` is static (file, ldd), runs a job of two workers (`rdzv run`) and
#     reports it (`rdzv status --json`): the x86_64 one natively, the aarch64 one under
#     qemu-user (its workers are this machine's programs: the launcher is what is emulated);
#   - the x86_64 tarball, unpacked, serves C, C++ and Go users and its bin/rdzv runs a job
#     (scripts/install-test.sh --prefix);
#   - then measures the static command against the glibc one of the x86_64 wheel (both with
#     debug information stripped): size, and start time (`rdzv --version`, median of 20 runs).
# Opt-in, not part of scripts/test.sh (two architectures of release builds). Needs qemu-user
# (apt-get install qemu-user) for the aarch64 part.
# Usage: scripts/release-check.sh [DIR]   (DIR: release.sh's output, already built; default:
#        build it into a temporary directory; the x86_64 wheel is taken from DIR too if there)
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n '/^version = "/{s/^version = "\(.*\)"/\1/p;q;}' Cargo.toml)
work=$(mktemp -d)
read -r etcd_pid endpoint etcd_dir < <(scripts/etcd-local.sh)
trap 'kill "$etcd_pid" 2>/dev/null || true; rm -rf "$work" "$etcd_dir"' EXIT
step() { echo "--- $*"; }
if [ -n "${1:-}" ]; then
  dir=$(cd "$1" && pwd)
else
  dir="$work/dist"
  scripts/release.sh "$dir"
fi

checked=0
for arch in x86_64 aarch64; do
  bin="$dir/rdzv-$version-linux-$arch"
  # A directory given may hold one architecture's files (release.sh --target).
  if [ ! -e "$bin" ] && [ -n "${1:-}" ]; then
    step "static rdzv for $arch: not in $dir, skipped"
    continue
  fi
  checked=$((checked + 1))
  run=("$bin")
  [ "$arch" = "$(uname -m)" ] || run=(qemu-"$arch" "$bin")
  step "static rdzv for $arch: ${run[*]}"
  info=$(file -b "$bin")
  echo "file: $info"
  [[ $info == *"statically linked"* || $info == *"static-pie linked"* ]] || { echo "not static" >&2; exit 1; }
  ldd_out=$(ldd "$bin" 2>&1 || true)
  echo "ldd: $ldd_out"
  [[ $ldd_out == *"not a dynamic executable"* || $ldd_out == *"statically linked"* ]] || { echo "ldd finds libraries" >&2; exit 1; }
  [ "$("${run[@]}" --version)" = "rdzv $version" ]
  id="release-$arch-$$"
  job=$("${run[@]}" run --nnodes=1 --nproc-per-node=2 --rdzv-endpoint="$endpoint" --rdzv-id="$id" \
    --local-addr=127.0.0.1 --no-python sh -c 'echo "rank=$RANK of $WORLD_SIZE"' 2>&1)
  echo "$job"
  # Worker lines come as the workers wrote them, unprefixed (torchrun's console).
  grep -qx 'rank=0 of 2' <<<"$job"
  grep -qx 'rank=1 of 2' <<<"$job"
  status=$("${run[@]}" status --json "etcd://$endpoint/$id")
  echo "status: $status"
  python3 -c 'import json, sys; json.loads(sys.argv[1])' "$status"
done

[ "$checked" -gt 0 ] || { echo "no static rdzv in $dir" >&2; exit 1; }

step "the x86_64 tarball, unpacked, for C, C++ and Go users"
tar -C "$work" -xzf "$dir/rdzv-$version-linux-x86_64.tar.gz"
scripts/install-test.sh --prefix "$work/rdzv-$version-linux-x86_64"

step "size and start time: static (musl) against glibc (the x86_64 wheel's command)"
wheel=$(ls "$dir"/rdzv-*manylinux*_x86_64.whl 2>/dev/null | head -n1 || true)
[ -n "$wheel" ] || wheel=$(scripts/wheel.sh --target x86_64 "$work/wheel")
(cd "$work" && unzip -q -o "$wheel" 'rdzv-*.data/scripts/rdzv' && mv rdzv-*.data/scripts/rdzv glibc-rdzv)
python3 - "$dir/rdzv-$version-linux-x86_64" "$work/glibc-rdzv" <<'PY'
import os, statistics, subprocess, sys, time
def start(path):
    times = []
    for _ in range(20):
        t = time.perf_counter()
        subprocess.run([path, "--version"], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return statistics.median(times)
static, glibc = sys.argv[1:3]
s_size, g_size = os.path.getsize(static), os.path.getsize(glibc)
s_time, g_time = start(static), start(glibc)
print(f"size: static {s_size / 1e6:.2f} MB, glibc {g_size / 1e6:.2f} MB (static/glibc {s_size / g_size:.2f})")
print(f"rdzv --version, median of 20: static {s_time * 1e3:.2f} ms, glibc {g_time * 1e3:.2f} ms "
      f"(static/glibc {s_time / g_time:.2f})")
PY
echo "release check ok"
