#!/usr/bin/env bash
# Starts a throwaway etcd (the first on PATH) on free loopback ports with a temporary data
# directory, prints "PID ENDPOINT DATADIR" once etcd reports it is ready, and its version on
# stderr. Used by the demo, the benchmark, the install test and the README quick start. An etcd
# that exits before it is ready (a picked port can be taken before etcd binds it) is started
# again on other ports, 3 times in all; then its log is shown and the script fails.
#
# `etcd-local.sh --members N [ETCD ARGS]` starts a cluster of N members instead and prints
# "PID,PID,... ENDPOINT,ENDPOINT,... DIR" (member i's data and log under DIR/mI).
set -euo pipefail
members=1
if [ "${1:-}" = --members ]; then
  members=$2
  shift 2
  [[ $members =~ ^[1-9][0-9]*$ ]] || { echo "etcd-local.sh: --members takes a count, not '$members'" >&2; exit 2; }
fi
# COUNT ports, all held while picked so that they differ.
free_ports() {
  python3 -c 'import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in held))' "$1"
}
dir=$(mktemp -d -t rdzv-etcd.XXXXXX)

# Waits for etcd's own "ready" line in LOG (up to 30 s) rather than guessing a delay: 0 once
# it is logged, 1 if the log ends first (tail --pid stops when etcd exits), 2 at the deadline.
# The lines are read by a child under timeout: bash 5.2's read -t can report a timeout at once.
wait_ready() {
  local pid=$1 log=$2 fd tail_pid rc=0
  exec {fd}< <(exec tail --pid="$pid" -n +1 -f "$log")
  tail_pid=$!
  # shellcheck disable=SC2016 # expanded by the child
  timeout 30 bash -c 'while IFS= read -r line; do
      [[ $line != *"ready to serve client requests"* ]] || exit 0
    done
    exit 1' <&"$fd" || rc=$?
  kill "$tail_pid" 2>/dev/null || true # no tail left behind following a live etcd
  exec {fd}<&-
  case $rc in 0 | 1) return "$rc" ;; *) return 2 ;; esac
}

name_of() { if [ "$members" -eq 1 ]; then echo demo; else echo "m$1"; fi; }

for attempt in 1 2 3; do
  read -ra ports < <(free_ports $((2 * members)))
  cluster=""
  for ((i = 0; i < members; i++)); do
    cluster+="${cluster:+,}$(name_of "$i")=http://127.0.0.1:${ports[2 * i + 1]}"
  done
  pids=() endpoints=() logs=()
  for ((i = 0; i < members; i++)); do
    member_dir="$dir"
    [ "$members" -eq 1 ] || member_dir="$dir/m$i"
    mkdir -p "$member_dir"
    rm -rf "$member_dir/data"
    client=${ports[2 * i]} peer=${ports[2 * i + 1]}
    # Made before etcd starts: its redirection happens in the background child, which tail
    # could otherwise outrun ("cannot open").
    : >"$member_dir/etcd.log"
    etcd --name "$(name_of "$i")" --data-dir "$member_dir/data" \
      --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
      --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
      --initial-cluster "$cluster" --initial-cluster-state new "$@" >>"$member_dir/etcd.log" 2>&1 &
    pids+=($!) endpoints+=("127.0.0.1:$client") logs+=("$member_dir/etcd.log")
  done
  # A member is ready once the cluster has a leader, so all are started before any wait.
  status=0
  for ((i = 0; i < members; i++)); do
    wait_ready "${pids[i]}" "${logs[i]}" || { status=$?; break; }
  done
  if [ "$status" -eq 0 ]; then
    list() { local IFS=,; echo "$*"; }
    echo "etcd $(etcd --version | awk '/^etcd Version:/ {print $3}') ready at $(list "${endpoints[@]}")" >&2
    echo "$(list "${pids[@]}") $(list "${endpoints[@]}") $dir"
    exit 0
  fi
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  # Only an etcd that exited by itself is tried again; one that hangs would hang again.
  if [ "$status" -ne 1 ] || [ "$attempt" -eq 3 ]; then break; fi
  echo "etcd exited before it was ready (try $attempt of 3, ports ${ports[*]}); its last lines:" >&2
  tail -n 5 "${logs[i]}" >&2
done
if [ "$status" -eq 1 ]; then
  echo "etcd exited before it was ready, $attempt times; its log:" >&2
else
  echo "etcd was not ready within 30 s; its log:" >&2
fi
cat "${logs[i]}" >&2
rm -rf "$dir"
exit 1
