#!/usr/bin/env bash
# Compiles and runs the README's C quick start exactly as printed (program and commands), with
# only the etcd endpoint changed to a throwaway local etcd (and target/ to cargo's target
# directory where CARGO_TARGET_DIR or cargo's configuration moves it): two nodes must form one
# round, and with etcd gone the program must fail with a message instead of printing a rank.
# Then the C++, Go and Python quick starts, each a whole program as printed, with only the
# endpoint and the run id changed: four nodes of each (the snippets' max_nodes) must get ranks 0
# to 3 of 4. They use the library the test command built (target/debug), under its installed
# names (scripts/dev-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
section() { awk -v fence="$1" '/^## C quick start/{f=1} f&&$0=="```"fence{c=1;next} c&&/^```$/{exit} c{print}' README.md; }
program=$(section c)
commands=$(section sh)
[ -n "$program" ] && [ -n "$commands" ] || { echo "README: no C quick start found" >&2; exit 1; }

read -r etcd_pid endpoint etcd_dir < <(scripts/etcd-local.sh)
work=$(mktemp -d)
# Cleaning up never fails the script: under set -e a failing command in the EXIT trap (kill of
# the etcd the test already stopped) would become its exit status.
trap 'kill "$etcd_pid" 2>/dev/null || true; rm -rf "$etcd_dir" "$work" app.c app' EXIT
printf '%s\n' "$program" > app.c
# Every command but the last builds; the last runs a node.
build=$(printf '%s\n' "$commands" | sed '$d')
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
if [ "$target" != "$PWD/target" ]; then
  # The README's "$PWD/target/..." and -Ltarget/...: where this cargo builds instead.
  build=$(printf '%s\n' "$build" | sed "s#\"\$PWD/target/#\"$target/#g; s#\([ L]\)target/#\1$target/#g")
fi
run=$(printf '%s\n' "$commands" | tail -n 1 | sed "s/127.0.0.1:2379/$endpoint/; s/job-42/quickstart-$$/")
eval "$build"
eval "$run" >"$work/a" 2>&1 & a=$!
eval "$run" >"$work/b" 2>&1 & b=$!
wait "$a" && wait "$b" || { cat "$work/a" "$work/b" >&2; exit 1; }
ranks=$(cat "$work/a" "$work/b" | sed -n 's/^rank \([0-9]*\) of 2, master .*:[0-9]*$/\1/p' | sort | tr '\n' ' ')
[ "$ranks" = "0 1 " ] || { echo "expected ranks 0 and 1 of 2, got:" >&2; cat "$work/a" "$work/b" >&2; exit 1; }

# The other languages' quick starts: the LANG block under "## NAME quick start".
snippet() { awk -v head="## $1 quick start" -v fence="$2" '$0==head{f=1;next} f&&/^## /{exit} f&&$0=="```"fence{c=1;next} c&&/^```$/{exit} c{print}' README.md; }
debug_lib="$target/debug"
[ -f "$debug_lib/librdzv.so" ] || cargo build --quiet -p rdzv-c
dev_lib=$(scripts/dev-lib.sh debug)
# Four nodes of one run: COMMAND runs a node; each must print "rank R of 4", R from 0 to 3.
four_nodes() {
  local name=$1 pids=() i got
  shift
  for i in 0 1 2 3; do
    "$@" >"$work/$name.$i" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3; do
    wait "${pids[$i]}" || { echo "$name quick start: a node failed:" >&2; cat "$work/$name".* >&2; exit 1; }
  done
  got=$(cat "$work/$name".* | sed -n 's/^rank \([0-9]*\) of 4$/\1/p' | sort | tr '\n' ' ')
  [ "$got" = "0 1 2 3 " ] || { echo "$name quick start: expected ranks 0-3 of 4, got:" >&2; cat "$work/$name".* >&2; exit 1; }
  echo "README $name quick start: four nodes got ranks 0 to 3"
}
# The endpoint, and a run id of this language's own.
localize() { sed "s/127.0.0.1:2379/$endpoint/; s#/job?#/quickstart-$1-$$?#; s/\"job\"/\"quickstart-$1-$$\"/"; }

cpp=$(snippet C++ cpp | localize cpp)
[ -n "$cpp" ] || { echo "README: no C++ quick start found" >&2; exit 1; }
printf '%s\n' "$cpp" >"$work/app.cpp"
c++ -std=c++17 -Ibindings/cpp/include -Iinclude "$work/app.cpp" -L"$dev_lib" -Wl,-rpath,"$dev_lib" -lrdzv -o "$work/app-cpp"
four_nodes C++ "$work/app-cpp"

go=$(snippet Go go | localize go)
[ -n "$go" ] || { echo "README: no Go quick start found" >&2; exit 1; }
mkdir -p "$work/go"
printf '%s\n' "$go" >"$work/go/main.go"
printf 'module quickstart\n\ngo 1.22\n\nrequire github.com/rdzv/rdzv/bindings/go v0.0.0\n\nreplace github.com/rdzv/rdzv/bindings/go => %s/bindings/go\n' "$PWD" >"$work/go/go.mod"
(cd "$work/go" && CGO_LDFLAGS="-L$dev_lib -Wl,-rpath,$dev_lib" go build -tags rdzv_dev -o "$work/app-go" .)
four_nodes Go "$work/app-go"

python=$(snippet Python python | localize py)
[ -n "$python" ] || { echo "README: no Python quick start found" >&2; exit 1; }
printf '%s\n' "$python" >"$work/app.py"
four_nodes Python env PYTHONPATH="$PWD/bindings/python" RDZV_LIBRARY="$debug_lib/librdzv.so" python3 "$work/app.py"

# etcd is not this shell's child (etcd-local.sh started it), so `wait` would return at once while
# etcd still shut down and accepted connections (2 of 20 tries): wait for the process to be gone.
kill "$etcd_pid"
timeout 30 tail --pid="$etcd_pid" -f /dev/null
if eval "$run" >"$work/down" 2>&1; then
  echo "the quick start exited 0 with etcd down:" >&2; cat "$work/down" >&2; exit 1
fi
grep -q "^connect: connection refused" "$work/down" || { echo "no clear error with etcd down:" >&2; cat "$work/down" >&2; exit 1; }
echo "README quick start: two nodes got ranks 0 and 1; with etcd down it fails with: $(head -1 "$work/down")"
