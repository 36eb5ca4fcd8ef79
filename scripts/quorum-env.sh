#!/usr/bin/env bash
# Prints the python of an environment with torchft (for `scripts/bench.sh --quorum`), made once
# beside the cached PyTorch environment (scripts/torch-env.sh) and layered on it: it sees that
# environment's torch through a .pth file, so nothing is installed twice and the PyTorch
# environment the tests use is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCHFT_VERSION=0.2.0
torch_python=$(scripts/torch-env.sh)
cache=${RDZV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdzv}
venv="$cache/torchft-$TORCHFT_VERSION"
if [ ! -f "$venv/.complete" ]; then
  echo "creating $venv (torchft $TORCHFT_VERSION on the cached PyTorch, once)" >&2
  rm -rf "$venv"
  base=$("$torch_python" -c 'import sys; print(sys._base_executable)')
  "$base" -m venv "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$torch_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/torch-env.pth"
  # torch comes from the layer below; the rest of torchft's requirements are small.
  "$venv/bin/python" -m pip install -q --no-cache-dir --no-deps "torchft==$TORCHFT_VERSION" >&2
  "$venv/bin/python" -m pip install -q --no-cache-dir opentelemetry-api opentelemetry-sdk \
    opentelemetry-exporter-otlp-proto-http >&2
  "$venv/bin/python" -c 'import torchft' >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/python"
