#!/usr/bin/env bash
# Installs rdzv the way a user would and uses it from outside the repository, against a
# throwaway etcd: the C library under a prefix (a C program built with pkg-config, the C++
# find_package consumer, a Go module that requires the binding), exactly the rdzv_* functions
# of rdzv.h exported, and the Python wheel (scripts/wheel.sh) in a fresh virtual environment:
# its tags and contents, the package, and the rdzv command it installs; then the rdzv-etcd wheel
# (scripts/etcd-wheel.sh, packing the etcd scripts/etcd-build.sh cached) through the `etcd`
# extra, its etcd serving a --rdzv-backend=c10d job with no other etcd on PATH.
#
# `install-test.sh --prefix DIR` runs the prefix's checks (the layout, the exports, C, C++, Go,
# and bin/rdzv if there is one) on a prefix made elsewhere (an unpacked release tarball of
# scripts/release.sh) instead of installing one, and skips the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
given=
if [ "${1:-}" = --prefix ]; then
  given=$(cd "${2:?install-test.sh --prefix takes a directory}" && pwd)
fi
work=$(mktemp -d)
read -r etcd_pid endpoint etcd_dir < <(scripts/etcd-local.sh)
trap 'kill "$etcd_pid" 2>/dev/null || true; rm -rf "$work" "$etcd_dir"' EXIT
# A prefix of this run's own, so that two runs at once do not collide. Go's build cache does
# not key on what pkg-config answers, so a package built against another prefix would be
# linked with that prefix's flags: the prefix goes into the cache key through CGO_CPPFLAGS.
prefix=${given:-"$work/prefix"}
url() { echo "etcd://$endpoint/install-$1-$$?min_nodes=1"; }
# Each step with the seconds since the start: where the time goes.
step() { echo "--- $* (at ${SECONDS} s)"; }

if [ -n "$given" ]; then
  step "a prefix made elsewhere: $prefix"
else
  step "install under a prefix"
  scripts/install.sh "$prefix"
