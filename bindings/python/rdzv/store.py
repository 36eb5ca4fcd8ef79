"""``Store``: the key-value store of one round, as c10d's ``Store`` (values are bytes)."""

from __future__ import annotations

import ctypes
import datetime
import itertools
from typing import Any, Callable, Sequence, TypeVar

from . import _ffi
from ._managed import Managed, Owned
from ._native import (
    TOKEN,
    Buffer,
    Timeout,
    ask,
    call,
    key_arg,
    keys_arg,
    keys_array,
    lib,
    run_cancellable,
    seconds,
    take_bytes,
    timeout_ms,
    value_arg,
)
from .errors import RendezvousInvalidArgumentError

__all__ = ["Store"]

_ids = itertools.count()

T = TypeVar("T")


class Store(Managed):
    """The store of one round, returned in ``RendezvousInfo.store``, or of the whole run
    (``EtcdV3RendezvousHandler.run_store()``), with the same calls.

    Keys are non-empty ``str`` (at most 4096 bytes of UTF-8); values are ``bytes`` or ``str``
    (encoded as UTF-8) and always come back as ``bytes``. Timeouts are ``datetime.timedelta``
    or seconds; ``None`` means the store's default (``timeout``, 300 s unless the
    ``store_timeout`` option or ``set_timeout`` changed it) and 0 means "do not wait".
    Thread-safe. Its calls raise ``RendezvousShutdownError`` once the handler it came from is
    shut down or closed (a wait in progress is woken), and a wait whose keys are still missing
    when the run is closed raises ``RendezvousClosedError``. Ctrl-C cancels a wait, and any
    other call (a write so ended may or may not have been applied). A wait ends at once on
    ``cancel()`` or the handler's shutdown, and within a second of its timeout, whatever etcd
    is doing.
    ``close()`` (or a ``with`` block) frees it; a call blocked in another thread finishes first.
    """

    _timeout: float
    _name: str

    def __init__(self, *args: object, **kwargs: object):
        raise TypeError(
            "a Store comes from next_rendezvous() or run_store(); it cannot be created directly"
        )

    @classmethod
    def _from_ptr(cls, ptr: Any, timeout: float) -> Store:
        self = cls.__new__(cls)
        self._res = Owned(ptr, lib().rdzv_store_free, "store")
        self._timeout = float(timeout)
        self._name = f"rdzv-store-{next(_ids)}"
        return self

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Frees the store. Idempotent; later calls raise ``RendezvousShutdownError``."""
        super().close()

    # -- c10d Store API -----------------------------------------------------------------------

    def set(self, key: str, value: bytes | str) -> None:
        """Sets ``key`` to ``value``."""
        k, buf = key_arg(key), Buffer(value_arg(value))
        self._ask(lib().rdzv_store_set_with_cancel, k, buf.ptr, buf.len, TOKEN)

    def get(self, key: str, timeout: Timeout | None = None) -> bytes:
        """Waits for ``key`` to be set and returns its value; ``RendezvousTimeoutError`` if it
        is still absent after ``timeout``."""
        k, ms = key_arg(key), timeout_ms(timeout)

        def work(token: Any) -> bytes:
            with self._res.use() as p:
                ptr, n = _ffi.BytesP(), ctypes.c_size_t()
                call(lib().rdzv_store_get_with_cancel, p, k, ms, token, ctypes.byref(ptr),
                     ctypes.byref(n))
                return take_bytes(ptr, n.value)

        return self._blocking(work, ms)

    def add(self, key: str, amount: int) -> int:
        """Atomically adds ``amount`` to the integer at ``key`` (absent is 0); returns the sum."""
        if isinstance(amount, bool) or not isinstance(amount, int) or not -(2**63) <= amount < 2**63:
            raise TypeError(f"amount: expected a 64-bit int, got {amount!r}")
        k, out = key_arg(key), ctypes.c_int64()
        self._ask(lib().rdzv_store_add_with_cancel, k, amount, TOKEN, ctypes.byref(out))
        return out.value

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:
        """Sets ``key`` to ``desired_value`` if it holds ``expected_value`` (or is absent and
        ``expected_value`` is empty); returns the value the key holds afterwards (when the key
        is absent and ``expected_value`` is not empty: ``expected_value``)."""
        k = key_arg(key)
        exp, des = Buffer(value_arg(expected_value)), Buffer(value_arg(desired_value))
        ptr, n = _ffi.BytesP(), ctypes.c_size_t()
        self._ask(
            lib().rdzv_store_compare_set_with_cancel,
            k, exp.ptr, exp.len, des.ptr, des.len, TOKEN, ctypes.byref(ptr), ctypes.byref(n),
        )
        return take_bytes(ptr, n.value)

    def wait(self, keys: Sequence[str] | str, timeout: Timeout | None = None) -> None:
        """Waits until every key exists; ``RendezvousTimeoutError`` after ``timeout``."""
        ks, ms = keys_arg(keys), timeout_ms(timeout)

        def work(token: Any) -> None:
            arr = keys_array(ks)
            with self._res.use() as p:
                call(lib().rdzv_store_wait_with_cancel, p, arr, len(ks), ms, token)

        self._blocking(work, ms)

    def check(self, keys: Sequence[str] | str) -> bool:
        """Whether every key exists now. Does not wait."""
        ks = keys_arg(keys)
        arr, out = keys_array(ks), ctypes.c_bool()
        self._ask(lib().rdzv_store_check_with_cancel, arr, len(ks), TOKEN, ctypes.byref(out))
        return bool(out.value)

    def delete_key(self, key: str) -> bool:
        """Deletes ``key``; returns whether it existed."""
        k, out = key_arg(key), ctypes.c_bool()
        self._ask(lib().rdzv_store_delete_key_with_cancel, k, TOKEN, ctypes.byref(out))
        return bool(out.value)

    def num_keys(self) -> int:
        """The number of keys in this round's store."""
        out = ctypes.c_int64()
        self._ask(lib().rdzv_store_num_keys_with_cancel, TOKEN, ctypes.byref(out))
        return out.value

    def multi_get(self, keys: Sequence[str], timeout: Timeout | None = None) -> list[bytes]:
        """Waits for every key, then returns their values read at one revision."""
        ks, ms = keys_arg(keys), timeout_ms(timeout)

        def work(token: Any) -> list[bytes]:
            arr = keys_array(ks)
            ptrs = (_ffi.BytesP * len(ks))()
            lens = (ctypes.c_size_t * len(ks))()
            with self._res.use() as p:
                call(lib().rdzv_store_multi_get_with_cancel, p, arr, len(ks), ms, token, ptrs, lens)
            out: list[bytes] = []
            try:
                for i in range(len(ks)):
                    out.append(take_bytes(ptrs[i], lens[i]))
                    ptrs[i] = _ffi.BytesP()
            finally:  # free the rest even if a copy failed
                for i in range(len(out), len(ks)):
                    if ptrs[i]:
                        lib().rdzv_bytes_free(ptrs[i], lens[i])
            return out

        return self._blocking(work, ms)

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        """Sets every ``keys[i]`` to ``values[i]``, all or nothing (beyond 128 keys, each 128
        in turn, as ``rdzv_store_multi_set`` says)."""
        ks = keys_arg(keys)
        vs = [value_arg(v) for v in values]
        if len(ks) != len(vs):
            raise RendezvousInvalidArgumentError(
                f"multi_set: {len(ks)} keys but {len(vs)} values"
            )
        bufs = [Buffer(v) for v in vs]
        arr = keys_array(ks)
        ptrs = (_ffi.BytesP * len(bufs))(*[b.ptr for b in bufs])
        lens = (ctypes.c_size_t * len(bufs))(*[b.len for b in bufs])
        self._ask(lib().rdzv_store_multi_set_with_cancel, arr, ptrs, lens, len(ks), TOKEN)

    def set_timeout(self, timeout: Timeout) -> None:
        """Sets the default timeout of ``get``, ``wait`` and ``multi_get``."""
        secs = seconds(timeout)
        ms = timeout_ms(secs)
        with self._res.use() as p:
            call(lib().rdzv_store_set_timeout, p, ms)
        self._timeout = secs

    @property
    def timeout(self) -> datetime.timedelta:
        """The default timeout of ``get``, ``wait`` and ``multi_get``."""
        return datetime.timedelta(seconds=min(self._timeout, 365 * 86400.0))

    # -- helpers ------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Ends the ``get``, ``wait`` and ``multi_get`` calls in progress on this store in other
        threads (they raise ``RendezvousCancelledError``) and any that start before they have
        returned; with none in progress, the next one to start. A cancel is never lost (the
        library keeps it, ``rdzv_store_cancel``); it is used up once a wait has raised because
        of it, and the store stays usable."""
        with self._res.use() as p:
            call(lib().rdzv_store_cancel, p)

    def _blocking(self, work: Callable[[Any], T], ms: int) -> T:
        # A wait with timeout 0 does not wait: it runs on this thread.
        return run_cancellable(work, name=self._name, in_place=ms == 0)

    def _ask(self, fn: Any, *args: Any) -> None:
        ask(self._res, fn, *args, name=self._name)

    def __repr__(self) -> str:
        return f"<rdzv.Store{' closed' if self.closed else ''}>"
