#!/usr/bin/env bash
# Prints the python of an environment with the frameworks built on PyTorch that read torchrun's
# environment, Lightning and DeepSpeed (for tests/launcher_torch_frameworks.rs and
# `scripts/bench.sh --frameworks`), made once beside the cached PyTorch environment
# (scripts/torch-env.sh) and layered on it as scripts/quorum-env.sh does: it sees that
# environment's torch through a .pth file, so torch is not installed twice and the PyTorch
# environment the tests use is left as it is. About 100 MB and 45 s the first time (DeepSpeed
# comes as source and is built into a wheel, Python only), then about 40 s of compiling for
# the one C++ op its CPU jobs load, built once into the environment's torch_extensions/.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/cached-env.sh
# The one place the Lightning and DeepSpeed versions are pinned.
LIGHTNING_VERSION=2.6.6
DEEPSPEED_VERSION=0.19.8
PACKAGES=("lightning==$LIGHTNING_VERSION" "deepspeed==$DEEPSPEED_VERSION")
torch_python=$(scripts/torch-env.sh)
venv="$(rdzv_cache)/torch-frameworks-$LIGHTNING_VERSION-$DEEPSPEED_VERSION"
create_env() {
  echo "creating $venv (Lightning $LIGHTNING_VERSION, DeepSpeed $DEEPSPEED_VERSION on the cached PyTorch, once)" >&2
  layered_venv "$venv" "$torch_python"
  # pip sees the layer's torch through the .pth file and installs only what these add.
  "$venv/bin/python" -m pip install -q --no-cache-dir "${PACKAGES[@]}" >&2
  "$venv/bin/python" -c 'import lightning, deepspeed, torch' >&2
}
# The marker names the layer below too, so a new PyTorch environment gets a new layer.
cached_env "$venv" "${PACKAGES[*]} on $torch_python" create_env
# DeepSpeed builds its C++ shared-memory op in every process that starts it, into
# TORCH_EXTENSIONS_DIR, by default one directory for the whole user: two test runs with
# environments in different places rebuilt it under each other, once per process (20 to 70 s
# each on a busy machine), until a job ran out of time. It is built here once, into the
# environment's own directory, which the tests and the benchmark point TORCH_EXTENSIONS_DIR at.
extensions="$venv/torch_extensions"
if [ ! -f "$extensions/.complete" ]; then
  echo "building DeepSpeed's shared-memory op into $extensions (once)" >&2
  TORCH_EXTENSIONS_DIR="$extensions" "$venv/bin/python" -c \
    'from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder("ShareMemCommBuilder").load()' >&2
  touch "$extensions/.complete"
fi
flock -u 9
echo "$venv/bin/python"
