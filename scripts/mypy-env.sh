#!/usr/bin/env bash
# Creates (once) or reuses a virtual environment with mypy from the package registry and prints
# its python (the test command type-checks the Python package with it). Cached in
# ${RDZV_CACHE:-~/.cache/rdzv}/mypy-<version>: about 60 MB and 10 s the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh

# Pinned: a new mypy release may find new things, which must not break the test command.
MYPY_VERSION=2.4.1
venv="$(rdzv_cache)/mypy-$MYPY_VERSION"

create_env() {
  echo "creating $venv (mypy $MYPY_VERSION, once)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --no-cache-dir "mypy==$MYPY_VERSION" >&2
}

cached_env "$venv" "mypy==$MYPY_VERSION" create_env
flock -u 9
echo "$venv/bin/python"
