#!/usr/bin/env bash
# The long chaos run (tests/all/chaos): a job of K rdzv-node processes on a 3-member etcd cluster
# while random faults land (nodes SIGKILLed and replaced, SIGSTOPped past their lease, etcd
# members SIGKILLed and restarted, nodes cut off the network, several at once), then the
# checker over every node's history. Prints the seed, the faults by kind, the rounds formed
# and the recovery times; on a violation keeps the histories and names their directory.
#
# Usage: scripts/chaos.sh [--duration 30m] [--nodes 12] [--seed N] [--etcd VERSION|debian] [--keep]
#   --duration  how long faults are injected: 90s, 30m, 2h (default 30m)
#   --nodes     node processes (default 12; min_nodes is half of them, max_nodes all)
#   --seed      replay the fault schedule of an earlier run (default: a new seed, printed)
#   --etcd      a version from scripts/etcd-versions (default: the newest), or `debian` for
#               the etcd on PATH
#   --keep      keep the histories and node logs of a run that passed too
# Partitions need network namespaces (root); without them they are skipped, with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=30m nodes=12 seed= etcd=
while [ $# -gt 0 ]; do
  case $1 in
    --duration) duration=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --etcd) etcd=$2; shift 2 ;;
    --keep) export RDZV_CHAOS_KEEP=1; shift ;;
    -h | --help) sed -n 2,15p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/chaos.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$etcd" != debian ]; then
  [ -n "$etcd" ] || etcd=$(grep -v '^#' scripts/etcd-versions | grep . | tail -n 1)
  dir=$(scripts/etcd-build.sh "$etcd" | cut -d' ' -f2)
  export PATH="$dir:$PATH"
fi
version=$(etcd --version) # whole: head -1 would leave etcd writing into a closed pipe
echo "etcd: ${version%%$'\n'*}"
export RDZV_CHAOS_DURATION=$duration RDZV_CHAOS_NODES=$nodes RDZV_CHAOS_SEED=$seed
exec cargo test --release --test all -- --ignored --nocapture --exact chaos::long_chaos_run
