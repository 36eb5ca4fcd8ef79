#!/usr/bin/env bash
# Starts a throwaway etcd (the first on PATH) on free loopback ports with a temporary data
# directory, prints "PID ENDPOINT DATADIR" once etcd reports it is ready, and its version on
# stderr. Used by the demo, the benchmark, the install test and the README quick start. An etcd
# that exits before it is ready (a picked port can be taken before etcd binds it) is started
# again on other ports, 3 times in all; then its log is shown and the script fails.
set -euo pipefail
# Two ports, both held while picked so that they differ.
free_ports() {
  python3 -c 'import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])'
}
dir=$(mktemp -d -t rdzv-etcd.XXXXXX)
log="$dir/etcd.log"

# Waits for etcd's own "ready" line (up to 30 s) rather than guessing a delay: 0 once it is
# logged, 1 if the log ends first (tail --pid stops when etcd exits), 2 at the deadline. The
# lines are read by a child under timeout: bash 5.2's read -t can report a timeout at once.
wait_ready() {
  local pid=$1 fd tail_pid rc=0
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

for attempt in 1 2 3; do
  read -r client peer < <(free_ports)
  rm -rf "$dir/data"
  # Made before etcd starts: its redirection happens in the background child, which tail
  # could otherwise outrun ("cannot open").
  : >"$log"
  etcd --name demo --data-dir "$dir/data" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "demo=http://127.0.0.1:$peer" "$@" >>"$log" 2>&1 &
  pid=$!
  status=0
  wait_ready "$pid" || status=$?
  if [ "$status" -eq 0 ]; then
    echo "etcd $(etcd --version | awk '/^etcd Version:/ {print $3}') ready at 127.0.0.1:$client" >&2
    echo "$pid 127.0.0.1:$client $dir"
    exit 0
  fi
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  # Only an etcd that exited by itself is tried again; one that hangs would hang again.
  if [ "$status" -ne 1 ] || [ "$attempt" -eq 3 ]; then break; fi
  echo "etcd exited before it was ready (try $attempt of 3, ports $client and $peer); its last lines:" >&2
  tail -n 5 "$log" >&2
done
if [ "$status" -eq 1 ]; then
  echo "etcd exited before it was ready, $attempt times; its log:" >&2
else
  echo "etcd was not ready within 30 s; its log:" >&2
fi
cat "$log" >&2
rm -rf "$dir"
exit 1
