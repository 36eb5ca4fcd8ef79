"""Routes the library's log records into Python's ``logging``, under the logger ``"rdzv"``.

Which records the library makes is set by the ``RDZV_LOG`` environment variable (default
``warn``; ``RDZV_LOG=info`` or ``debug`` for more); which of them are shown is up to the
``"rdzv"`` logger's configuration, as for any Python library. Each record carries the module
that made it as ``record.rdzv_target``.
"""

from __future__ import annotations

import atexit
import ctypes
import logging

from ._ffi import LogHandler

logger = logging.getLogger("rdzv")
_LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG, 5: logging.DEBUG}


def _forward(level: int, target: bytes, line: bytes, _user_data: int) -> None:
    # Called on the library's threads (ctypes takes the GIL); it must never raise into C.
    try:
        logger.log(
            _LEVELS.get(level, logging.INFO),
            "%s",
            line.decode("utf-8", "replace"),
            extra={"rdzv_target": target.decode("utf-8", "replace")},
        )
    except Exception:  # noqa: BLE001 - a logging failure must not reach the library
        pass


_handler = LogHandler(_forward)  # kept alive for as long as the library may call it


def route(cdll: ctypes.CDLL) -> None:
    cdll.rdzv_set_log_handler(_handler, None)
    # Stop the calls before the interpreter goes away (the library's threads outlive it).
    atexit.register(cdll.rdzv_set_log_handler, LogHandler(), None)
