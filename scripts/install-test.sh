#!/usr/bin/env bash
# Installs rdzv the way a user would and uses it from outside the repository, against a
# throwaway etcd: the C library under a prefix (a C program built with pkg-config, the C++
# find_package consumer, a Go module that requires the binding), exactly the rdzv_* functions
# of rdzv.h exported, and the Python wheel in a fresh virtual environment.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d)
read -r etcd_pid endpoint etcd_dir < <(scripts/etcd-local.sh)
trap 'kill "$etcd_pid" 2>/dev/null; rm -rf "$work" "$etcd_dir" "${prefix:-}"' EXIT
# A fixed prefix. Go's build cache does not key on what pkg-config answers, so a package built
# against another prefix would be linked with that prefix's flags: the prefix goes into the
# cache key through CGO_CPPFLAGS below.
prefix="${TMPDIR:-/tmp}/rdzv-install-test"
rm -rf "$prefix"
url() { echo "etcd://$endpoint/install-$1-$$?min_nodes=1"; }
step() { echo "--- $*"; }

step "install under a prefix"
scripts/install.sh "$prefix"
lib="$prefix/lib/librdzv.so.0.1.0"
[ "$(readlink "$prefix/lib/librdzv.so.0")" = librdzv.so.0.1.0 ]
[ "$(readlink "$prefix/lib/librdzv.so")" = librdzv.so.0 ]
# readelf's output is captured, then matched: under pipefail a pipe into grep -q, which exits at
# its match, fails whenever the writer gets SIGPIPE on a later line.
dynamic=$(readelf -d "$lib")
grep -q 'SONAME.*\[librdzv.so.0\]' <<<"$dynamic"
[ -f "$prefix/lib/librdzv.a" ] && [ -f "$prefix/include/rdzv.h" ] && [ -f "$prefix/include/rdzv/rdzv.hpp" ]
cmp LICENSE "$prefix/share/doc/rdzv/LICENSE"
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

step "Python wheel in a fresh virtual environment, used from outside the repository"
unset LD_LIBRARY_PATH
python3 -m pip wheel -q --no-deps -w "$work/wheel" ./bindings/python
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$work"/wheel/rdzv-*.whl
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
cd "$repo"
echo "install test ok"
