"""The lifetime of a library handle, written once for the handler, the store and the admin
handle: ``Owned`` frees the handle once, after the last call in flight; ``Managed`` gives the
class that holds it ``close()``, ``closed``, the ``with`` statement and a close when collected."""

from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

from .errors import RendezvousShutdownError

__all__ = ["Managed", "Owned"]

_M = TypeVar("_M", bound="Managed")


class Owned:
    """A library handle used from several threads and freed once: ``close`` marks it closed at
    once, and the free happens when the last call in flight (``use``) has returned."""

    def __init__(self, ptr: Any, free: Callable[[Any], None], what: str):
        self._ptr = ptr
        self._free = free
        self._what = what
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False

    @property
    def closed(self) -> bool:
        return self._closing

    def use(self) -> _Use:
        return _Use(self)

    def _acquire(self) -> Any:
        with self._lock:
            if self._closing or not self._ptr:
                raise RendezvousShutdownError(f"the {self._what} is closed")
            self._users += 1
            return self._ptr

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            ptr = self._take_if_idle()
        if ptr is not None:
            self._free(ptr)

    def _take_if_idle(self) -> Any:
        if self._closing and self._users == 0 and self._ptr:
            ptr, self._ptr = self._ptr, None
            return ptr
        return None

    def close(self) -> None:
        with self._lock:
            self._closing = True
            ptr = self._take_if_idle()
        if ptr is not None:
            self._free(ptr)


class _Use:
    __slots__ = ("_owned", "_ptr")

    def __init__(self, owned: Owned):
        self._owned = owned

    def __enter__(self) -> Any:
        self._ptr = self._owned._acquire()
        return self._ptr

    def __exit__(self, *exc: object) -> None:
        self._owned._release()


class Managed:
    """Base of the classes that hold one library handle in ``self._res``. A subclass sets
    ``_res`` when it is made and may override ``_before_close`` (a handler's shutdown, an
    admin's cancel of its watch)."""

    _res: Owned

    def _before_close(self) -> None:
        """Runs once, before the handle is freed; the handle is still usable."""

    def close(self) -> None:
        """Frees the handle, once calls in other threads have returned. Idempotent."""
        # An __init__ that failed before it made the handle leaves nothing to free.
        res: Owned | None = getattr(self, "_res", None)
        if res is None or res.closed:
            return
        try:
            self._before_close()
        finally:
            res.close()

    @property
    def closed(self) -> bool:
        return self._res.closed

    def __enter__(self: _M) -> _M:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
