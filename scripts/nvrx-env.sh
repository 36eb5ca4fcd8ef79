#!/usr/bin/env bash
# Prints the python of an environment with NVIDIA's nvidia-resiliency-ext (NVRx) 0.7.0, for
# `scripts/bench.sh --heartbeat`, which measures its RankMonitorClient.send_heartbeat() beside
# rdzv's heartbeat, and `scripts/bench.sh --launcher --case hang`, which runs its ft_launcher
# beside `rdzv run`. Made once beside the cached PyTorch environment (scripts/torch-env.sh) and
# layered on it as scripts/torch-frameworks-env.sh does. Cached in
# ${RDZV_CACHE:-~/.cache/rdzv}/nvrx-0.7.0: about 100 MB and a minute the first time.
#
# NVRx 0.7.0 is published only as a CPython 3.12 wheel for glibc 2.39 (manylinux_2_39), for its
# one compiled module (a CUPTI extension of the straggler detector). Its fault-tolerance package
# is pure Python that runs on 3.10 and later, so pip installs the wheel into the environment's
# site-packages with the wheel's own platform named (--target, --platform, --python-version):
# the compiled module is never imported by what the benchmark runs. Its dependencies (those of
# the wheel's metadata but PyTorch, which the layer below has) come from the registry as usual.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh
NVRX_VERSION=0.7.0
DEPS=(defusedxml "fastapi>=0.100.0" "grpcio>=1.76.0,<2" "grpcio-tools>=1.76.0,<2" "httpx>=0.24.0"
  "nvidia-ml-py>=12.570.86" packaging "protobuf>=4.22.0" "psutil>=6.0.0" "pydantic>=2.0.0"
  "pydantic-settings>=2.0.0" pyyaml "slowapi>=0.1.9" "uvicorn[standard]>=0.20.0")
torch_python=$(scripts/torch-env.sh)
venv="$(rdzv_cache)/nvrx-$NVRX_VERSION"
create_env() {
  echo "creating $venv (nvidia-resiliency-ext $NVRX_VERSION on the cached PyTorch, once)" >&2
  layered_venv "$venv" "$torch_python"
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$venv/bin/python" -m pip install -q --no-cache-dir --no-deps --target "$site" \
    --platform manylinux_2_39_x86_64 --python-version 3.12 --only-binary=:all: \
    "nvidia-resiliency-ext==$NVRX_VERSION" >&2
  "$venv/bin/python" -m pip install -q --no-cache-dir "${DEPS[@]}" >&2
  "$venv/bin/python" -c 'from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient, RankMonitorServer' >&2
}
cached_env "$venv" "nvidia-resiliency-ext==$NVRX_VERSION ${DEPS[*]} on $torch_python" create_env
flock -u 9
echo "$venv/bin/python"
