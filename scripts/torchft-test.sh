#!/usr/bin/env bash
# Opt-in (not in scripts/test.sh: it takes minutes): torchft 0.2.0's own tests that start a
# Lighthouse (lighthouse_test.py, coordination_test.py, manager_integ_test.py; Gloo on CPU),
# run twice on one throwaway etcd: with torchft's own Lighthouse (the baseline), then with
# `rdzv lighthouse` in its place (tests/torchft/rdzv_lighthouse.py: two lighthouse processes
# per LighthouseServer, the tests talking to the follower). Prints each test's outcome side by
# side and fails when a test that passes with torchft's Lighthouse does not pass with ours.
# The tests come with torchft's wheel (scripts/quorum-env.sh installs it beside the cached
# PyTorch); `parameterized`, which they import, is installed once beside it.
# Usage: scripts/torchft-test.sh [PYTEST ARGS]     e.g. -k test_ddp_healthy
#        scripts/torchft-test.sh --bench [N ...]    the benchmark instead (release build):
#                                                   benches/bench_lighthouse.py, N = 1 8 64 256
#        scripts/torchft-test.sh --e2e              a torchft DDP job of two replica groups on
#                                                   CPU, its lighthouse then etcd's leader killed
#                                                   once steps were seen (benches/lighthouse_e2e.py);
#                                                   fails when steps stop after a kill
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh
scripts/install-deps.sh
python=$(scripts/quorum-env.sh)
extra="$(rdzv_cache)/torchft-tests-0.2.0"
make_extra() {
  "$python" -m pip install -q --no-cache-dir --target "$extra" parameterized==0.9.0 >&2
}
cached_env "$extra" "parameterized==0.9.0 for $python" make_extra
flock -u 9
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
if [ "${1:-}" = --bench ]; then
  shift
  cargo build --release --quiet -p rdzv-cli --bin rdzv
  read -r pid endpoint dir < <(scripts/etcd-local.sh)
  # shellcheck disable=SC2064 # the pid and directory are known now
  trap "kill $pid 2>/dev/null || true; rm -rf '$dir'" EXIT
  "$python" benches/bench_lighthouse.py "$target/release/rdzv" "$endpoint" "$@" \
    2> >(grep -v '\[torchft::' >&2)
  exit 0
fi
if [ "${1:-}" = --e2e ]; then
  cargo build --release --quiet -p rdzv-cli --bin rdzv
  read -r pids endpoints dir < <(scripts/etcd-local.sh --members 3)
  # shellcheck disable=SC2064 # the pids and directory are known now
  trap "kill ${pids//,/ } 2>/dev/null || true; rm -rf '$dir'" EXIT
  # Its status is the run's: 1 when a group stopped stepping after a kill, restarted, or did
  # not finish.
  status=0
  "$python" benches/lighthouse_e2e.py "$target/release/rdzv" "$endpoints" "$pids" || status=$?
  exit "$status"
fi
cargo build --quiet -p rdzv-cli --bin rdzv
read -r pid endpoint dir < <(scripts/etcd-local.sh)
work=$(mktemp -d -t rdzv-torchft.XXXXXX)
# shellcheck disable=SC2064 # the pid and directories are known now
trap "kill $pid 2>/dev/null || true; rm -rf '$dir' '$work'" EXIT
modules=(torchft.lighthouse_test torchft.coordination_test torchft.manager_integ_test)
# LABEL [PYTEST ARGS]: runs the modules, the summary of each test in $work/LABEL.log.
run() {
  local label=$1 started=$SECONDS
  shift
  echo "== $label: ${modules[*]}"
  (cd "$work" && PYTHONPATH="$OLDPWD/tests/torchft:$extra" RDZV_LIGHTHOUSE_BIN="$target/debug/rdzv" \
    RDZV_LIGHTHOUSE_ETCD="$endpoint" timeout 1800 "$python" -m pytest -p no:cacheprovider \
    --rootdir "$work" -q -rA "$@" --pyargs "${modules[@]}") >"$work/$label.log" 2>&1 || true
  # pytest's summary (-rA): "OUTCOME test - reason", skips as "SKIPPED [n] file:line: reason".
  sed -n '/short test summary info/,$p' "$work/$label.log" \
    | grep -E '^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) ' \
    | sed -E -e 's/^SKIPPED \[[0-9]+\] [^ ]*: (.*)/SKIPPED skip:\1/' -e 's/ - .*//' \
    | awk '{o=$1; $1=""; sub(/^ /, ""); gsub(/ /, "_"); print o, $0}' \
    | sort -k2 >"$work/$label.outcomes" || true
  tail -n 1 "$work/$label.log"
  echo "   ($((SECONDS - started)) s)"
}
run torchft "$@"
run rdzv -p rdzv_lighthouse "$@"
echo
printf '%-72s %-8s %s\n' "test" "torchft" "rdzv"
join -1 2 -2 2 -a 1 -a 2 -e - -o 0,1.1,2.1 "$work/torchft.outcomes" "$work/rdzv.outcomes" \
  | while read -r test theirs ours; do printf '%-72s %-8s %s\n' "${test#*::}" "$theirs" "$ours"; done
regressed=$(join -1 2 -2 2 -a 1 -e - -o 0,1.1,2.1 "$work/torchft.outcomes" "$work/rdzv.outcomes" \
  | awk '$2 == "PASSED" && $3 != "PASSED" {print $1}')
if [ -n "$regressed" ]; then
  echo "passes with torchft's Lighthouse, not with rdzv lighthouse:"
  echo "$regressed"
  for label in torchft rdzv; do cp "$work/$label.log" "$target/torchft-test-$label.log"; done
  echo "logs: $target/torchft-test-torchft.log, $target/torchft-test-rdzv.log"
  exit 1
fi
echo "every test that passes with torchft's Lighthouse passes with rdzv lighthouse"
