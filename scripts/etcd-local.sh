#!/usr/bin/env bash
# Starts a throwaway etcd (the first on PATH) on a free loopback port with a temporary data
# directory, prints "PID ENDPOINT DATADIR" once etcd reports it is ready, and its version on
# stderr. Used by the demo and the benchmark.
set -euo pipefail
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
client=$(free_port); peer=$(free_port)
dir=$(mktemp -d -t rdzv-etcd.XXXXXX)
etcd --name demo --data-dir "$dir/data" \
  --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "demo=http://127.0.0.1:$peer" "$@" >"$dir/etcd.log" 2>&1 &
pid=$!
# Wait for etcd's own "ready" line (up to 30 s) rather than guessing a delay.
if ! timeout 30 grep -q -m1 "ready to serve client requests" <(tail --pid="$pid" -n +1 -f "$dir/etcd.log"); then
  kill "$pid" 2>/dev/null || true
  echo "etcd did not start; its log:" >&2
  cat "$dir/etcd.log" >&2
  exit 1
fi
echo "etcd $(etcd --version | awk '/^etcd Version:/ {print $3}') ready at 127.0.0.1:$client" >&2
echo "$pid 127.0.0.1:$client $dir"
