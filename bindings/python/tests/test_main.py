"""``python -m rdzv``: which ``rdzv`` command it runs, that it passes the arguments and the exit
status through, and what it says when there is none. Each test runs the package from a copy in
a made-up checkout, with a stand-in command, so the real build does not matter. (The command
installed by the wheel is checked by scripts/install-test.sh.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import PKG_ROOT

# Prints how it was called and exits 7, so that the test sees the exit status passed through.
STAND_IN = '#!/bin/sh\necho "{label}"\nprintf "arg=%s\\n" "$@"\nexit 7\n'


def _checkout(root: Path, builds: dict[str, str | None]) -> Path:
    """A checkout with the package and, per cargo profile, a stand-in command (None: none)."""
    root.mkdir()
    (root / "Cargo.toml").write_text("[package]\nname = \"rdzv\"\n")
    shutil.copytree(PKG_ROOT / "rdzv", root / "bindings" / "python" / "rdzv",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for profile, label in builds.items():
        if label is None:
            continue
        command = root / "target" / profile / "rdzv"
        command.parent.mkdir(parents=True)
        command.write_text(STAND_IN.format(label=label))
        command.chmod(0o755)
    return root


def _run(root: Path, *args: str, path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root / "bindings" / "python"), PATH=str(path))
    return subprocess.run([sys.executable, "-m", "rdzv", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def empty_path(tmp_path: Path) -> Path:
    path = tmp_path / "empty-bin"
    path.mkdir()
    return path


def test_runs_the_checkout_build_with_arguments_and_status(tmp_path, empty_path):
    root = _checkout(tmp_path / "repo", {"release": "release build", "debug": "debug build"})
    r = _run(root, "run", "--standalone", "a b", path=empty_path)
    assert r.returncode == 7, r.stderr
    assert r.stdout.splitlines() == ["release build", "arg=run", "arg=--standalone", "arg=a b"]


def test_debug_build_when_there_is_no_release_build(tmp_path, empty_path):
    root = _checkout(tmp_path / "repo", {"release": None, "debug": "debug build"})
    r = _run(root, "--help", path=empty_path)
    assert r.returncode == 7, r.stderr
    assert r.stdout.splitlines()[0] == "debug build"


def test_a_file_that_is_not_executable_is_passed_over(tmp_path, empty_path):
    root = _checkout(tmp_path / "repo", {"release": "release build", "debug": "debug build"})
    (root / "target" / "release" / "rdzv").chmod(0o644)
    r = _run(root, path=empty_path)
    assert r.stdout.splitlines()[0] == "debug build", r.stderr


def test_on_path_as_the_last_resort(tmp_path, empty_path):
    _skip_if_scripts_dir_has_rdzv()
    root = _checkout(tmp_path / "repo", {})
    command = empty_path / "rdzv"
    command.write_text(STAND_IN.format(label="on PATH"))
    command.chmod(0o755)
    r = _run(root, "status", path=empty_path)
    assert r.returncode == 7, r.stderr
    assert r.stdout.splitlines() == ["on PATH", "arg=status"]


def test_missing_command_is_a_clear_error(tmp_path, empty_path):
    _skip_if_scripts_dir_has_rdzv()
    root = _checkout(tmp_path / "repo", {})
    r = _run(root, "--help", path=empty_path)
    assert r.returncode == 1
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("python -m rdzv: the rdzv command was not found"), r.stderr
    assert str(root / "target" / "release" / "rdzv") in r.stderr
    assert "RDZV_PYTHON_ONLY=1" in r.stderr and "cargo build --bin rdzv" in r.stderr


def _skip_if_scripts_dir_has_rdzv() -> None:
    scripts = Path(sysconfig.get_path("scripts")) / "rdzv"
    if scripts.is_file():
        pytest.skip(f"{scripts} exists: this interpreter's scripts directory would be used")


# A stand-in for cargo: says how it was called, and builds a stand-in command where cargo
# would (beside the manifest it was given, its 6th argument). PATH holds only it, hence the
# tools' full paths.
FAKE_CARGO = """#!/bin/sh
echo "cargo $*" >&2
root="${{6%/*}}"
{mkdir} -p "$root/target/release"
printf '#!/bin/sh\\necho built\\nprintf "arg=%%s\\\\n" "$@"\\nexit 7\\n' > "$root/target/release/rdzv"
{chmod} +x "$root/target/release/rdzv"
"""


def test_a_checkout_without_a_build_builds_the_command_with_cargo_then_runs_it(tmp_path,
                                                                             empty_path):
    root = _checkout(tmp_path / "repo", {})
    cargo = empty_path / "cargo"
    cargo.write_text(FAKE_CARGO.format(mkdir=shutil.which("mkdir"), chmod=shutil.which("chmod")))
    cargo.chmod(0o755)
    r = _run(root, "run", "x", path=empty_path)
    assert r.returncode == 7, r.stderr
    assert r.stdout.splitlines() == ["built", "arg=run", "arg=x"]
    assert "building it (cargo build --release --bin rdzv)" in r.stderr
    manifest = root / "Cargo.toml"
    assert f"cargo build --release --bin rdzv --manifest-path {manifest}" in r.stderr
    # Built once: the next run finds it and says nothing of cargo.
    again = _run(root, "status", path=empty_path)
    assert again.returncode == 7 and "cargo" not in again.stderr, again.stderr


def test_a_failed_build_is_a_clear_error(tmp_path, empty_path):
    root = _checkout(tmp_path / "repo", {})
    cargo = empty_path / "cargo"
    cargo.write_text("#!/bin/sh\necho 'error: could not compile' >&2\nexit 101\n")
    cargo.chmod(0o755)
    r = _run(root, "run", path=empty_path)
    assert r.returncode == 1
    assert "error: could not compile" in r.stderr
    assert "building the rdzv command in" in r.stderr and "cargo exited 101" in r.stderr
    assert "Traceback" not in r.stderr
