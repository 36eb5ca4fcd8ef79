"""Helpers shared by the wrappers: calling with an error out-parameter, string and byte
conversion, timeouts, cancel tokens, and running blocking calls so that Ctrl-C works (a
handle's lifetime is in ``_managed``)."""

from __future__ import annotations

import ctypes
import datetime
import math
import os
import threading
from typing import Any, Callable, Iterable, TypeVar, Union

from . import _ffi
from .errors import RendezvousInvalidArgumentError, RendezvousShutdownError, error_for

T = TypeVar("T")

#: A timeout argument: a ``datetime.timedelta`` or a number of seconds (``rdzv.Timeout``).
Timeout = Union[datetime.timedelta, float]

# Timeouts above this are capped by the library anyway (one year); keeps int64 safe.
_MAX_MS = 2**62


def lib() -> ctypes.CDLL:
    return _ffi.lib()


def call(fn: Callable[..., int], *args: Any) -> None:
    """Calls a fallible function with a trailing ``rdzv_error_t **`` and raises on failure.
    The error object is always freed."""
    err = _ffi.ErrorP()
    status = fn(*args, ctypes.byref(err))
    if status != _ffi.RDZV_OK:
        raise take_error(status, err)


def take_error(status: int, err: Any) -> Exception:
    L = lib()
    if err:
        try:
            status = L.rdzv_error_status(err)
            raw = L.rdzv_error_message(err)
            message = raw.decode("utf-8", "replace") if raw else ""
        finally:
            L.rdzv_error_free(err)
    else:
        raw = L.rdzv_status_name(status)
        message = raw.decode() if raw else f"status {status}"
    return error_for(status, message)


def cstr(value: Any, what: str) -> bytes:
    """A NUL-terminated UTF-8 string argument. Path-like objects are accepted."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        raise TypeError(f"{what}: expected str, got bytes")
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected str, got {type(value).__name__}")
    if "\0" in value:
        raise RendezvousInvalidArgumentError(f"{what}: must not contain a NUL character")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RendezvousInvalidArgumentError(f"{what}: not valid UTF-8 ({e})") from None


def key_arg(key: Any) -> bytes:
    return cstr(key, "key")


def keys_arg(keys: Any) -> list[bytes]:
    if isinstance(keys, str):  # a lone key, not its characters
        keys = [keys]
    return [key_arg(k) for k in keys]


def keys_array(encoded: list[bytes]) -> Any:
    return (ctypes.c_char_p * len(encoded))(*encoded)


def value_arg(value: Any) -> bytes:
    """A store value: bytes-like, or str (encoded as UTF-8)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store value: expected bytes or str, got {type(value).__name__}")


class Buffer:
    """A pointer to the bytes of ``data`` for the duration of a call (never NULL)."""

    def __init__(self, data: bytes):
        self._keep = ctypes.c_char_p(data)
        self.ptr = ctypes.cast(self._keep, _ffi.BytesP)
        self.len = len(data)


def take_bytes(ptr: Any, length: int) -> bytes:
    """Copies a library-owned buffer into ``bytes`` and frees it."""
    if not ptr:
        return b""
    try:
        return ctypes.string_at(ptr, length) if length else b""
    finally:
        lib().rdzv_bytes_free(ptr, length)


def seconds(timeout: Any, what: str = "timeout") -> float:
    """Seconds from a ``datetime.timedelta`` or a number of seconds; must be >= 0."""
    if isinstance(timeout, datetime.timedelta):
        secs = timeout.total_seconds()
    elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what}: expected datetime.timedelta or seconds, got {type(timeout).__name__}")
    else:
        secs = float(timeout)
    if math.isnan(secs) or secs < 0:
        raise RendezvousInvalidArgumentError(f"{what}: expected at least 0 seconds, got {timeout!r}")
    return secs


def timeout_ms(timeout: Any, what: str = "timeout") -> int:
    """Milliseconds for the library: ``None`` is -1 (the store's default)."""
    if timeout is None:
        return -1
    secs = seconds(timeout, what)
    if math.isinf(secs):
        return _MAX_MS
    return min(_MAX_MS, int(math.ceil(secs * 1000)))


