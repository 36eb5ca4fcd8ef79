#!/usr/bin/env bash
# Builds the rdzv-etcd wheel (bindings/etcd: etcd's server as the `etcd` command of a Python
# environment, which `pip install "rdzv[etcd]"` pulls in for `rdzv run --rdzv-backend=c10d`)
# and prints its path.
#
#   scripts/etcd-wheel.sh [OUTDIR]                      this machine's architecture
#   scripts/etcd-wheel.sh --target ARCH [OUTDIR]        ARCH = x86_64 or aarch64
#   scripts/etcd-wheel.sh --all [OUTDIR]                both (the wheels to publish)
# (default OUTDIR: dist/ at the repository root; one wheel path printed per line)
#
# The etcd is the newest of scripts/etcd-versions, which must be bindings/etcd/pyproject.toml's
# version (X.Y.Z, or X.Y.Z.postN for a repackaging). For this machine's architecture it is the
# static binary scripts/etcd-build.sh built and cached (built there if missing), stripped as it
# is packed: nothing is compiled when the cache is warm. For another architecture the backend
# builds it with Go's cross compiler (GOARCH=arm64 ...), stripped by the linker.
#
# Each wheel is checked: tagged py3-none-manylinux_2_17_ARCH.manylinux2014_ARCH.musllinux_1_1_ARCH
# (a static program: no libc needed, Go's runtime needs Linux 3.2), and its etcd is
# executable, of that architecture, static (no program interpreter) and stripped (no symbol
# table, no debug sections).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=()
case "${1:-}" in
  --target)
    [[ ${2:-} =~ ^(x86_64|aarch64)$ ]] || { echo "etcd-wheel.sh: --target takes x86_64 or aarch64, not '${2:-}'" >&2; exit 2; }
    targets=("$2")
    shift 2
    ;;
  --all) targets=(x86_64 aarch64); shift ;;
  -*) echo "etcd-wheel.sh: unknown option '$1' (usage: etcd-wheel.sh [--target x86_64|aarch64 | --all] [OUTDIR])" >&2; exit 2 ;;
  *)
    [[ $(uname -m) =~ ^(x86_64|aarch64)$ ]] || { echo "etcd-wheel.sh: no wheel for this machine's $(uname -m) (x86_64, aarch64)" >&2; exit 1; }
    targets=("$(uname -m)")
    ;;
esac
out=${1:-dist}
python=$(command -v python3)

pinned=$(grep -v '^#' scripts/etcd-versions | grep .)
etcd=${pinned##*$'\n'}
packaged=$(sed -n 's/^version = "\(.*\)"$/\1/p' bindings/etcd/pyproject.toml)
if [ "${packaged%.post*}" != "${etcd#v}" ]; then
  echo "etcd-wheel.sh: bindings/etcd/pyproject.toml's version is $packaged, the newest etcd of scripts/etcd-versions is $etcd: make them agree" >&2
  exit 1
fi

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
mkdir -p "$out"

# wheel_for ARCH: builds and checks one wheel, and prints its path.
wheel_for() {
  local arch=$1 dir="$build/$1" env=() wheel tags etcd_file header sections machine
  mkdir -p "$dir"
  case $arch in
    x86_64) machine="X86-64" ;;
    aarch64) machine="AArch64" ;;
  esac
  if [ "$arch" = "$(uname -m)" ]; then
    local cached
    cached=$(scripts/etcd-build.sh "$etcd")
    env=(RDZV_ETCD_BINARY="${cached#* }/etcd")
  else
    env=(GOARCH="$([ "$arch" = aarch64 ] && echo arm64 || echo amd64)")
  fi
  env -u RDZV_ETCD_BINARY -u GOARCH "${env[@]}" "$python" -m pip wheel -q --no-deps -w "$dir" ./bindings/etcd >&2
  wheel=$(basename "$dir"/*.whl)
  tags="manylinux_2_17_$arch.manylinux2014_$arch.musllinux_1_1_$arch"
  [[ $wheel == "rdzv_etcd-$packaged-py3-none-$tags.whl" ]] \
    || { echo "etcd-wheel.sh: $wheel is not rdzv_etcd-$packaged-py3-none-$tags.whl" >&2; exit 1; }
  (cd "$dir" && unzip -q "$wheel" "rdzv_etcd-$packaged.data/scripts/etcd")
  etcd_file="$dir/rdzv_etcd-$packaged.data/scripts/etcd"
  [ -x "$etcd_file" ] || { echo "etcd-wheel.sh: the etcd in $wheel is not executable" >&2; exit 1; }
  header=$(readelf -hlW "$etcd_file")
  sections=$(readelf -SW "$etcd_file")
  grep -q "Machine: *.*$machine" <<<"$header" || { echo "etcd-wheel.sh: the etcd in $wheel is not an $arch program" >&2; exit 1; }
  if grep -q 'Requesting program interpreter' <<<"$header"; then
    echo "etcd-wheel.sh: the etcd in $wheel is not static (it asks for a program interpreter)" >&2
    exit 1
  fi
  if grep -qE '\.(symtab|debug_|zdebug_)' <<<"$sections"; then
    echo "etcd-wheel.sh: the etcd in $wheel is not stripped" >&2
    exit 1
  fi
  mv -f "$dir/$wheel" "$out/"
  echo "$out/$wheel"
}

for arch in "${targets[@]}"; do wheel_for "$arch"; done
