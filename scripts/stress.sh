#!/usr/bin/env bash
# Hunts flakes and hangs: runs the chosen suites K times on each chosen etcd version, with and
# without CPU load (stress-ng, one CPU hog per core), and prints per test how many runs it had
# and how many failed or hung. A run that outlives its watchdog is a hang: before it is killed,
# the stacks of every thread of the stuck process (and of its children) are written beside its
# output with gdb (Rust, C), Python's faulthandler or Go's own timeout dump.
#
#   scripts/stress.sh [--runs K] [--etcd all|VERSIONS] [--load no|yes|both] [--timeout S]
#                     [--out DIR] SUITE...
#
# SUITE is `rust:TARGET[/FILTER]` (a cargo test target and, optionally, libtest's filter:
# rust:all, rust:all/chaos::, rust:launcher, ...), `rust` (every target that starts etcd), `python` (the binding's suite without PyTorch), `go`.
# --etcd: `all` (Debian's 3.4 and every version in scripts/etcd-versions), or a comma list
# of versions (`3.4,v3.5.35,v3.7.3`); default: the newest. Default 10 runs, load both ways,
# a watchdog of 600 s per run. Everything a failed or hung run printed is kept under --out.
# Exits 1 if any run failed or hung.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=10 etcd_choice=newest load=both timeout=600 out=""
suites=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --etcd) etcd_choice=$2; shift 2 ;;
    --load) load=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "stress.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) suites+=("$1"); shift ;;
  esac
done
[ ${#suites[@]} -gt 0 ] || { echo "stress.sh: name at least one SUITE (see --help)" >&2; exit 2; }
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "stress.sh: --runs takes a positive whole number, not '$runs'" >&2; exit 2; }
[[ $timeout =~ ^[1-9][0-9]*$ ]] || { echo "stress.sh: --timeout takes seconds, not '$timeout'" >&2; exit 2; }
case $load in no) loads=(no) ;; yes) loads=(yes) ;; both) loads=(no yes) ;;
  *) echo "stress.sh: --load takes no, yes or both, not '$load'" >&2; exit 2 ;; esac
out=${out:-$(mktemp -d -t rdzv-stress.XXXXXX)}
mkdir -p "$out"

missing=()
command -v gdb >/dev/null || missing+=(gdb)
command -v stress-ng >/dev/null || missing+=(stress-ng)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# etcd versions: "LABEL DIR" lines.
etcds=()
built=$(scripts/etcd-build.sh)
mapfile -t built <<<"$built"
debian_dir=$(dirname "$(command -v etcd)")
case $etcd_choice in
  newest) etcds=("${built[-1]}") ;;
  all) etcds=("3.4 $debian_dir" "${built[@]}") ;;
  *)
    IFS=, read -ra wanted <<<"$etcd_choice"
    for w in "${wanted[@]}"; do
      if [ "$w" = 3.4 ]; then etcds+=("3.4 $debian_dir"); continue; fi
      dir=$(scripts/etcd-build.sh "$w" | cut -d' ' -f2)
      etcds+=("$w $dir")
    done
    ;;
esac

cargo build --quiet # the cdylib the bindings load
# The Python and Go suites are pointed at it, in cargo's target directory (CARGO_TARGET_DIR or
# cargo's configuration, else target/): Python at the file, Go at the directory where it has
# its installed names (scripts/dev-lib.sh); the Go binding's own flags name target/, and
# CGO_LDFLAGS come before them.
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
lib="$target/debug"
dev_lib=$(scripts/dev-lib.sh debug)

# Rust test executables by target name (built once; each run starts the binary itself).
declare -A rust_bin=()
. scripts/lib/etcd-test-targets.sh
build_rust() {
  local args=() name
  for name in "$@"; do args+=(--test "$name"); done
  local json
  json=$(cargo test --no-run --message-format=json "${args[@]}" 2>/dev/null)
  while IFS=' ' read -r name exe; do rust_bin[$name]=$exe; done < <(python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])' <<<"$json")
}

expanded=()
for s in "${suites[@]}"; do
  case $s in
    rust) while read -r t; do expanded+=("rust:$t"); done < <(etcd_test_targets) ;;
    rust:* | python | go) expanded+=("$s") ;;
    *) echo "stress.sh: unknown suite '$s' (rust, rust:TARGET, python, go)" >&2; exit 2 ;;
  esac
