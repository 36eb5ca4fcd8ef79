#!/usr/bin/env bash
# Creates (once) or reuses a virtual environment with JAX for CPUs from the package registry
# and prints its python (for tests/launcher_jax.rs and `scripts/bench.sh --frameworks`). Cached
# in ${RDZV_CACHE:-~/.cache/rdzv}/jax-<version>: about 600 MB and 20 s the first time, then a
# fraction of a second (no network). Exits 3, saying why, when the registry has no JAX build
# for this machine's Python or platform (callers skip then); any other failure is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh

# The one place the JAX version is pinned. jaxlib carries XLA and its CPU collectives (gloo).
JAX_VERSION=0.10.2
PACKAGES=("jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" numpy)
venv="$(rdzv_cache)/jax-$JAX_VERSION"

create_env() {
  echo "creating $venv (JAX $JAX_VERSION for CPUs, once; about 600 MB)" >&2
  python3 -m venv "$venv"
  local log
  log=$(mktemp)
  if ! "$venv/bin/python" -m pip install -q --no-cache-dir "${PACKAGES[@]}" 2>"$log"; then
    cat "$log" >&2
    if grep -q -e 'No matching distribution found' -e 'Could not find a version' "$log"; then
      rm -f "$log"
      rm -rf "$venv"
      echo "the package registry has no JAX $JAX_VERSION for $(python3 -V) on $(uname -m)" >&2
      exit 3
    fi
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
}

cached_env "$venv" "${PACKAGES[*]}" create_env
flock -u 9
echo "$venv/bin/python"
