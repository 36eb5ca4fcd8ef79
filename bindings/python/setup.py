"""Builds the Rust library with cargo and ships it inside the package (setuptools-rust, in
its no-binding mode: a plain C library that the package loads with ctypes). Metadata lives in
pyproject.toml. RDZV_PYTHON_ONLY=1 skips the Rust build (the package then finds the library
through RDZV_LIBRARY or the repository's target/ directory), for development installs."""

import os
from pathlib import Path

from setuptools import setup
from setuptools_rust import Binding, RustExtension, Strip

# The crate is the repository's root; build from a checkout (or its sdist made there).
CARGO_TOML = Path(__file__).resolve().parent.parent.parent / "Cargo.toml"

rust_extensions = []
if os.environ.get("RDZV_PYTHON_ONLY") != "1":
    rust_extensions.append(
        RustExtension(
            "rdzv.librdzv",
            path=str(CARGO_TOML),
            binding=Binding.NoBinding,
            strip=Strip.Debug,  # the release profile keeps line tables for profiling
        )
    )

setup(rust_extensions=rust_extensions, zip_safe=False)
