#!/usr/bin/env bash
# Runs the wheels to publish (scripts/wheel.sh --all) where they are meant to run, against a
# throwaway etcd on this machine:
#   - the aarch64 wheel, installed with pip into a virtual environment of Debian 12's arm64
#     Python, run under qemu-user: its library and its `rdzv` command;
#   - the x86_64 wheel, installed the same way into Debian 11 (glibc 2.31, older than the build
#     machine's), run natively in a chroot: its library, and a job under its `rdzv run`;
#   - one node of each forms ONE round of two and uses its store: each sets a key, and reads
#     the other's.
# Then prints the newest glibc symbol version each wheel's binaries import (what the
# manylinux tag promises: nothing newer than the tag's glibc is needed).
#
# Opt-in, not part of scripts/test.sh: the first run makes the two root filesystems
# (scripts/rootfs.sh, cached, about 100 MB each) and the cross build (several minutes).
# Needs root (the chroot, in a private mount namespace), qemu-user and mmdebstrap
# (apt-get install qemu-user mmdebstrap); binfmt_misc is not needed: qemu-aarch64 is run
# explicitly, with the arm64 tree as its library prefix (-L).
# Usage: scripts/wheel-check.sh [X86_64_WHEEL AARCH64_WHEEL]   (wheels already built: not again)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v qemu-aarch64 >/dev/null || { echo "wheel-check.sh: qemu-aarch64 is missing (apt-get install qemu-user)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "wheel-check.sh: needs root, for the chroot of the older Debian" >&2; exit 1; }
step() { echo "--- $*"; }
work=$(mktemp -d)
arm=$(scripts/rootfs.sh bookworm arm64)
old=$(scripts/rootfs.sh bullseye amd64)
read -r etcd_pid endpoint etcd_dir < <(scripts/etcd-local.sh)
cleanup() {
  kill "$etcd_pid" 2>/dev/null || true
  rm -rf "$work" "$etcd_dir"
  rmdir "$old$work" 2>/dev/null || true
}
trap cleanup EXIT

