#!/usr/bin/env bash
# Builds in release mode, starts a throwaway local etcd and runs a benchmark against it.
# Usage: scripts/bench.sh [N ...]        in-process nodes (default N = 2 8 64 256 1024), the
#                                        floor in the same run, and the store
#        scripts/bench.sh --processes [--per-process K] [N ...]  every node its own process:
#                                        Rust (N = 8 64 256) and the Python binding (N = 2 8
#                                        32); with --per-process, N/K processes of K nodes
#        scripts/bench.sh --phases [N]   where a round of N (default 1024) spends its time,
#                                        next to the floor's: joins, seal, fan-out
#        scripts/bench.sh --history [N ...]  what jobs of N nodes (default 8 64 256 1024) cost
#                                        etcd's history, per node and round, on etcd's
#                                        defaults (no compaction, 2 GiB quota), and how long a
#                                        busy platform has before NOSPACE
#        scripts/bench.sh --watched [W ...]  rounds of 8 without and with W schedulers
#                                        watching and polling the run (default W = 1 10)
#        scripts/bench.sh --runs-watched [R]  one scheduler process watching R runs (default
#                                        1000) with an Admin watch each: connections, streams,
#                                        memory, etcd's cost at rest, every run's close seen
#        scripts/bench.sh --torch-at-rest [N ...]  torch's c10d rendezvous backend at rest: store
#                                        requests per node per second (N = 8 64), no etcd
#        scripts/bench.sh --torch-etcd-v2-at-rest [N ...]  torch's legacy etcd backend at rest,
#                                        on etcd 3.4's v2 API: its requests per node per second
#        scripts/bench.sh --launcher [--case NAME] [N ...]  rdzv run and torchrun (N = 2 8):
#                                        launch to all workers started, a node lost to the
#                                        survivors restarted, a failed job to every
#                                        launcher's exit, SIGINT/SIGTERM to a launcher to
#                                        its workers' receipt and its exit, and a worker's
#                                        hang to every rank stepping again, beside NVRx
#                                        0.7.0's ft_launcher (scripts/nvrx-env.sh) (--case
#                                        launcher-killed, worker-killed, drained, failed,
#                                        signal or hang: only those; signal alone: N = 1)
#        scripts/bench.sh --recovery [--fault F] [--launcher L] [N ...]  a crash, a hang, a node
#                                        killed and a node frozen to every surviving rank
#                                        stepping again (N = 2), rdzv run (as is and in
#                                        process) beside torchrun and ft_launcher
#        scripts/bench.sh --frameworks [RUNS]  JAX, Lightning and DeepSpeed on 2 nodes x 2
#                                        processes under rdzv run and torchrun: launch to the
#                                        first collective, and recovery after a SIGKILLed node
#        scripts/bench.sh --cluster [N ...]  the same against a 3-member etcd cluster (N = 8
#                                        ... 4096), and a round while the raft leader is killed
#        scripts/bench.sh --gloo [RUNS]  the C++ Gloo example, 4 processes (default 5 runs):
#                                        start to the first allreduce, and SIGKILL of rank 0
#                                        to the survivors' allreduce in a new round
#        scripts/bench.sh --quorum [ARGS]  rdzv against torchft's Lighthouse in the same run:
#                                        quorum/round formation (N = 2 8 64 256) and recovery
#                                        after a SIGKILL (torchft installed beside PyTorch)
#        scripts/bench.sh --heartbeat [REPS]  what a worker's progress calls cost: a heartbeat,
#                                        one with a step and a section begin+end pair, in C,
#                                        C++, Go, Python and Rust, not monitored and monitored
#                                        (a page as rdzv run makes), median of REPS (default
#                                        15) repetitions; NVRx 0.7.0's RankMonitorClient beside
#                                        them (scripts/nvrx-env.sh; not with RDZV_SKIP_TORCH=1).
#                                        No etcd
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if [ "${1:-}" = "--heartbeat" ]; then
  reps=${2:-15}
  cargo build --release --quiet -p rdzv-c -p rdzv-bench --lib --bin bench_heartbeat
  target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  lib=$(scripts/dev-lib.sh release)
  out="$target/heartbeat-bench"
  mkdir -p "$out"
  cc -O2 -Wall -Iinclude benches/heartbeat/heartbeat.c -L"$lib" -Wl,-rpath,"$lib" -lrdzv -o "$out/heartbeat-c"
  c++ -O2 -std=c++17 -Wall -Iinclude -Ibindings/cpp/include benches/heartbeat/heartbeat.cpp \
    -L"$lib" -Wl,-rpath,"$lib" -lrdzv -o "$out/heartbeat-cpp"
  # CGO_LDFLAGS come before the rdzv_dev tag's (the debug build's): the release library is linked.
  (cd benches/heartbeat/go && CGO_LDFLAGS="-L$lib -Wl,-rpath,$lib" go build -tags rdzv_dev -o "$out/heartbeat-go" .)
  if [ "${RDZV_SKIP_TORCH:-0}" = 1 ]; then
    nvrx=(--nvrx-unavailable "skipped (RDZV_SKIP_TORCH=1: NVRx needs PyTorch)")
  elif nvrx_python=$(scripts/nvrx-env.sh 2>"$out/nvrx-env.log"); then
    nvrx=(--nvrx "$(printf '%q ' "$nvrx_python" benches/heartbeat/nvrx.py)")
  else
    nvrx=(--nvrx-unavailable "scripts/nvrx-env.sh failed: $(tail -n 1 "$out/nvrx-env.log")")
  fi
  echo "$(nproc) cores, load $(cut -d ' ' -f 1-3 /proc/loadavg); the release library"
  # Every program loads the release library: the C, C++ and Go ones through LD_LIBRARY_PATH
  # (before their rpath), Python's through RDZV_LIBRARY.
  LD_LIBRARY_PATH="$lib" RDZV_LIBRARY="$target/release/librdzv.so" PYTHONPATH="$PWD/bindings/python" \
    python3 benches/heartbeat/run.py --reps "$reps" --program "C=$out/heartbeat-c" \
    --program "C++=$out/heartbeat-cpp" --program "Go=$out/heartbeat-go" \
    --program "Python=$(printf '%q ' python3 benches/heartbeat/heartbeat.py)" \
    --program "Rust=$target/release/bench_heartbeat" "${nvrx[@]}"
  exit 0
