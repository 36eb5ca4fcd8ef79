"""``python -m rdzv ARGS...`` runs the ``rdzv`` command (``rdzv run``, ``rdzv status``, ...):
the native launcher the wheel installs as a script, in place of this process.

The command is looked for, in order:

1. among the files installed with this very package (its distribution's RECORD), wherever the
   installation put its scripts (a virtual environment's ``bin``, ``~/.local/bin``, a prefix);
2. in the repository's build directories when the package lives in a checkout (an editable or
   ``PYTHONPATH`` use, where the Rust build is cargo's): ``target/release``, then
   ``target/debug``, as the library is found. With neither, and ``cargo`` on ``PATH``, it is
   built there first (``cargo build --release --bin rdzv``, saying so on stderr);
3. in this interpreter's scripts directory (``sysconfig.get_path("scripts")``);
4. on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

COMMAND = "rdzv.exe" if os.name == "nt" else "rdzv"


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _installed_with_package(here: Path) -> list[Path]:
    """The command from this package's own installation record. Only the distribution this
    module was imported from counts: another rdzv installed elsewhere on sys.path (when a
    checkout is used through PYTHONPATH, say) must not lend its command."""
    from importlib import metadata

    for dist in metadata.distributions(name="rdzv"):
        try:
            if Path(str(dist.locate_file("rdzv/__init__.py"))).resolve() != here / "__init__.py":
                continue
            files = dist.files or []
        except OSError:
            continue
        return [
            Path(str(dist.locate_file(f))).resolve()
            for f in files
            if f.name == COMMAND and f.parent.name in ("bin", "Scripts")
        ]
    return []


def _checkout(here: Path) -> Path | None:
    for parent in here.parents:
        if (parent / "Cargo.toml").is_file():
            return parent
    return None


def _in_checkout(here: Path) -> list[Path]:
    root = _checkout(here)
    if root is None:
        return []
    return [root / "target" / profile / COMMAND for profile in ("release", "debug")]


def _build(root: Path, cargo: str) -> Path:
    """Builds the checkout's command, as its README says to; raises ``FileNotFoundError`` with
    cargo's status when that fails."""
    print(f"python -m rdzv: no rdzv command is built in {root}: building it "
          "(cargo build --release --bin rdzv)", file=sys.stderr, flush=True)
    import subprocess

    status = subprocess.call([cargo, "build", "--release", "--bin", COMMAND,
                              "--manifest-path", str(root / "Cargo.toml")], stdout=sys.stderr)
    built = root / "target" / "release" / COMMAND
    if status != 0 or not _runnable(built):
        raise FileNotFoundError(f"building the {COMMAND} command in {root} failed (cargo "
                                f"exited {status}); its output is above")
    return built


def candidate_paths() -> list[Path]:
    """Where the command is looked for, in order (the PATH entry only if there is one)."""
    here = Path(__file__).resolve().parent
    paths = _installed_with_package(here) + _in_checkout(here)
    paths.append(Path(sysconfig.get_path("scripts")) / COMMAND)
    on_path = shutil.which(COMMAND)
    if on_path:
        paths.append(Path(on_path))
    return paths


def find_command() -> Path:
    """The ``rdzv`` executable; raises ``FileNotFoundError`` saying where it looked."""
    root = _checkout(Path(__file__).resolve().parent)
    # Built when the checkout's builds are tried and absent, before what is installed elsewhere.
    last_build = root / "target" / "debug" / COMMAND if root is not None else None
    tried = candidate_paths()
    for path in tried:
        if _runnable(path):
            return path
        cargo = shutil.which("cargo") if path == last_build else None
        if root is not None and cargo:
            return _build(root, cargo)
    raise FileNotFoundError(
        f"the {COMMAND} command was not found (looked in: "
        f"{', '.join(str(p) for p in tried)}, and on PATH). It is built and installed with the "
        "package by `pip install` (not with RDZV_PYTHON_ONLY=1, which builds no Rust); in a "
        "checkout, `cargo build --bin rdzv` puts it where this looks (and this builds it "
        "when cargo is on PATH)."
    )


def main() -> None:
    try:
        command = find_command()
    except FileNotFoundError as e:
        print(f"python -m rdzv: {e}", file=sys.stderr)
        sys.exit(1)
    args = [str(command), *sys.argv[1:]]
    if os.name == "nt":  # no exec there: run it and pass its status on
        import subprocess

        sys.exit(subprocess.call(args))
    # The command replaces this process: signals (Ctrl-C, a scheduler's SIGTERM) reach the
    # launcher directly and its exit status is the process's, as when run as `rdzv`.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command, args)


if __name__ == "__main__":
    main()