if [ $# = 2 ]; then
  x86=$(realpath "$1") a64=$(realpath "$2")
else
  step "build the wheels"
  wheels=$(scripts/wheel.sh --all "$work/wheels")
  x86=$(grep -- '_x86_64\.whl$' <<<"$wheels")
  a64=$(grep -- '_aarch64\.whl$' <<<"$wheels")
fi
[[ $x86 == *manylinux*_x86_64.whl && $a64 == *manylinux*_aarch64.whl ]] \
  || { echo "wheel-check.sh: want an x86_64 and an aarch64 manylinux wheel, not $x86 and $a64" >&2; exit 2; }
echo "wheels: $(basename "$x86") $(basename "$a64")"
# Where the chroot sees them too.
mkdir -p "$work/in" && cp "$x86" "$a64" "$work/in/"
x86="$work/in/$(basename "$x86")" a64="$work/in/$(basename "$a64")"

# in_old CMD...: CMD in the Debian 11 tree, with this run's directory at the same path, /dev
# and /proc mounted in a mount namespace of its own (nothing leaks into the machine's).
mkdir -p "$old$work" "$old/dev" "$old/proc" "$old/tmp"
in_old() {
  unshare --mount --fork sh -c 'r=$1 w=$2; shift 2
    mount --rbind /dev "$r/dev" && mount -t proc proc "$r/proc" && mount --bind "$w" "$r$w" &&
    exec chroot "$r" "$@"' sh "$old" "$work" "$@"
}
# in_arm CMD...: an arm64 program, under qemu with the arm64 tree as its library prefix.
in_arm() { qemu-aarch64 -L "$arm" "$@"; }

step "install: pip, into a virtual environment of each Debian's own Python"
# --system-site-packages: pip is the one Debian ships; --no-index: only the wheel given.
in_old python3 -m venv --without-pip --system-site-packages "$work/venv-x86"
in_old "$work/venv-x86/bin/python" -m pip install -q --no-index --no-deps "$x86"
in_arm "$arm/usr/bin/python3" -m venv --without-pip --system-site-packages "$work/venv-arm"
in_arm "$work/venv-arm/bin/python" -m pip install -q --no-index --no-deps "$a64"
in_old "$work/venv-x86/bin/python" -c 'import platform; print("x86_64 side: Python", platform.python_version(), "glibc", platform.libc_ver()[1])'
in_arm "$work/venv-arm/bin/python" -c 'import platform; print("aarch64 side: Python", platform.python_version(), platform.machine(), "glibc", platform.libc_ver()[1])'
version="rdzv $(sed -n '/^version = "/{s/^version = "\(.*\)"/\1/p;q;}' Cargo.toml)"
[ "$(in_arm "$work/venv-arm/bin/rdzv" --version)" = "$version" ]
[ "$(in_old "$work/venv-x86/bin/rdzv" --version)" = "$version" ]
echo "the rdzv command of each wheel: $version"

step "one round: an aarch64 node and an x86_64 node, and the store between them"
cat >"$work/node.py" <<'PY'
import datetime, platform, sys
import rdzv, rdzv._ffi as ffi
url, me, other = sys.argv[1:4]
assert "site-packages" in ffi.library_path(), ffi.library_path()
with rdzv.EtcdV3RendezvousHandler.from_url(url) as handler:
    info = handler.next_rendezvous()
    store = info.store
    store.set(f"from-{me}", f"hello from {me}")
    got = store.get(f"from-{other}", timeout=datetime.timedelta(seconds=120)).decode()
    assert got == f"hello from {other}", got
    print(f"{me} ({platform.machine()}): rank {info.rank} of {info.world_size}, round {info.round}, "
          f"read {got!r}")
    store.close()
PY
url="etcd://$endpoint/wheel-check-$$?min_nodes=2&max_nodes=2"
in_arm "$work/venv-arm/bin/python" "$work/node.py" "$url" arm x86 >"$work/arm.out" 2>&1 &
arm_pid=$!
in_old "$work/venv-x86/bin/python" "$work/node.py" "$url" x86 arm >"$work/x86.out" 2>&1 &
x86_pid=$!
rc=0
wait "$arm_pid" || rc=$?
wait "$x86_pid" || rc=$?
cat "$work/arm.out" "$work/x86.out"
[ "$rc" = 0 ] || { echo "a node failed" >&2; exit 1; }
# One round: the same round number, ranks 0 and 1 between them.
rounds=$(sed -n 's/.*round \([0-9]*\),.*/\1/p' "$work/arm.out" "$work/x86.out" | sort -u | wc -l)
ranks=$(sed -n 's/.*rank \([0-9]\) of 2,.*/\1/p' "$work/arm.out" "$work/x86.out" | sort | tr -d '\n')
[ "$rounds" = 1 ] && [ "$ranks" = 01 ] || { echo "not one round of two: rounds $rounds, ranks '$ranks'" >&2; exit 1; }

step "a job under the x86_64 wheel's rdzv run, on Debian 11"
printf 'import os\nprint("rank=%%s of %%s" %% (os.environ["RANK"], os.environ["WORLD_SIZE"]))\n' >"$work/rank.py"
job=$(in_old "$work/venv-x86/bin/rdzv" run --nnodes=1 --nproc-per-node=2 --rdzv-endpoint="$endpoint" \
  --rdzv-id="wheel-check-job-$$" --local-addr=127.0.0.1 "$work/rank.py" 2>&1)
echo "$job"
# Worker lines come as the workers wrote them, unprefixed (torchrun's console).
grep -qx 'rank=0 of 2' <<<"$job"
grep -qx 'rank=1 of 2' <<<"$job"

step "glibc: the newest symbol version each wheel's binaries import"
for wheel in "$x86" "$a64"; do
  dir="$work/unpacked/$(basename "$wheel")"
  mkdir -p "$dir" && (cd "$dir" && unzip -q "$wheel")
  newest=$(find "$dir" -name librdzv.so -o -path '*/scripts/rdzv' | xargs objdump -T | grep -o 'GLIBC_[0-9.]*' | sort -t. -k1,1 -k2,2n -k3,3n -u | tail -n1)
  echo "$(basename "$wheel"): $newest"
done
echo "wheel check ok"