fi
if [ "${1:-}" = "--torch-etcd-v2-at-rest" ]; then
  shift
  # The v2 API torch's legacy backend speaks: Debian's etcd 3.4 (the first on PATH unless
  # changed; 3.6 removed the API), with it enabled, and python-etcd in a cache of its own.
  read -r pid v2 dir < <(scripts/etcd-local.sh --enable-v2=true)
  # shellcheck disable=SC2064 # the pid is known now
  trap "kill $pid 2>/dev/null || true; rm -rf '$dir'" EXIT
  echo "etcd $(etcd --version | awk '/^etcd Version:/ {print $3}') at $v2 (v2 API), $(nproc) cores"
  python=$(scripts/torch-env.sh)
  . scripts/lib/cached-env.sh
  python_etcd="$(rdzv_cache)/python-etcd-0.4.5"
  [ -d "$python_etcd/etcd" ] || "$python" -m pip install -q --no-cache-dir --target "$python_etcd" python-etcd==0.4.5 >&2
  PYTHONPATH="$python_etcd" "$python" benches/at_rest_torch.py --etcd-v2 "$v2" "$@"
  exit 0
fi
# --cluster: the same benchmark against a 3-member etcd cluster on loopback, as production runs.
members=1
[ "${1:-}" != "--cluster" ] || members=3
# A quota beyond the largest rounds' history, except where etcd's defaults are what is measured.
quota=(--quota-backend-bytes=4294967296)
[ "${1:-}" != "--history" ] || quota=()
read -r pids endpoint dir < <(scripts/etcd-local.sh --members "$members" "${quota[@]}")
# shellcheck disable=SC2064 # the pids are known now; a restarted member is the benchmark's
trap "kill ${pids//,/ } 2>/dev/null || true; pkill -f -- '--data-dir $dir/' || true; rm -rf '$dir'" EXIT
# Where cargo builds: CARGO_TARGET_DIR (or cargo's configuration) if set, else target/.
target=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
echo "etcd $(etcd --version | awk '/^etcd Version:/ {print $3}') at $endpoint, $(nproc) cores"
if [ "${1:-}" = "--launcher" ]; then
  shift
  cargo build --release --quiet -p rdzv-c -p rdzv-cli -p rdzv-bench --lib --bin rdzv --bin bench_launcher
  # NVIDIA's ft_launcher beside rdzv run in the hang case, when its environment can be made.
  if [ "${RDZV_SKIP_TORCH:-0}" = 1 ]; then
    export RDZV_NVRX_UNAVAILABLE="skipped (RDZV_SKIP_TORCH=1: NVRx needs PyTorch)"
  elif RDZV_NVRX_PYTHON=$(scripts/nvrx-env.sh 2>"$target/nvrx-env.log"); then
    export RDZV_NVRX_PYTHON
  else
    RDZV_NVRX_UNAVAILABLE="scripts/nvrx-env.sh failed: $(tail -n 1 "$target/nvrx-env.log")"
    export RDZV_NVRX_UNAVAILABLE
  fi
  "$target/release/bench_launcher" "$endpoint" "$@"