done
rust_wanted=()
for s in "${expanded[@]}"; do [[ $s == rust:* ]] && s=${s#rust:} && rust_wanted+=("${s%%/*}"); done
[ ${#rust_wanted[@]} -eq 0 ] || build_rust "${rust_wanted[@]}"
for name in "${rust_wanted[@]}"; do
  [ -n "${rust_bin[$name]:-}" ] || { echo "stress.sh: no cargo test target '$name'" >&2; exit 2; }
done

# Stacks of PID and its descendants, for a hang.
dump_stacks() {
  local pid=$1 file=$2 p
  # Children first: attaching to the parent pauses it, and its tests may end them meanwhile.
  for p in $(pgrep -P "$pid" || true) $pid; do
    {
      echo "=== pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null || echo gone)"
      timeout 60 gdb -p "$p" -batch -ex "thread apply all bt 40" 2>/dev/null | grep -v '^\[New LWP' || true
    } >>"$file"
  done
}

# One run of one suite: its output goes to $log; prints nothing; returns 0 ok, 1 failed,
# 124 hung (stacks in $log.stacks).
run_once() {
  local suite=$1 log=$2 cmd=()
  case $suite in
    rust:*)
      local spec=${suite#rust:}
      cmd=("${rust_bin[${spec%%/*}]}")
      [[ $spec != */* ]] || cmd+=("${spec#*/}")
      ;;
    python) cmd=(env RDZV_LIBRARY="$lib/librdzv.so" python3 -X faulthandler -m pytest -v -p no:cacheprovider -o "faulthandler_timeout=$((timeout - 30))"
      bindings/python/tests --ignore=bindings/python/tests/test_torch.py
      --ignore=bindings/python/tests/test_torchrun.py --ignore=bindings/python/tests/test_torch_backend.py) ;;
    go) cmd=(env -C bindings/go CGO_LDFLAGS="-L$dev_lib -Wl,-rpath,$dev_lib" go test -tags rdzv_dev -count=1 -v -timeout "$((timeout - 30))s" ./...) ;;
  esac
  # Its own session, so that a hang's whole process tree can be dumped and killed.
  setsid "${cmd[@]}" >"$log" 2>&1 </dev/null &
  local pid=$! waited=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge "$timeout" ]; then
      dump_stacks "$pid" "$log.stacks"
      kill -KILL -- "-$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      return 124
    fi
    # Bounded wait for the run's exit: wakes as soon as it ends, or after a second.
    timeout 1 tail --pid="$pid" -f /dev/null 2>/dev/null || true
    waited=$((waited + 1))
  done
  wait "$pid"
}

# Per-test results of one run's output, as "NAME STATUS" lines (ok, FAILED).
results_of() {
  python3 - "$1" "$2" <<'PY'
import re, sys
suite, path = sys.argv[1], sys.argv[2]
text = open(path, errors="replace").read()
if suite.startswith("rust:"):
    pat = re.compile(r"^test (\S+) \.\.\. (ok|FAILED)$", re.M)
elif suite == "python":
    pat = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR)", re.M)
else:
    pat = re.compile(r"^\s*--- (PASS|FAIL): (\S+)", re.M)
for m in pat.finditer(text):
    name, status = (m.group(2), m.group(1)) if suite == "go" else (m.group(1), m.group(2))
    print(name, "ok" if status in ("ok", "PASSED", "PASS") else "FAILED")
PY
}

stress_pid=""
stop_load() { [ -z "$stress_pid" ] || { kill "$stress_pid" 2>/dev/null; wait "$stress_pid" 2>/dev/null; stress_pid=""; }; }
trap stop_load EXIT

summary="$out/summary.tsv"
printf 'suite\tetcd\tload\ttest\truns\tfailed\n' >"$summary"
echo "stress: ${#expanded[@]} suite(s) x ${#etcds[@]} etcd x ${#loads[@]} load x $runs runs; output in $out"
bad=0
for entry in "${etcds[@]}"; do
  label=${entry%% *} dir=${entry#* }
  for with_load in "${loads[@]}"; do
    if [ "$with_load" = yes ]; then
      stress-ng --cpu "$(nproc)" --timeout 0 --quiet >/dev/null 2>&1 &
      stress_pid=$!
    fi
    for suite in "${expanded[@]}"; do
      declare -A count=() fails=()
      hung=0 failed_runs=0
      for i in $(seq 1 "$runs"); do
        log="$out/${suite//[:\/]/_}-$label-load_$with_load-$i.log"
        status=0
        PATH="$dir:$PATH" run_once "$suite" "$log" || status=$?
        while read -r name result; do
          [ -n "$name" ] || continue
          count[$name]=$((${count[$name]:-0} + 1))
          [ "$result" = ok ] || fails[$name]=$((${fails[$name]:-0} + 1))
        done < <(results_of "$suite" "$log")
        case $status in
          0) rm -f "$log" ;;
          124) hung=$((hung + 1)); echo "  HANG  $suite etcd $label load=$with_load run $i: stacks in $log.stacks" ;;
          *) failed_runs=$((failed_runs + 1)); echo "  FAIL  $suite etcd $label load=$with_load run $i: $log" ;;
        esac
      done
      for name in "${!count[@]}"; do
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$suite" "$label" "$with_load" "$name" "${count[$name]}" "${fails[$name]:-0}" >>"$summary"
      done
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$suite" "$label" "$with_load" "(hung runs)" "$runs" "$hung" >>"$summary"
      echo "$suite on etcd $label, load=$with_load: $runs runs, $failed_runs failed, $hung hung"
      [ $((failed_runs + hung)) -eq 0 ] || bad=1
      unset count fails
    done
    stop_load
  done
done

echo
echo "tests that failed at least once (suite, etcd, load, test, runs, failed):"
awk -F'\t' 'NR > 1 && $6 > 0' "$summary" | column -t -s $'\t' || true
echo "full table: $summary"
exit "$bad"
