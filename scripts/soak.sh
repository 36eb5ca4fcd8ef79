#!/usr/bin/env bash
# Many jobs on one etcd (benches/soak/): RUNS jobs of NODES in-process nodes at once, with
# churn (nodes killed, leaving, drained and replaced, every worker restarted, jobs ending and
# new ones starting), for DURATION, on a throwaway etcd run as docs/OPERATIONS.md recommends
# (periodic auto-compaction). Prints a round's time for one job alone and then under the load
# of all (each job's ratio), with and without a scheduler watching every job's
# status, etcd's database size every 10 s, failed calls, the keys left once every job ended
# and lease_ttl passed, a snapshot, and a defragmentation of each member. Exits 1 on a failed
# call, a stuck job, or keys left other than `closed` markers, keeping etcd's logs then.
#
# Usage: scripts/soak.sh [--duration 3m] [--runs 100] [--nodes 8] [--cluster]
#                        [--retention 5m] [--etcd VERSION|debian] [--upgrade-from VERSION]
#                        [-- SOAK ARGS]
#   --duration   how long all jobs run at once: 90s, 3m, 30m (default 3m)
#   --runs       jobs at once (default 100)
#   --nodes      nodes per job (default 8)
#   --cluster    a 3-member etcd cluster instead of one member
#   --retention  etcd's --auto-compaction-retention, periodic mode (default 5m)
#   --etcd       a version from scripts/etcd-versions (default: the newest), or `debian` for
#                the etcd on PATH
#   --upgrade-from  start etcd as this version instead, and a third into the run upgrade it
#                to --etcd's: each member in turn stopped (SIGTERM) and started again as the
#                new version on its data directory, the next once it is ready
#   after --      passed to the soak: --solo 60s (the job alone first), --alternate 30s
#                 (the scheduler off, then on, in turns this long), --lease-ttl 5, --monitor 1
#                 (the agents' check interval, seconds), --prefix /soak
#                 --max-ratio 3 --max-scheduler-cost 0.10 (fail unless the speed goals are
#                 met: for a quiet machine)
#                 --scheduler-poll 1 (the scheduler also reads every job's status each second)
set -euo pipefail
cd "$(dirname "$0")/.."
duration=3m runs=100 nodes=8 members=1 retention=5m etcd= from= extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --duration) duration=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --cluster) members=3; shift ;;
    --retention) retention=$2; shift 2 ;;
    --etcd) etcd=$2; shift 2 ;;
    --upgrade-from) from=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n 2,29p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/soak.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$etcd" != debian ]; then
  [ -n "$etcd" ] || etcd=$(grep -v '^#' scripts/etcd-versions | grep . | tail -n 1)
  bin=$(scripts/etcd-build.sh "$etcd" | cut -d' ' -f2)
  export PATH="$bin:$PATH"
fi
new_etcd=$(command -v etcd)
old_path=$PATH
[ -z "$from" ] || old_path="$(scripts/etcd-build.sh "$from" | cut -d' ' -f2):$PATH"
# The test command builds it before its lanes (RDZV_PREBUILT=1): a cargo build here would wait
# for the lock of another lane's cargo test, for minutes.
[ "${RDZV_PREBUILT:-0}" = 1 ] || cargo build --release --quiet -p rdzv-bench --bin soak
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
compaction=(--auto-compaction-mode=periodic "--auto-compaction-retention=$retention")
read -r pids endpoint dir < <(PATH=$old_path scripts/etcd-local.sh --members "$members" "${compaction[@]}")
IFS=, read -ra members_pids <<<"$pids"
soak_pid=
# Waits (at most 60 s) for etcd PID to log that it is ready, in LOG from line FROM on (the
# lines before are the old process's); the lines are read by a child under timeout, as in
# etcd-local.sh, and tail ends with etcd.
ready() {
  local fd tail_pid rc=0
  exec {fd}< <(exec tail --pid="$1" -n +"$3" -f "$2")
  tail_pid=$!
  # shellcheck disable=SC2016 # expanded by the child
  timeout 60 bash -c 'while IFS= read -r line; do
      [[ $line != *"ready to serve client requests"* ]] || exit 0
    done
    exit 1' <&"$fd" || rc=$?
  kill "$tail_pid" 2>/dev/null || true
  exec {fd}<&-
  return "$rc"
}
# Evaluated at exit: members restarted by the upgrade have new pids.
trap 'kill ${soak_pid:+"$soak_pid"} "${members_pids[@]}" 2>/dev/null || true; rm -rf "$dir"' EXIT
echo "etcd $(PATH=$old_path etcd --version | awk '/^etcd Version:/ {print $3}'), $members member(s), ${compaction[*]}, $(nproc) cores"
"$target/release/soak" "$endpoint" --runs "$runs" --nodes "$nodes" --duration "$duration" "${extra[@]}" &
soak_pid=$!
if [ -n "$from" ]; then
  # The soak's job alone runs first (60 s unless --solo says otherwise), then all of them.
  seconds=$(python3 -c 'import re, sys
def s(t):
    n, u = re.fullmatch(r"([0-9.]+)([smh]?)", t).groups()
    return float(n) * {"": 1, "s": 1, "m": 60, "h": 3600}[u]
args = sys.argv[2:]
solo = s(args[args.index("--solo") + 1]) if "--solo" in args else 60
print(int(solo + s(sys.argv[1]) / 3))' "$duration" "${extra[@]}")
  sleep "$seconds" # a point in the run, not an event to wait for
  for i in "${!members_pids[@]}"; do
    pid=${members_pids[i]} log="$dir/etcd.log"
    [ "$members" -eq 1 ] || log="$dir/m$i/etcd.log"
    mapfile -d '' -t args <"/proc/$pid/cmdline"
    cwd=$(readlink "/proc/$pid/cwd")
    seen=$(wc -l <"$log")
    stopping=$(date +%s.%N)
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    started=$(date +%s.%N)
    (cd "$cwd" && exec "$new_etcd" "${args[@]:1}" >>"$log" 2>&1) &
    members_pids[i]=$!
    if ! ready "${members_pids[i]}" "$log" "$((seen + 1))"; then
      echo "soak.sh: member $i did not come back as $new_etcd within 60 s; its log:" >&2
      tail -n 20 "$log" >&2
      exit 1
    fi
    echo "soak.sh: member $i upgraded to $("$new_etcd" --version | awk '/^etcd Version:/ {print $3}'): stopped in $(python3 -c "print(f'{$started - $stopping:.1f}')") s, ready $(python3 -c "import time; print(f'{time.time() - $started:.1f}')") s after its start"
  done
fi
status=0
wait "$soak_pid" || status=$?
if [ "$status" -ne 0 ]; then
  # etcd's own account of a failed run (slow disk, long applies, the leases it expired).
  kept=$(mktemp -d -t rdzv-soak-etcd.XXXXXX)
  find "$dir" -name etcd.log -exec sh -c 'cp "$1" "$2/$(basename "$(dirname "$1")")-etcd.log"' _ {} "$kept" \;
  echo "soak.sh: etcd's logs kept in $kept"
fi
exit "$status"
