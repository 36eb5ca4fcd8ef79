"""Routes the library's log records into Python's ``logging``, under the logger ``"rdzv"``.

Which records the library makes is set by the ``RDZV_LOG`` environment variable, read once,
when the library is first used (default ``warn``; ``RDZV_LOG=info`` or ``debug`` for more);
which of them are shown is up to the ``"rdzv"`` logger's configuration, as for any Python
library. Each record's message is the library's line (``round sealed run=job-7 node=... round=3
...``); ``record.rdzv_target`` names the module that made it and ``record.rdzv_fields`` holds
its fields as a dict (integers as ``int``).

Records are handed over on the library's threads, before the code that made them goes on, so
one node's records arrive in order. A logging handler may call rdzv; records such a call makes
on the same thread are dropped (a handler never runs inside itself).
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import re
from ctypes import CFUNCTYPE, c_char_p, c_int32, c_void_p

# rdzv_log_handler_t: (level, target, line, user_data). Declared here, not in _ffi, so that
# this module imports nothing of the package: _ffi routes the records here when it loads the
# library.
LogHandler = CFUNCTYPE(None, c_int32, c_char_p, c_char_p, c_void_p)

logger = logging.getLogger("rdzv")
# rdzv_log_level_t -> logging level (trace is below debug: logging has nothing finer).
_LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG, 5: logging.DEBUG}
# name=value, or name="value with \"escapes\"" (the library quotes values with spaces).
_FIELD = re.compile(r'(?:^| )([a-z_][a-z0-9_]*)=("(?:[^"\\]|\\.)*"|[^ ]*)')


# Fields that name something: kept as text even when they look like a number (a node id is
# 16 hex digits, which are all decimal ones now and then).
_NAMES = {"node", "run", "member", "by", "leader"}


def fields(line: str) -> dict[str, object]:
    """The ``name=value`` fields of a record's line, integers as ``int`` (ids stay text)."""
    out: dict[str, object] = {}
    for name, value in _FIELD.findall(line):
        if value.startswith('"') and value.endswith('"') and len(value) >= 2:
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        if name in _NAMES or name.endswith("_id"):
            out[name] = value
            continue
        try:
            out[name] = int(value)
        except ValueError:
            out[name] = value
    return out


def _forward(level: int, target: bytes, line: bytes, _user_data: int) -> None:
    # Called on the library's threads (ctypes takes the GIL); it must never raise into C.
    try:
        py_level = _LEVELS.get(level, logging.INFO)
        if not logger.isEnabledFor(py_level):
            return
        text = line.decode("utf-8", "replace")
        logger.log(
            py_level,
            "%s",
            text,
            extra={"rdzv_target": target.decode("utf-8", "replace"), "rdzv_fields": fields(text)},
        )
    except Exception:  # noqa: BLE001 - a logging failure must not reach the library
        pass


_handler = LogHandler(_forward)  # kept alive for as long as the library may call it


def route(cdll: ctypes.CDLL) -> None:
    cdll.rdzv_set_log_handler(_handler, None)
    # Stop the calls before the interpreter goes away (the library's threads outlive it).
    atexit.register(cdll.rdzv_set_log_handler, LogHandler(), None)
