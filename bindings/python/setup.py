"""Builds the Rust library and the `rdzv` command with cargo and ships both in the package
(setuptools-rust): the library, a plain C library loaded with ctypes (no Python extension
module), goes in the package directory; the command goes in the wheel's scripts, so installing
the wheel puts `rdzv` on the environment's PATH. Metadata lives in pyproject.toml.

RDZV_PYTHON_ONLY=1 skips the Rust build (the package then finds the library through
RDZV_LIBRARY or the repository's target/ directory, and `python -m rdzv` finds the command in
target/ too), for development installs."""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools_rust import Binding, RustBin, RustExtension, Strip

# The C library's crate is the repository's root, the command's is cli/; build from a checkout
# (or its sdist made there).
CARGO_TOML = Path(__file__).resolve().parent.parent.parent / "Cargo.toml"
CLI_CARGO_TOML = CARGO_TOML.parent / "cli" / "Cargo.toml"

# The names rdzv/_ffi.py looks for.
if sys.platform == "darwin":
    LIBRARY_FILE = "librdzv.dylib"
elif os.name == "nt":
    LIBRARY_FILE = "rdzv.dll"
else:
    LIBRARY_FILE = "librdzv.so"


class BuildExt(build_ext):
    """The library keeps its own name, librdzv.so. setuptools would name it like an extension
    module of the building interpreter (librdzv.cpython-311-x86_64-linux-gnu.so), which says
    something false about a library that any Python 3 loads with ctypes."""

    def get_ext_filename(self, fullname):
        if fullname.split(".")[-1] == "librdzv":
            return os.path.join(*fullname.split(".")[:-1], LIBRARY_FILE)
        return super().get_ext_filename(fullname)


class BdistWheel(bdist_wheel):
    """Tags the wheel py3-none-PLATFORM. It carries native code (so not -any) but nothing built
    against CPython's API or ABI: one wheel serves every Python 3 on the platform. setuptools
    would tag it for the building interpreter only (cp311-cp311-...)."""

    def get_tag(self):
        python, abi, plat = super().get_tag()
        if self.root_is_pure:  # RDZV_PYTHON_ONLY=1: nothing native, py3-none-any already
            return python, abi, plat
        return "py3", "none", plat


rust_extensions = []
if os.environ.get("RDZV_PYTHON_ONLY") != "1":
    rust_extensions += [
        RustExtension(
            "rdzv.librdzv",
            path=str(CARGO_TOML),
            binding=Binding.NoBinding,
            strip=Strip.Debug,  # the release profile keeps line tables for profiling
            # Cargo.toml's crate types ([lib] crate-type), not setuptools-rust's default of
            # cdylib alone: the library is then the same build as scripts/install.sh's, so a
            # build compiles the crate once. With cdylib alone each recompiled it.
            args=["--crate-type", "cdylib", "--crate-type", "staticlib"],
        ),
        # The launcher (the rdzv-cli crate), installed as a script: `rdzv run ...` on PATH.
        RustBin("rdzv", path=str(CLI_CARGO_TOML), args=["--bin", "rdzv"], strip=Strip.Debug),
    ]

setup(
    rust_extensions=rust_extensions,
    cmdclass={"build_ext": BuildExt, "bdist_wheel": BdistWheel},
    zip_safe=False,
)
