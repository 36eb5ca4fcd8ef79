"""Exceptions, one per ``rdzv_status_t``, named and arranged like torch's
``torch.distributed.elastic.rendezvous`` exceptions."""

from __future__ import annotations

from . import _ffi
from ._ffi import Status

__all__ = [
    "Status",
    "RendezvousError",
    "RendezvousClosedError",
    "RendezvousTimeoutError",
    "RendezvousConnectionError",
    "RendezvousStateError",
    "RendezvousGracefulExitError",
    "RendezvousShutdownError",
    "RendezvousCancelledError",
    "RendezvousInternalError",
    "RendezvousInvalidArgumentError",
]


class RendezvousError(Exception):
    """Base of every rdzv error. ``status`` is the ``rdzv_status_t`` value: a ``Status``, or a
    plain int for a value this package does not know."""

    status: int = Status.RDZV_ERR_INTERNAL

    def __init__(self, message: str = "", status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = Status(status) if status in _ffi.STATUS_NAMES else status

    @property
    def status_name(self) -> str:
        return _ffi.STATUS_NAMES.get(self.status, f"RDZV_STATUS_{self.status}")


class RendezvousInvalidArgumentError(RendezvousError, ValueError):
    """RDZV_ERR_INVALID_ARGUMENT: an argument or option was malformed; nothing changed."""

    status = Status.RDZV_ERR_INVALID_ARGUMENT


class RendezvousClosedError(RendezvousError):
    """RDZV_ERR_CLOSED: the run is closed."""

    status = Status.RDZV_ERR_CLOSED


class RendezvousTimeoutError(RendezvousError):
    """RDZV_ERR_TIMEOUT: the call did not complete in time."""

    status = Status.RDZV_ERR_TIMEOUT


class RendezvousConnectionError(RendezvousError):
    """RDZV_ERR_CONNECTION: etcd unreachable, or this node's lease expired."""

    status = Status.RDZV_ERR_CONNECTION


class RendezvousStateError(RendezvousError):
    """RDZV_ERR_STATE: corrupt or foreign data under the run's prefix."""

    status = Status.RDZV_ERR_STATE


class RendezvousGracefulExitError(RendezvousError):
    """RDZV_ERR_GRACEFUL_EXIT: the run closed while this node was left out, or this node was
    drained (a planned departure); not a failure."""

    status = Status.RDZV_ERR_GRACEFUL_EXIT


class RendezvousShutdownError(RendezvousError):
    """RDZV_ERR_SHUTDOWN: the handle (or store) was shut down or closed."""

    status = Status.RDZV_ERR_SHUTDOWN


class RendezvousCancelledError(RendezvousError):
    """RDZV_ERR_CANCELLED: ``cancel()`` woke a blocked ``next_rendezvous``."""

    status = Status.RDZV_ERR_CANCELLED


class RendezvousInternalError(RendezvousError):
    """RDZV_ERR_INTERNAL: a bug in rdzv."""

    status = Status.RDZV_ERR_INTERNAL


ERROR_CLASSES: dict[int, type[RendezvousError]] = {
    cls.status: cls
    for cls in (
        RendezvousInvalidArgumentError,
        RendezvousClosedError,
        RendezvousTimeoutError,
        RendezvousConnectionError,
        RendezvousStateError,
        RendezvousGracefulExitError,
        RendezvousShutdownError,
        RendezvousInternalError,
        RendezvousCancelledError,
    )
}


def error_for(status: int, message: str) -> RendezvousError:
    """The exception for a status code; unknown codes give a plain ``RendezvousError``."""
    cls = ERROR_CLASSES.get(status, RendezvousError)
    return cls(message, status)
