#!/usr/bin/env bash
# Creates (once) or reuses a virtual environment with PyTorch from the package registry, and
# installs rdzv's Python package into it so torchrun finds the etcd-v3 backend through its
# entry point. Prints the environment's python. Cached in
# ${RDZV_CACHE:-~/.cache/rdzv}/torch-<version>: about 5 GB and 2 minutes the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.15.0
cache=${RDZV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdzv}
venv="$cache/torch-$TORCH_VERSION"
# The marker is written last: an interrupted install is started over, never used.
if [ ! -f "$venv/.complete" ]; then
  echo "creating $venv (PyTorch $TORCH_VERSION, once)" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "torch==$TORCH_VERSION" numpy pytest >&2
  touch "$venv/.complete"
fi

install_rdzv() {
  # Editable and Python-only: the library is the checkout's own build (target/), so the
  # tests use the code under test; the wheel (Rust build included) is tested by install-test.sh.
  RDZV_PYTHON_ONLY=1 "$venv/bin/pip" install -q --no-deps -e bindings/python >&2
}
install_rdzv
echo "$venv/bin/python"
