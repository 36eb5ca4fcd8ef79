#!/usr/bin/env bash
# Prints the python of an environment with torchft (for `scripts/bench.sh --quorum`), made once
# beside the cached PyTorch environment (scripts/torch-env.sh) and layered on it: it sees that
# environment's torch through a .pth file, so nothing is installed twice and the PyTorch
# environment the tests use is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh
TORCHFT_VERSION=0.2.0
torch_python=$(scripts/torch-env.sh)
venv="$(rdzv_cache)/torchft-$TORCHFT_VERSION"
create_env() {
  echo "creating $venv (torchft $TORCHFT_VERSION on the cached PyTorch, once)" >&2
  layered_venv "$venv" "$torch_python"
  # torch comes from the layer below; the rest of torchft's requirements are small.
  "$venv/bin/python" -m pip install -q --no-cache-dir --no-deps "torchft==$TORCHFT_VERSION" >&2
  "$venv/bin/python" -m pip install -q --no-cache-dir opentelemetry-api opentelemetry-sdk \
    opentelemetry-exporter-otlp-proto-http >&2
  "$venv/bin/python" -c 'import torchft' >&2
}
cached_env "$venv" "torchft==$TORCHFT_VERSION on $torch_python" create_env
flock -u 9
echo "$venv/bin/python"
