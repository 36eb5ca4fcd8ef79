"""``RendezvousParameters``, as torch's ``torch.distributed.elastic.rendezvous.RendezvousParameters``,
and their translation into the library's ``rdzv_params_t``."""

from __future__ import annotations

import ctypes
import datetime
import decimal
import math
import os
from typing import Any, Iterable, Mapping, Optional, Protocol
from urllib.parse import parse_qs, urlsplit

from . import _ffi
from ._native import call, cstr, lib
from .errors import RendezvousInvalidArgumentError

__all__ = ["DEFAULT_STORE_TIMEOUT", "ParametersLike", "RendezvousParameters"]

#: The store's default timeout in seconds when ``store_timeout`` is not given (see rdzv.h).
DEFAULT_STORE_TIMEOUT = 300.0


class ParametersLike(Protocol):
    """What a handler or an admin handle is made from: ``RendezvousParameters``, torch's
    ``RendezvousParameters``, or any object with these attributes."""

    backend: str
    endpoint: str
    run_id: str
    min_nodes: int
    max_nodes: int
    local_addr: Optional[str]
    config: dict[str, Any]


class RendezvousParameters:
    """What to join and how, as torch's ``RendezvousParameters``.

    ``kwargs`` are the library's options (see ``rdzv_params_set`` in rdzv.h, e.g.
    ``join_timeout``, ``last_call_timeout``, ``lease_ttl``, ``key_prefix``, ``protocol``,
    ``cacert``...). Values may be strings, ints, floats or ``datetime.timedelta`` (seconds);
    ``None`` means "not set". They are checked when a handler is created, or by ``validate()``;
    an unknown name or a bad value raises ``RendezvousInvalidArgumentError`` naming it.
    """

    def __init__(
        self,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        **kwargs: Any,
    ):
        if not backend:
            raise RendezvousInvalidArgumentError(
                "backend: the rendezvous backend name must be a non-empty string"
            )
        for name, n in (("min_nodes", min_nodes), ("max_nodes", max_nodes)):
            if isinstance(n, bool) or not isinstance(n, int):
                raise RendezvousInvalidArgumentError(f"{name}: expected an int, got {n!r}")
        if min_nodes < 1:
            raise RendezvousInvalidArgumentError(
                f"min_nodes: the minimum number of rendezvous nodes ({min_nodes}) must be "
                "greater than zero"
            )
        if max_nodes < min_nodes:
            raise RendezvousInvalidArgumentError(
                f"max_nodes: the maximum number of rendezvous nodes ({max_nodes}) must be "
                f"greater than or equal to the minimum number of rendezvous nodes ({min_nodes})"
            )
        self.backend = backend
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.local_addr = local_addr
        self.config: dict[str, Any] = kwargs

    def get(self, key: str, default: Any = None) -> Any:
        """The value for ``key`` if present, else ``default``."""
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        """The value for ``key`` as a bool (torch's rules: 1/0, true/false, t/f, yes/no, y/n)."""
        value = self.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if value == 1:
                return True
            if value == 0:
                return False
        elif isinstance(value, str):
            if value.lower() in ("1", "true", "t", "yes", "y"):
                return True
            if value.lower() in ("0", "false", "f", "no", "n"):
                return False
        raise ValueError(
            f"The rendezvous configuration option '{key}' does not represent a valid boolean value."
        )

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        """The value for ``key`` as an int."""
        value = self.get(key, default)
        if value is None:
            return value
        try:
            return int(value)
        except ValueError as e:
            raise ValueError(
                f"The rendezvous configuration option '{key}' does not represent a valid integer "
                "value."
            ) from e

    def validate(self) -> None:
        """Checks everything, options included, without connecting; raises
        ``RendezvousInvalidArgumentError`` naming the first bad field or option."""
        lib().rdzv_params_free(native_params(self))

    def __repr__(self) -> str:
        return (
            f"RendezvousParameters(backend={self.backend!r}, endpoint={self.endpoint!r}, "
            f"run_id={self.run_id!r}, min_nodes={self.min_nodes}, max_nodes={self.max_nodes}, "
            f"local_addr={self.local_addr!r}, **{sorted(self.config)!r})"
        )


def option_value(name: str, value: Any) -> str:
    """An option value as the plain string ``rdzv_params_set`` parses."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, bool):
        raise RendezvousInvalidArgumentError(
            f"option {name}: no rdzv option is a boolean; got {value!r}"
        )
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RendezvousInvalidArgumentError(f"option {name}: expected a finite number, got {value!r}")
        if value.is_integer():
            return str(int(value))
        # Plain decimal notation: the library does not read exponents such as 1e-05.
        return format(decimal.Decimal(repr(value)), "f")
    raise RendezvousInvalidArgumentError(
        f"option {name}: expected a string or a number, got {type(value).__name__}"
    )


def _u32(name: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2**32:
        raise RendezvousInvalidArgumentError(f"{name}: expected a whole number below 2^32, got {n!r}")
    return n


def native_params(params: ParametersLike, ignore: Iterable[str] = ()) -> Any:
    """A new ``rdzv_params_t *`` from any object shaped like torch's ``RendezvousParameters``
    (``backend``, ``endpoint``, ``run_id``, ``min_nodes``, ``max_nodes``, ``local_addr``,
    ``config``). Options named in ``ignore`` and options whose value is None are skipped. The
    caller frees the result with ``rdzv_params_free``."""
    L = lib()
    out = _ffi.ParamsP()
    call(
        L.rdzv_params_new,
        cstr(params.backend, "backend"),
        cstr(params.endpoint, "endpoint"),
        cstr(params.run_id, "run_id"),
        _u32("min_nodes", params.min_nodes),
        _u32("max_nodes", params.max_nodes),
        ctypes.byref(out),
    )
    try:
        options: list[tuple[str, Any]] = []
        local_addr = getattr(params, "local_addr", None)
        if local_addr is not None:
            options.append(("local_addr", local_addr))
        config: Mapping[str, Any] = getattr(params, "config", None) or {}
        skip = set(ignore)
        options.extend((k, v) for k, v in config.items() if k not in skip)
        for name, value in options:
            if value is None:
                continue
            call(
                L.rdzv_params_set,
                out,
                cstr(name, "option name"),
                cstr(option_value(name, value), f"option {name}"),
            )
    except BaseException:
        L.rdzv_params_free(out)
        raise
    return out


def store_timeout_of(config: Mapping[str, Any]) -> float:
    """The store's default timeout in seconds implied by the options (the C API has no
    getter for it)."""
    value = config.get("store_timeout")
    if value is None:
        return DEFAULT_STORE_TIMEOUT
    try:
        return float(option_value("store_timeout", value))
    except (ValueError, RendezvousInvalidArgumentError):
        return DEFAULT_STORE_TIMEOUT


def store_timeout_of_url(url: str) -> float:
    try:
        query = parse_qs(urlsplit(url).query)
    except ValueError:
        return DEFAULT_STORE_TIMEOUT
    values = query.get("store_timeout")
    return store_timeout_of({"store_timeout": values[-1]} if values else {})
