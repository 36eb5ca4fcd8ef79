#!/usr/bin/env bash
# Creates (once) or reuses a virtual environment with PyTorch from the package registry, installs
# rdzv's Python package into it so torchrun finds the etcd-v3 backend through its entry point,
# and prints the environment's python. Cached in ${RDZV_CACHE:-~/.cache/rdzv}/torch-<version>:
# about 5.4 GB and 1.5 to 3 minutes (download and install) the first time, then a fraction of a
# second (no network).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh

# The one place the PyTorch version is pinned (the README names it too).
TORCH_VERSION=2.15.0
# setuptools and setuptools-rust are rdzv's build requirements: with them in the environment
# the package installs without build isolation, so later runs need no network.
PACKAGES=("torch==$TORCH_VERSION" numpy pytest setuptools setuptools-rust)
venv="$(rdzv_cache)/torch-$TORCH_VERSION"

create_env() {
  echo "creating $venv (PyTorch $TORCH_VERSION, once; about 5 GB)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --no-cache-dir "${PACKAGES[@]}" >&2
}

# The checkout's rdzv, editable and Python-only: the package loads the library the test command
# built (target/debug, found through RDZV_LIBRARY or the repository layout), so the tests run
# the code under test. Only the package metadata matters to torch: its torchrun.handlers entry
# point. The built wheel (Rust compiled by setuptools-rust) is tested by scripts/install-test.sh.
# Several checkouts may share the cache: the install is redone when it names another one.
install_rdzv() {
  local here
  here=$(pwd -P)/bindings/python
  if "$venv/bin/python" - "$here" <<'PY' 2>/dev/null; then return 0; fi
import json, sys
from importlib import metadata
url = json.loads(metadata.distribution("rdzv").read_text("direct_url.json"))["url"]
sys.exit(0 if url == "file://" + sys.argv[1] else 1)
PY
  RDZV_PYTHON_ONLY=1 "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation \
    --no-cache-dir -e "$here" >&2
}

cached_env "$venv" "${PACKAGES[*]}" create_env
install_rdzv
flock -u 9
echo "$venv/bin/python"