fi
lib="$prefix/lib/librdzv.so.0.1.0"
[ "$(readlink "$prefix/lib/librdzv.so.0")" = librdzv.so.0.1.0 ]
[ "$(readlink "$prefix/lib/librdzv.so")" = librdzv.so.0 ]
# readelf's output is captured, then matched: under pipefail a pipe into grep -q, which exits at
# its match, fails whenever the writer gets SIGPIPE on a later line.
dynamic=$(readelf -d "$lib")
grep -q 'SONAME.*\[librdzv.so.0\]' <<<"$dynamic"
[ -f "$prefix/lib/librdzv.a" ] && [ -f "$prefix/include/rdzv.h" ] && [ -f "$prefix/include/rdzv/rdzv.hpp" ] && [ -f "$prefix/include/rdzv/gloo.hpp" ]
cmp LICENSE "$prefix/share/doc/rdzv/LICENSE"
[ -x "$prefix/bin/rdzv" ] && [ "$("$prefix/bin/rdzv" --version)" = "rdzv $(sed -n '/^version = "/{s/^version = "\(.*\)"/\1/p;q;}' Cargo.toml)" ]
pc=$(cat "$prefix/lib/pkgconfig/rdzv.pc")
grep -qx "License: Apache-2.0" <<<"$pc"

step "exports: every function of rdzv.h, nothing else"
grep -vE '^\s*(\*|/\*)' include/rdzv.h | grep -oE '\brdzv_[a-z0-9_]+\(' | tr -d '(' | sort -u >"$work/declared"
nm -D --defined-only "$lib" | awk '{print $3}' | sort -u >"$work/exported"
diff "$work/declared" "$work/exported" || { echo "exports differ from rdzv.h (< header, > library)" >&2; exit 1; }
echo "$(wc -l <"$work/exported") functions"

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig" LD_LIBRARY_PATH="$prefix/lib"
step "C program built with pkg-config"
cp examples/c/node.c "$work/node.c"
(cd "$work" && cc -std=c11 node.c $(pkg-config --cflags --libs rdzv) -o c-node)
dynamic=$(readelf -d "$work/c-node")
grep -q 'NEEDED.*\[librdzv.so.0\]' <<<"$dynamic"
(cd "$work" && ./c-node "$(url c)") | tee "$work/c.out"
grep -q '"rank":0,"world_size":1' "$work/c.out"

step "C++ consumer with find_package(rdzv)"
cmake -S bindings/cpp/tests/consumer -B "$work/cpp" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cpp" >/dev/null
"$work/cpp/rdzv_consumer" | grep "consumer ok"

step "Go module outside the repository, linking the installed library"
mkdir "$work/go" && cd "$work/go"
cat >go.mod <<GOMOD
module example.com/consumer

go 1.22

require github.com/rdzv/rdzv/bindings/go v0.0.0

replace github.com/rdzv/rdzv/bindings/go => $repo/bindings/go
GOMOD
cat >main.go <<'GO'
package main

import (
	"context"
	"fmt"
	"os"

	rdzv "github.com/rdzv/rdzv/bindings/go"
)

func main() {
	params, err := rdzv.ParamsFromURL(os.Args[1])
	if err != nil {
		panic(err)
	}
	node, err := rdzv.NewRendezvous(params)
	if err != nil {
		panic(err)
	}
	defer node.Close()
	info, store, err := node.Next(context.Background())
	if err != nil {
		panic(err)
	}
	defer store.Close()
	fmt.Printf("go consumer: library %s, rank %d of %d\n", rdzv.Version(), info.Rank, info.WorldSize)
}
GO
CGO_CPPFLAGS="-DRDZV_PREFIX_ID=$(printf %s "$prefix" | md5sum | cut -c1-12)" go build -o go-node .
./go-node "$(url go)" | tee go.out
grep -q "rank 0 of 1" go.out
cd "$repo"

if [ -n "$given" ]; then
  if [ -e "$prefix/bin/rdzv" ]; then
    step "the prefix's rdzv command: a job of two workers"
    [ "$("$prefix/bin/rdzv" --version)" = "rdzv $(sed -n '/^version = "/{s/^version = "\(.*\)"/\1/p;q;}' Cargo.toml)" ]
    job=$("$prefix/bin/rdzv" run --nnodes=1 --nproc-per-node=2 --rdzv-endpoint="$endpoint" --rdzv-id="install-bin-$$" \
      --local-addr=127.0.0.1 --no-python sh -c 'echo "rank=$RANK of $WORLD_SIZE"' 2>&1)
    echo "$job"
    grep -qx 'rank=0 of 2' <<<"$job"
    grep -qx 'rank=1 of 2' <<<"$job"
  fi
  echo "install test ok (prefix $prefix)"
  exit 0
fi

step "Python wheel in a fresh virtual environment, used from outside the repository"
unset LD_LIBRARY_PATH
wheel=$(scripts/wheel.sh "$work/wheel")
# One wheel for every Python 3 (a native library and command, no CPython extension), with a
# manylinux platform tag.
[[ $(basename "$wheel") =~ ^rdzv-[0-9.]+-py3-none-manylinux_[0-9]+_[0-9]+_$(uname -m)\.whl$ ]] \
  || { echo "wheel tags: $wheel is not py3-none-manylinux_X_Y_$(uname -m)" >&2; exit 1; }
# What it carries: the library under its own name, the command as a script, the license.
python3 - "$wheel" LICENSE <<'PY'
import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
names = wheel.namelist()
dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
data = dist_info.replace(".dist-info", ".data")
for name in ["rdzv/librdzv.so", f"{data}/scripts/rdzv", f"{dist_info}/licenses/LICENSE"]:
    assert name in names, f"{name} missing from the wheel: {names}"
assert not [n for n in names if ".cpython-" in n], names
assert wheel.read(f"{dist_info}/licenses/LICENSE") == open(sys.argv[2], "rb").read()
metadata = wheel.read(f"{dist_info}/METADATA").decode().splitlines()
for line in ["License-Expression: Apache-2.0", "License-File: LICENSE"]:
    assert line in metadata, f"{line!r} not in METADATA"
mode = wheel.getinfo(f"{data}/scripts/rdzv").external_attr >> 16
assert mode & 0o111, f"the rdzv command is not executable in the wheel: {oct(mode)}"
print(f"{sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files, the command, the library, LICENSE")
PY
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$wheel"
cd "$work"
"$work/venv/bin/python" - "$(url py)" <<'PY'
import sys
from importlib import metadata
import rdzv, rdzv._ffi as ffi
assert "site-packages" in ffi.library_path(), ffi.library_path()
eps = [ep for ep in metadata.entry_points(group="torchrun.handlers") if ep.name == "etcd-v3"]
assert eps and eps[0].value == "rdzv.torch_backend:create_handler", eps
with rdzv.EtcdV3RendezvousHandler.from_url(sys.argv[1]) as h:
    info = h.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    info.store.close()
print(f"python wheel: library {rdzv.version()} from {ffi.library_path()}, entry point {eps[0].value}")
PY

step "the rdzv command from the wheel, on the environment's PATH"
export PATH="$work/venv/bin:$PATH"
[ "$(command -v rdzv)" = "$work/venv/bin/rdzv" ]
[ "$(rdzv --version)" = "rdzv $(sed -n '/^version = "/{s/^version = "\(.*\)"/\1/p;q;}' "$repo/Cargo.toml")" ]
help=$(rdzv --help)
grep -q '^Usage: rdzv <COMMAND>' <<<"$help"
# A real job against the throwaway etcd: one node, two workers, each printing its rank.
worker=(--no-python sh -c 'echo "rank=$RANK of $WORLD_SIZE"')
both_ranks() {  # in separate commands: set -e ignores a failure on the left of &&
  grep -q '^rank=0 of 2$' <<<"$1" || { echo "rank 0 missing from: $1" >&2; return 1; }
  grep -q '^rank=1 of 2$' <<<"$1" || { echo "rank 1 missing from: $1" >&2; return 1; }
}
job=$(rdzv run --nnodes=1 --nproc-per-node=2 --rdzv-endpoint="$endpoint" --rdzv-id="install-cmd-$$" \
  --local-addr=127.0.0.1 "${worker[@]}" 2>&1)
echo "$job"
both_ranks "$job"
# python -m rdzv is the same command: the very file the wheel installed, the same help, a job.
py="$work/venv/bin/python"
[ "$("$py" -c 'import rdzv.__main__ as m; print(m.find_command())')" = "$work/venv/bin/rdzv" ]
[ "$("$py" -m rdzv --help)" = "$help" ]
job=$("$py" -m rdzv run --standalone --nproc-per-node=2 "${worker[@]}" 2>&1)
both_ranks "$job"
# A .py program runs under the environment's own Python, as torchrun's workers do, even with
# the environment not activated (PATH without its bin/).
printf 'import sys\nprint("prefix=" + sys.prefix)\n' >"$work/prefix.py"
job=$(env PATH="${PATH#"$work/venv/bin:"}" "$work/venv/bin/rdzv" run --standalone "$work/prefix.py" 2>&1)
grep -q "^prefix=$work/venv\$" <<<"$job" || { echo "a .py worker did not run under the venv's Python: $job" >&2; exit 1; }
echo "rdzv command ok: rdzv and python -m rdzv from $work/venv/bin/rdzv"
cd "$repo"

step "pip install \"rdzv[etcd]\": the rdzv-etcd wheel's etcd serves --rdzv-backend=c10d"
etcd_wheel=$(scripts/etcd-wheel.sh "$work/wheel")
etcd_version=${etcd_wheel##*/rdzv_etcd-} && etcd_version=${etcd_version%%-*} && etcd_version=${etcd_version%.post*}
# The extra, resolved from the two wheels alone (rdzv's is installed already).
env -u PIP_FIND_LINKS "$work/venv/bin/pip" install -q --no-index --find-links "$work/wheel" "rdzv[etcd]"
"$work/venv/bin/python" - "$etcd_version" <<'PY'
import sys
from importlib import metadata
dist = metadata.distribution("rdzv-etcd")
assert dist.version.split(".post")[0] == sys.argv[1], dist.version
assert "Apache-2.0" in dist.metadata["License-Expression"].split(" AND "), dist.metadata["License-Expression"]
assert "Apache License" in dist.read_text("licenses/go.etcd.io/etcd/server/v3/LICENSE")
assert any(r.startswith("rdzv-etcd") and 'extra == "etcd"' in r for r in metadata.requires("rdzv")), metadata.requires("rdzv")
print(f"rdzv-etcd {dist.version}: {len(dist.metadata.get_all('License-File'))} license files")
PY
out=$("$work/venv/bin/etcd" --version)
grep -qx "etcd Version: $etcd_version" <<<"$out" || { echo "the wheel's etcd says: $out" >&2; exit 1; }
# A one-node job with the environment's bin/ as the whole PATH (Debian's etcd, /usr/bin/etcd,
# out of reach): the launcher serves the rendezvous from the wheel's etcd. The worker names the
# program of each etcd its parent, the launcher, started.
cat >"$work/which_etcd.py" <<'PY'
import os
launcher = os.getppid()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        if ppid == launcher and comm == "etcd":
            print("etcd=" + os.readlink(f"/proc/{pid}/exe"))
    except (OSError, ValueError):
        pass
PY
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1]); s.close()')
job=$(cd "$work" && env PATH="$work/venv/bin" "$work/venv/bin/rdzv" run --rdzv-backend=c10d --rdzv-endpoint="127.0.0.1:$port" \
  --nnodes=1 --nproc-per-node=1 which_etcd.py 2>&1) || { echo "$job" >&2; echo "the c10d job failed" >&2; exit 1; }
echo "$job"
grep -qx "etcd=$(realpath "$work/venv/bin/etcd")" <<<"$job" \
  || { echo "the c10d job's etcd was not the wheel's ($work/venv/bin/etcd)" >&2; exit 1; }
echo "rdzv-etcd ok: $(basename "$etcd_wheel") ($(du -k "$etcd_wheel" | cut -f1) KB) served a c10d job"
echo "install test ok (${SECONDS} s)"
