"""The worker of ``rdzv.launch``: ``python -m rdzv._launched DIR``, started by ``rdzv run``.

It prepares itself as ``multiprocessing``'s spawn does (the launching process's ``sys.path``,
working directory and main module), calls the pickled function with its arguments, and leaves
the pickled return value in ``DIR/result-{RANK}.pkl``. An exception is written to
``TORCHELASTIC_ERROR_FILE`` in torch's form (what its ``@record`` writes), its traceback goes
to stderr, and the worker exits 1.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
from pathlib import Path

from .launch import _write


def _traceback(error: BaseException) -> str:
    # From the function's frame on: this module's own frame says nothing about the failure.
    tb = error.__traceback__
    return "".join(traceback.format_exception(type(error), error, tb.tb_next if tb else None))


def _record(error: BaseException) -> None:
    """torch's error file for ``error``, where the launcher asked for it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    record = {"message": {
        "message": f"{type(error).__name__}: {error}",
        "extraInfo": {"py_callstack": _traceback(error), "timestamp": str(int(time.time()))},
    }}
    try:
        _write(Path(path), json.dumps(record).encode())
    except OSError as e:
        print(f"rdzv.launch: cannot write the error file {path}: {e}", file=sys.stderr)


def main(work: Path) -> int:
    import multiprocessing.spawn

    multiprocessing.spawn.prepare(pickle.loads((work / "prepare.pkl").read_bytes()))
    try:
        function, args = pickle.loads((work / "call.pkl").read_bytes())
        value = function(*args)
        data = pickle.dumps(value)
    except BaseException as error:  # noqa: B036 - SystemExit and Ctrl-C are failures too
        if isinstance(error, SystemExit) and error.code in (None, 0):
            # A function that exits 0 returned nothing.
            data = pickle.dumps(None)
        else:
            _record(error)
            print(_traceback(error), end="", file=sys.stderr)
            return error.code if isinstance(error, SystemExit) and isinstance(error.code, int) else 1
    _write(work / f"result-{os.environ['RANK']}.pkl", data)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
