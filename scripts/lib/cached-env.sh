# Shared by the scripts that make a cached virtual environment (torch-env.sh, jax-env.sh,
# torch-frameworks-env.sh, quorum-env.sh, mypy-env.sh, wheel.sh): sourced, not run.
#
# A virtual environment cannot be renamed (its scripts name their interpreter by absolute
# path), so it is made in place: under a lock, so that concurrent runs make it once, and with
# a marker written last, naming what was installed, so that an interrupted install, or one of
# another package list, is started over, never used.

# The cache every environment and etcd build lives in.
rdzv_cache() { echo "${RDZV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdzv}"; }

# cached_env VENV MARKER MAKE: takes VENV's lock (on fd 9, held until the caller exits or runs
# `flock -u 9`), and unless VENV/.complete says MARKER, removes VENV, runs the function MAKE
# (which creates VENV and installs into it) and writes the marker.
cached_env() {
  local venv=$1 marker=$2 make=$3
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock -w 1800 9 || { echo "timed out waiting for another run to create $venv" >&2; exit 1; }
  if [ "$(cat "$venv/.complete" 2>/dev/null)" != "$marker" ]; then
    rm -rf "$venv"
    "$make"
    echo "$marker" >"$venv/.complete"
  fi
}

# layered_venv VENV BASE_PYTHON: a new environment that sees BASE_PYTHON's packages through a
# .pth file, so that what the layer below has (PyTorch) is not installed twice and the
# environment below is left as it is.
layered_venv() {
  local venv=$1 base_python=$2 base site
  base=$("$base_python" -c 'import sys; print(sys._base_executable)')
  "$base" -m venv "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$base_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/torch-env.pth"
}