elif [ "${1:-}" = "--recovery" ]; then
  shift
  cargo build --release --quiet -p rdzv-c -p rdzv-cli -p rdzv-bench --lib --bin rdzv --bin bench_recovery
  RDZV_TORCH_PYTHON=$(scripts/torch-env.sh)
  export RDZV_TORCH_PYTHON
  if RDZV_NVRX_PYTHON=$(scripts/nvrx-env.sh 2>"$target/nvrx-env.log"); then
    export RDZV_NVRX_PYTHON
  else
    echo "no ft_launcher: scripts/nvrx-env.sh failed: $(tail -n 1 "$target/nvrx-env.log")" >&2
  fi
  "$target/release/bench_recovery" "$endpoint" "$@"
elif [ "${1:-}" = "--frameworks" ]; then
  shift
  cargo build --release --quiet -p rdzv-c -p rdzv-cli -p rdzv-bench --lib --bin rdzv --bin bench_frameworks
  RDZV_JAX_PYTHON=$(scripts/jax-env.sh) RDZV_TORCH_FRAMEWORKS_PYTHON=$(scripts/torch-frameworks-env.sh) \
    "$target/release/bench_frameworks" "$endpoint" "$@"
elif [ "${1:-}" = "--cluster" ]; then
  shift
  cargo build --release --quiet -p rdzv-bench --bin bench
  echo "a 3-member cluster: rounds, store, then rounds while the raft leader is killed"
  [ $# -gt 0 ] || set -- 8 64 256 1024 4096
  "$target/release/bench" "$endpoint" "$@"
  "$target/release/bench" "$endpoint" --leader-kill "$pids"
elif [ "${1:-}" = "--gloo" ]; then
  shift
  cargo build --release --quiet -p rdzv-c --lib
  cmake -S bindings/cpp -B "$target/gloo-bench" -DCMAKE_BUILD_TYPE=Release -DRDZV_BUILD_TESTS=OFF \
    -DRDZV_LIBRARY="$target/release/librdzv.so" >/dev/null
  cmake --build "$target/gloo-bench" --target rdzv_gloo_bench -j2 >/dev/null
  "$target/gloo-bench/cpp-gloo/rdzv_gloo_bench" "$endpoint" "$@"
elif [ "${1:-}" = "--quorum" ]; then
  shift
  cargo build --release --quiet -p rdzv-c --lib
  python=$(scripts/quorum-env.sh)
  RDZV_LIBRARY="$target/release/librdzv.so" PYTHONPATH="$PWD/bindings/python" \
    "$python" benches/bench_quorum.py "$endpoint" "$@" 2> >(grep -v '\[torchft::' >&2)
elif [ "${1:-}" = "--history" ]; then
  shift
  cargo build --release --quiet -p rdzv-bench --bin bench
  "$target/release/bench" "$endpoint" --history "$@"
elif [ "${1:-}" = "--watched" ]; then
  shift
  cargo build --release --quiet -p rdzv-bench --bin bench
  "$target/release/bench" "$endpoint" --watched "$@"
elif [ "${1:-}" = "--runs-watched" ]; then
  cargo build --release --quiet -p rdzv-bench --bin bench
  "$target/release/bench" "$endpoint" --runs-watched "${2:-1000}"
elif [ "${1:-}" = "--torch-at-rest" ]; then
  shift
  "$(scripts/torch-env.sh)" benches/at_rest_torch.py "$@"
elif [ "${1:-}" = "--phases" ]; then
  cargo build --release --quiet -p rdzv-bench --bin bench
  "$target/release/bench" "$endpoint" --phases "${2:-1024}"
elif [ "${1:-}" = "--processes" ]; then
  shift
  cargo build --release --quiet -p rdzv-c -p rdzv-bench --lib --bin bench_processes --bin bench_node
  "$target/release/bench_processes" "$endpoint" "$@"
  RDZV_LIBRARY="$target/release/librdzv.so" "$target/release/bench_processes" "$endpoint" --python
else
  cargo build --release --quiet -p rdzv-bench --bin bench
  "$target/release/bench" "$endpoint" "$@"
fi