class CancelToken:
    """A library cancel token (``rdzv_cancel_token_t``). Once cancelled it stays cancelled, so
    a cancel made just before the call it is passed to starts still ends that call: nobody
    needs to repeat it. Thread-safe; freed when collected."""

    def __init__(self) -> None:
        L = lib()
        ptr = _ffi.CancelTokenP()
        call(L.rdzv_cancel_token_new, ctypes.byref(ptr))
        self.ptr: Any = ptr  # None once freed
        self._free = L.rdzv_cancel_token_free

    def cancel(self) -> None:
        call(lib().rdzv_cancel_token_cancel, self.ptr)

    @property
    def cancelled(self) -> bool:
        out = ctypes.c_bool()
        call(lib().rdzv_cancel_token_is_cancelled, self.ptr, ctypes.byref(out))
        return bool(out.value)

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            self._free(ptr)


def run_cancellable(
    work: Callable[[Any], T],
    *,
    name: str,
    discard: Callable[[T], None] | None = None,
    in_place: bool = False,
) -> T:
    """Runs ``work(token)``, a call that talks to etcd (``token`` the ``rdzv_cancel_token_t *``
    to pass to its ``_with_cancel`` form), so that Ctrl-C ends it: on the main thread it runs
    as ``run_blocking`` does, with a cancel token of its own that Ctrl-C cancels (a token stays
    cancelled, so a Ctrl-C just as the call starts still ends it). Elsewhere, or ``in_place``
    (a call that does not wait), it runs on this thread with no token. A handle's ``cancel()``
    reaches its waits through the library (``rdzv_cancel``), whichever way they run."""
    if in_place or threading.current_thread() is not threading.main_thread():
        return work(None)
    token = CancelToken()
    # The closure keeps the token alive while the worker uses it, even once Ctrl-C has made
    # the caller give up on it.
    return run_blocking(lambda: work(token.ptr), name=name, cancel=token.cancel, discard=discard)


#: Where the call's cancel token goes among the arguments given to ``ask``.
TOKEN: Any = object()


def ask(res: Any, fn: Callable[..., int], *args: Any, name: str) -> None:
    """Calls ``fn(handle, *args)``, the ``_with_cancel`` form of a call that talks to etcd, on
    the handle ``res`` holds (an ``Owned``), with its cancel token where ``args`` has
    ``TOKEN``, so that Ctrl-C ends it (``run_cancellable``; a write so ended may or may not
    have been applied). Raises on failure."""

    def work(token: Any) -> None:
        with res.use() as p:
            call(fn, p, *(token if a is TOKEN else a for a in args))

    run_cancellable(work, name=name)


def run_blocking(
    work: Callable[[], T],
    *,
    name: str,
    cancel: Callable[[], None] | None = None,
    discard: Callable[[T], None] | None = None,
    grace: float = 10.0,
) -> T:
    """Runs a blocking foreign call so that Ctrl-C works.

    Signals reach only the main thread, and only between bytecodes; a foreign call blocks both.
    So on the main thread ``work`` runs in a worker thread (ctypes releases the GIL during the
    call) while the caller waits in short slices. On ``KeyboardInterrupt`` the caller calls
    ``cancel`` (if given: a cancel token's, which is never lost, so once), waits for the worker
    up to ``grace`` seconds, hands a result that nobody will read to ``discard``, and
    re-raises. ``work`` must own everything it uses (it may outlive the caller). Off the main
    thread ``work`` simply runs in place.
    """
    if threading.current_thread() is not threading.main_thread():
        return work()

    lock = threading.Lock()
    state: dict[str, Any] = {}
    # Completion is signalled with an Event, not observed with Thread.join/is_alive: on
    # CPython 3.11 a KeyboardInterrupt inside Thread.join() can mark a running thread as
    # stopped (the bpo-45274 clean-up), after which is_alive() wrongly returns False.
    done = threading.Event()

    def worker() -> None:
        value: Any  # the result, or the exception for the caller
        try:
            ok, value = True, work()
        except BaseException as e:  # handed to the caller
            ok, value = False, e
        with lock:
            state["outcome"] = (ok, value)
            abandoned = state.get("abandoned", False)
        done.set()
        if abandoned and ok and discard is not None:
            discard(value)

    thread = threading.Thread(target=worker, name=name, daemon=True)
    try:
        thread.start()
        while not done.wait(0.1):
            pass
    except KeyboardInterrupt as interrupt:
        if cancel is not None:
            try:
                try:
                    cancel()
                except Exception:
                    pass
                done.wait(grace)
            except KeyboardInterrupt:
                pass  # a second Ctrl-C: stop waiting for the worker
        with lock:
            state["abandoned"] = True
            outcome = state.get("outcome")
        if outcome is not None and outcome[0] and discard is not None:
            discard(outcome[1])
        raise interrupt
    ok, value = state["outcome"]
    if ok:
        return value
    raise value

