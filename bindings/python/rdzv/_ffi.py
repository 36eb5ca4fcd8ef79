"""ctypes declarations for every function of ``include/rdzv.h`` and the library lookup.

The library is found, in order:

1. the ``RDZV_LIBRARY`` environment variable (path to ``librdzv.so``; an error if it does not
   load, rather than a silent fall-back);
2. the package directory (a wheel or an install that copied ``librdzv.so`` next to this file);
3. the repository's build directories, found by walking up from this file to the directory that
   holds ``Cargo.toml``: ``target/release`` first, then ``target/debug``.

The library is loaded on first use, so ``import rdzv`` works without it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from ctypes import (
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint16,
    c_void_p,
    c_uint32,
    c_uint64,
    c_uint8,
)
from enum import IntEnum
from pathlib import Path

from ._log import LogHandler, route

# Constants from rdzv.h (checked against the header by the tests).
RDZV_MAX_VALUE_BYTES = (1024 * 1024) + (512 * 1024) - 4096
RDZV_ADDR_CAPACITY = 256
RDZV_MAX_KEY_BYTES = 4096


class Status(IntEnum):
    """``rdzv_status_t``: what a call returned, with the header's names and values (never
    renumbered). An ``IntEnum``, so it compares equal to the plain ints the library returns."""

    RDZV_OK = 0
    RDZV_ERR_INVALID_ARGUMENT = 1
    RDZV_ERR_CLOSED = 2
    RDZV_ERR_TIMEOUT = 3
    RDZV_ERR_CONNECTION = 4
    RDZV_ERR_STATE = 5
    RDZV_ERR_GRACEFUL_EXIT = 6
    RDZV_ERR_SHUTDOWN = 7
    RDZV_ERR_INTERNAL = 8
    RDZV_ERR_CANCELLED = 9


# The header's names at module level too, as before the enum.
RDZV_OK = Status.RDZV_OK
RDZV_ERR_INVALID_ARGUMENT = Status.RDZV_ERR_INVALID_ARGUMENT
RDZV_ERR_CLOSED = Status.RDZV_ERR_CLOSED
RDZV_ERR_TIMEOUT = Status.RDZV_ERR_TIMEOUT
RDZV_ERR_CONNECTION = Status.RDZV_ERR_CONNECTION
RDZV_ERR_STATE = Status.RDZV_ERR_STATE
RDZV_ERR_GRACEFUL_EXIT = Status.RDZV_ERR_GRACEFUL_EXIT
RDZV_ERR_SHUTDOWN = Status.RDZV_ERR_SHUTDOWN
RDZV_ERR_INTERNAL = Status.RDZV_ERR_INTERNAL
RDZV_ERR_CANCELLED = Status.RDZV_ERR_CANCELLED

STATUS_NAMES = {int(s): s.name for s in Status}

rdzv_status_t = c_int  # a C enum is int-sized


class rdzv_error_t(Structure):
    """Opaque."""


class rdzv_params_t(Structure):
    """Opaque."""


class rdzv_store_t(Structure):
    """Opaque."""


class rdzv_t(Structure):
    """Opaque."""


class rdzv_admin_t(Structure):
    """Opaque."""


class rdzv_cancel_token_t(Structure):
    """Opaque."""


class rdzv_round_t(Structure):
    _fields_ = [
        ("round", c_uint64),
        ("rank", c_uint32),
        ("world_size", c_uint32),
        ("master_port", c_uint16),
        ("master_addr", c_char * RDZV_ADDR_CAPACITY),
    ]


class rdzv_inprocess_round_t(Structure):
    _fields_ = [
        ("rank", c_uint32),
        ("world_size", c_uint32),
        ("local_rank", c_uint32),
        ("local_world_size", c_uint32),
        ("group_rank", c_uint32),
        ("group_world_size", c_uint32),
        ("restart_count", c_uint32),
        ("master_port", c_uint16),
        ("master_addr", c_char * RDZV_ADDR_CAPACITY),
    ]


class rdzv_member_t(Structure):
    _fields_ = [
        ("rank", c_uint32),
        ("node_id", c_char_p),
        ("addr", c_char_p),
        ("alive", c_bool),
        ("draining", c_bool),
    ]


class rdzv_joiner_t(Structure):
    _fields_ = [
        ("node_id", c_char_p),
        ("addr", c_char_p),
        ("member_rank", c_int64),
        ("draining", c_bool),
    ]


class rdzv_run_status_t(Structure):
    _fields_ = [
        ("run_id", c_char_p),
        ("exists", c_bool),
        ("closed", c_bool),
        ("open_round", c_uint64),
        ("has_sealed", c_bool),
        ("sealed_round", c_uint64),
        ("master_addr", c_char_p),
        ("master_port", c_uint16),
        ("members", POINTER(rdzv_member_t)),
        ("num_members", c_size_t),
        ("waiting", POINTER(rdzv_joiner_t)),
        ("num_waiting", c_size_t),
        ("num_lost", c_size_t),
        ("num_draining", c_size_t),
        ("num_alive", c_size_t),
        ("revision", c_int64),
    ]


ErrorP = POINTER(rdzv_error_t)
ErrorPP = POINTER(ErrorP)
ParamsP = POINTER(rdzv_params_t)
StoreP = POINTER(rdzv_store_t)
RdzvP = POINTER(rdzv_t)
AdminP = POINTER(rdzv_admin_t)
CancelTokenP = POINTER(rdzv_cancel_token_t)
RunStatusP = POINTER(rdzv_run_status_t)
BytesP = POINTER(c_uint8)
KeysP = POINTER(c_char_p)  # const char *const *
# rdzv_log_handler_t is LogHandler, declared in _log (which forwards the records).

# name -> (restype, [argtypes]); one entry per function of include/rdzv.h.
SIGNATURES = {
    "rdzv_status_name": (c_char_p, [c_int32]),
    "rdzv_error_status": (rdzv_status_t, [ErrorP]),
    "rdzv_error_message": (c_char_p, [ErrorP]),
    "rdzv_error_free": (None, [ErrorP]),
    "rdzv_bytes_free": (None, [BytesP, c_size_t]),
    "rdzv_cancel_token_new": (rdzv_status_t, [POINTER(CancelTokenP), ErrorPP]),
    "rdzv_cancel_token_cancel": (rdzv_status_t, [CancelTokenP, ErrorPP]),
    "rdzv_cancel_token_is_cancelled": (rdzv_status_t, [CancelTokenP, POINTER(c_bool), ErrorPP]),
    "rdzv_cancel_token_free": (None, [CancelTokenP]),
    "rdzv_params_from_url": (rdzv_status_t, [c_char_p, POINTER(ParamsP), ErrorPP]),
    "rdzv_params_new": (
        rdzv_status_t,
        [c_char_p, c_char_p, c_char_p, c_uint32, c_uint32, POINTER(ParamsP), ErrorPP],
    ),
    "rdzv_params_set": (rdzv_status_t, [ParamsP, c_char_p, c_char_p, ErrorPP]),
    "rdzv_params_free": (None, [ParamsP]),
    "rdzv_heartbeat": (None, []),
    "rdzv_heartbeat_step": (rdzv_status_t, [c_int64, ErrorPP]),
    "rdzv_progress_pause": (None, []),
    "rdzv_section_begin": (rdzv_status_t, [c_char_p, ErrorPP]),
    "rdzv_section_end": (rdzv_status_t, [c_char_p, ErrorPP]),
    "rdzv_set_stack_signal": (rdzv_status_t, [c_int32, ErrorPP]),
    "rdzv_is_monitored": (c_bool, []),
    "rdzv_inprocess_enabled": (c_bool, []),
    "rdzv_inprocess_check": (c_bool, []),
    "rdzv_inprocess_next": (rdzv_status_t, [c_int64, POINTER(rdzv_inprocess_round_t), ErrorPP]),
    "rdzv_new": (rdzv_status_t, [ParamsP, POINTER(RdzvP), ErrorPP]),
    "rdzv_next": (rdzv_status_t, [RdzvP, POINTER(rdzv_round_t), POINTER(StoreP), ErrorPP]),
    "rdzv_next_with_cancel": (
        rdzv_status_t,
        [RdzvP, CancelTokenP, POINTER(rdzv_round_t), POINTER(StoreP), ErrorPP],
    ),
    "rdzv_run_store": (rdzv_status_t, [RdzvP, POINTER(StoreP), ErrorPP]),
    "rdzv_run_store_with_cancel": (
        rdzv_status_t,
        [RdzvP, CancelTokenP, POINTER(StoreP), ErrorPP],
    ),
    "rdzv_is_closed": (rdzv_status_t, [RdzvP, POINTER(c_bool), ErrorPP]),
    "rdzv_is_closed_with_cancel": (rdzv_status_t, [RdzvP, CancelTokenP, POINTER(c_bool), ErrorPP]),
    "rdzv_set_closed": (rdzv_status_t, [RdzvP, ErrorPP]),
    "rdzv_set_closed_with_cancel": (rdzv_status_t, [RdzvP, CancelTokenP, ErrorPP]),
    "rdzv_num_waiting": (rdzv_status_t, [RdzvP, POINTER(c_uint32), ErrorPP]),
    "rdzv_num_waiting_with_cancel": (
        rdzv_status_t,
        [RdzvP, CancelTokenP, POINTER(c_uint32), ErrorPP],
    ),
    "rdzv_num_lost": (rdzv_status_t, [RdzvP, POINTER(c_uint32), ErrorPP]),
    "rdzv_num_lost_with_cancel": (rdzv_status_t, [RdzvP, CancelTokenP, POINTER(c_uint32), ErrorPP]),
    "rdzv_cancel": (rdzv_status_t, [RdzvP, ErrorPP]),
    "rdzv_shutdown": (rdzv_status_t, [RdzvP, ErrorPP]),
    "rdzv_free": (None, [RdzvP]),
    "rdzv_run_id": (c_char_p, [RdzvP]),
    "rdzv_backend": (c_char_p, [RdzvP]),
    "rdzv_node_id": (c_char_p, [RdzvP]),
    "rdzv_store_set": (rdzv_status_t, [StoreP, c_char_p, BytesP, c_size_t, ErrorPP]),
    "rdzv_store_set_with_cancel": (
        rdzv_status_t,
        [StoreP, c_char_p, BytesP, c_size_t, CancelTokenP, ErrorPP],
    ),
    "rdzv_store_get": (
        rdzv_status_t,
        [StoreP, c_char_p, c_int64, POINTER(BytesP), POINTER(c_size_t), ErrorPP],
    ),
    "rdzv_store_get_with_cancel": (
        rdzv_status_t,
        [StoreP, c_char_p, c_int64, CancelTokenP, POINTER(BytesP), POINTER(c_size_t), ErrorPP],
    ),
    "rdzv_store_add": (rdzv_status_t, [StoreP, c_char_p, c_int64, POINTER(c_int64), ErrorPP]),
    "rdzv_store_add_with_cancel": (
        rdzv_status_t,
        [StoreP, c_char_p, c_int64, CancelTokenP, POINTER(c_int64), ErrorPP],
    ),
    "rdzv_store_compare_set": (
        rdzv_status_t,
        [
            StoreP,
            c_char_p,
            BytesP,
            c_size_t,
            BytesP,
            c_size_t,
            POINTER(BytesP),
            POINTER(c_size_t),
            ErrorPP,
        ],
    ),
    "rdzv_store_compare_set_with_cancel": (
        rdzv_status_t,
        [
            StoreP,
            c_char_p,
            BytesP,
            c_size_t,
            BytesP,
            c_size_t,
            CancelTokenP,
            POINTER(BytesP),
            POINTER(c_size_t),
            ErrorPP,
        ],
    ),
    "rdzv_store_wait": (rdzv_status_t, [StoreP, KeysP, c_size_t, c_int64, ErrorPP]),
    "rdzv_store_wait_with_cancel": (
        rdzv_status_t,
        [StoreP, KeysP, c_size_t, c_int64, CancelTokenP, ErrorPP],
    ),
    "rdzv_store_check": (rdzv_status_t, [StoreP, KeysP, c_size_t, POINTER(c_bool), ErrorPP]),
    "rdzv_store_check_with_cancel": (
        rdzv_status_t,
        [StoreP, KeysP, c_size_t, CancelTokenP, POINTER(c_bool), ErrorPP],
    ),
    "rdzv_store_delete_key": (rdzv_status_t, [StoreP, c_char_p, POINTER(c_bool), ErrorPP]),
    "rdzv_store_delete_key_with_cancel": (
        rdzv_status_t,
        [StoreP, c_char_p, CancelTokenP, POINTER(c_bool), ErrorPP],
    ),
    "rdzv_store_num_keys": (rdzv_status_t, [StoreP, POINTER(c_int64), ErrorPP]),
    "rdzv_store_num_keys_with_cancel": (
        rdzv_status_t,
        [StoreP, CancelTokenP, POINTER(c_int64), ErrorPP],
    ),
    "rdzv_store_multi_get": (
        rdzv_status_t,
        [StoreP, KeysP, c_size_t, c_int64, POINTER(BytesP), POINTER(c_size_t), ErrorPP],
    ),
    "rdzv_store_multi_get_with_cancel": (
        rdzv_status_t,
        [
            StoreP,
            KeysP,
            c_size_t,
            c_int64,
            CancelTokenP,
            POINTER(BytesP),
            POINTER(c_size_t),
            ErrorPP,
        ],
    ),
    "rdzv_store_multi_set": (
        rdzv_status_t,
        [StoreP, KeysP, POINTER(BytesP), POINTER(c_size_t), c_size_t, ErrorPP],
    ),
    "rdzv_store_multi_set_with_cancel": (
        rdzv_status_t,
        [StoreP, KeysP, POINTER(BytesP), POINTER(c_size_t), c_size_t, CancelTokenP, ErrorPP],
    ),
    "rdzv_store_set_timeout": (rdzv_status_t, [StoreP, c_int64, ErrorPP]),
    "rdzv_store_cancel": (rdzv_status_t, [StoreP, ErrorPP]),
    "rdzv_version": (c_char_p, []),
    "rdzv_set_log_handler": (None, [LogHandler, c_void_p]),
    "rdzv_store_free": (None, [StoreP]),
    "rdzv_admin_new": (rdzv_status_t, [ParamsP, POINTER(AdminP), ErrorPP]),
    "rdzv_admin_free": (None, [AdminP]),
    "rdzv_admin_status": (rdzv_status_t, [AdminP, POINTER(RunStatusP), ErrorPP]),
    "rdzv_admin_status_with_cancel": (
        rdzv_status_t,
        [AdminP, CancelTokenP, POINTER(RunStatusP), ErrorPP],
    ),
    "rdzv_admin_watch": (rdzv_status_t, [AdminP, c_int64, POINTER(RunStatusP), ErrorPP]),
    "rdzv_admin_watch_with_cancel": (
        rdzv_status_t,
        [AdminP, c_int64, CancelTokenP, POINTER(RunStatusP), ErrorPP],
    ),
    "rdzv_admin_cancel": (rdzv_status_t, [AdminP, ErrorPP]),
    "rdzv_admin_close": (rdzv_status_t, [AdminP, ErrorPP]),
    "rdzv_admin_close_with_cancel": (rdzv_status_t, [AdminP, CancelTokenP, ErrorPP]),
    "rdzv_admin_purge": (
        rdzv_status_t,
        [AdminP, c_bool, POINTER(c_int64), POINTER(c_uint32), ErrorPP],
    ),
    "rdzv_admin_purge_with_cancel": (
        rdzv_status_t,
        [AdminP, c_bool, CancelTokenP, POINTER(c_int64), POINTER(c_uint32), ErrorPP],
    ),
    "rdzv_admin_drain": (rdzv_status_t, [AdminP, c_char_p, c_char_p, ErrorPP]),
    "rdzv_admin_drain_with_cancel": (
        rdzv_status_t,
        [AdminP, c_char_p, c_char_p, CancelTokenP, ErrorPP],
    ),
    "rdzv_drain": (rdzv_status_t, [RdzvP, c_char_p, ErrorPP]),
    "rdzv_drain_with_cancel": (rdzv_status_t, [RdzvP, c_char_p, CancelTokenP, ErrorPP]),
    "rdzv_is_draining": (rdzv_status_t, [RdzvP, POINTER(c_bool), ErrorPP]),
    "rdzv_is_draining_with_cancel": (
        rdzv_status_t,
        [RdzvP, CancelTokenP, POINTER(c_bool), ErrorPP],
    ),
    "rdzv_run_status_free": (None, [RunStatusP]),
}

if sys.platform == "darwin":
    LIBRARY_FILE = "librdzv.dylib"
elif os.name == "nt":
    LIBRARY_FILE = "rdzv.dll"
else:
    LIBRARY_FILE = "librdzv.so"

ENV_VAR = "RDZV_LIBRARY"


def candidate_paths() -> list[Path]:
    """Where the library is looked for when ``RDZV_LIBRARY`` is not set, in order."""
    here = Path(__file__).resolve().parent
    # A wheel ships the library next to this file.
    paths = [here / LIBRARY_FILE]
    for parent in here.parents:
        if (parent / "Cargo.toml").is_file():
            paths.append(parent / "target" / "release" / LIBRARY_FILE)
            paths.append(parent / "target" / "debug" / LIBRARY_FILE)
            break
    return paths


def find_library() -> Path:
    """The path of the library that would be loaded; raises ``OSError`` if there is none."""
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env)
        if not path.is_file():
            raise OSError(f"{ENV_VAR}={env!r} does not name a file")
        return path
    tried = candidate_paths()
    for path in tried:
        if path.is_file():
            return path
    raise OSError(
        f"{LIBRARY_FILE} not found: set {ENV_VAR} to its path, or build it with `cargo build`. "
        f"Tried: {', '.join(str(p) for p in tried)}"
    )


def _declare(cdll: ctypes.CDLL) -> ctypes.CDLL:
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(cdll, name)  # AttributeError names a missing symbol
        fn.restype = restype
        fn.argtypes = argtypes
    return cdll


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def lib() -> ctypes.CDLL:
    """The loaded library with every function declared; loaded on first call."""
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                path = find_library()
                try:
                    cdll = ctypes.CDLL(str(path))
                except OSError as e:
                    raise OSError(f"cannot load {path}: {e}") from e
                _lib = _declare(cdll)
                route(_lib)
    return _lib


def library_path() -> str:
    """The file name of the loaded library."""
    return lib()._name
