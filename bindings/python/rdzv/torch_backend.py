"""torchrun backend ``etcd-v3``: rdzv as a ``torch.distributed.elastic`` rendezvous handler.

Installed with this package, the entry point ``[project.entry-points."torchrun.handlers"]
etcd-v3 = "rdzv.torch_backend:create_handler"`` lets you run::

    torchrun --nnodes 1:4 --rdzv-backend etcd-v3 --rdzv-endpoint etcd-host:2379 \\
             --rdzv-id job42 --rdzv-conf last_call_timeout=10 train.py

torch's plugin loader calls the entry point with NO argument and registers what it returns as
the handler creator, so ``create_handler()`` returns ``create_handler`` itself, and
``create_handler(params)`` creates a handler. Without the entry point, call ``register()``.

Differences from the torch-free ``EtcdV3RendezvousHandler``, to behave like torch's handlers:

* ``next_rendezvous`` returns torch's ``RendezvousInfo`` whose store is a
  ``torch.distributed.Store`` (``TorchStore``) forwarding to the round's store;
* errors are torch's exception classes (and also rdzv's);
* a planned departure (this node drained, or the run closed while it waited outside the
  round) ends ``next_rendezvous`` with ``GracefulExit``, a ``SystemExit`` of status 0, not
  ``RendezvousGracefulExitError``, which torch's agent turns into an ``AttributeError``;
* ``shutdown()`` closes the run only when this node's job failed. torch's launcher calls it
  in the ``finally`` of ``launch_agent`` on every exit except by a signal, while the
  ``ChildFailedError`` it raises for workers that failed with no restart left is in flight.
  The other nodes' agents, which see this node lost, then find the run closed in
  ``next_rendezvous`` and exit non-zero at once, instead of waiting ``join_timeout`` for it.
  Otherwise it only releases the node: a node that succeeds, is drained, is interrupted before
  its workers start or fails to join must not end the job for the others (torch's c10d and
  etcd handlers close their rendezvous on every shutdown), nor must a failure while a member
  of the round is lost, which that departure explains;
* ``num_nodes_waiting()`` counts waiting and lost nodes, so the agent re-rendezvouses when a
  member dies;
* ``--rdzv-endpoint`` may omit the port (2379) and may start with ``http://``/``https://``;
* torch-specific ``--rdzv-conf`` keys that do not apply (``is_host``, ``read_timeout``...) are
  ignored; torchrun's ``timeout`` is rdzv's ``join_timeout``, and an explicit ``join_timeout``
  wins over it (torchrun adds ``timeout=900`` to every rendezvous config that names none).

torch is optional: without it ``create_handler`` returns the same handler without the torch
base classes, and ``next_rendezvous`` returns ``rdzv.RendezvousInfo``.
"""

from __future__ import annotations

import datetime
import functools
import logging
import sys
import types
from typing import Any, Callable, overload

from . import errors
from .handler import EtcdV3RendezvousHandler
from .params import ParametersLike
from .store import Store

log = logging.getLogger(__name__)

try:
    import torch.distributed as _dist
    from torch.distributed.elastic.rendezvous import api as _api
except ImportError:  # torch is optional
    # (the ignore is used only where torch, hence its types, is installed)
    _dist = None  # type: ignore[assignment, unused-ignore]
    _api = None  # type: ignore[assignment, unused-ignore]

TORCH_AVAILABLE = _api is not None

# What torch's launcher raises when this node's workers failed with no restart left.
_ChildFailedError: type | None = None
if TORCH_AVAILABLE:
    try:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        _ChildFailedError = ChildFailedError
    except ImportError:  # not where torch 2.15 has it: shutdown() never closes the run
        pass

__all__ = [
    "TORCH_AVAILABLE",
    "GracefulExit",
    "TorchEtcdV3RendezvousHandler",
    "TorchStore",
    "create_handler",
    "register",
]

BACKEND = "etcd-v3"
DEFAULT_ETCD_PORT = 2379

#: rdzv's spellings of ``join_timeout`` (the library also reads torch's ``timeout``). torchrun
#: puts ``timeout`` (900 s unless given) into every rendezvous config, after the user's
#: ``--rdzv-conf`` options, so it is dropped when one of these is given.
JOIN_TIMEOUT_NAMES = frozenset({"join_timeout"})

#: torch rendezvous options that mean nothing to rdzv; dropped instead of rejected.
IGNORED_TORCH_OPTIONS = frozenset(
    {
        "rank",  # static backend
        "is_host",  # c10d backend: whether to host the TCPStore
        "read_timeout",  # c10d backend: TCPStore reads
        "use_libuv",
        "heartbeat",
        "keep_alive_interval",
        "keep_alive_max_attempt",
    }
)

# -- torch-flavoured exceptions -------------------------------------------------------------

_TORCH_PEERS = {
    errors.RendezvousClosedError: "RendezvousClosedError",
    errors.RendezvousTimeoutError: "RendezvousTimeoutError",
    errors.RendezvousConnectionError: "RendezvousConnectionError",
    errors.RendezvousStateError: "RendezvousStateError",
    errors.RendezvousGracefulExitError: "RendezvousGracefulExitError",
}


#: rdzv's error classes: the base and one per status.
_RDZV_ERRORS: tuple[type[errors.RendezvousError], ...] = (
    errors.RendezvousError,
    *errors.ERROR_CLASSES.values(),
)


def _handler_error_classes() -> dict[type, type]:
    """For each rdzv error class, a class deriving from it and from torch's counterpart (or
    torch's ``RendezvousError``), so ``except`` clauses of either library match."""
    if not TORCH_AVAILABLE:
        return {}
    table: dict[type, type] = {}
    for cls in _RDZV_ERRORS:
        peer = getattr(_api, _TORCH_PEERS.get(cls, "RendezvousError"), None) or _api.RendezvousError
        table[cls] = type(cls.__name__, (cls, peer), {"__module__": __name__})
    return table


def _store_error_classes() -> dict[type, type]:
    """Store errors also derive from ``torch.distributed.DistStoreError`` (RuntimeError on
    torch versions without it), which is what c10d stores raise."""
    if not TORCH_AVAILABLE:
        return {}
    base = getattr(_dist, "DistStoreError", None) or RuntimeError
    return {
        cls: type(f"Store{cls.__name__}", (cls, base), {"__module__": __name__})
        for cls in _RDZV_ERRORS
    }


_HANDLER_ERRORS = _handler_error_classes()
_STORE_ERRORS = _store_error_classes()


def _translated(exc: errors.RendezvousError, table: dict[type, type]) -> BaseException:
    cls = table.get(type(exc))
    if cls is None:
        return exc
    new = cls(str(exc), exc.status)
    new.__traceback__ = exc.__traceback__
    return new


def _translating(table: dict[type, type]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except errors.RendezvousError as e:
                new = _translated(e, table)
                if new is e:
                    raise
                raise new from None

        return wrapper

    return decorate


_handler_errors = _translating(_HANDLER_ERRORS)
_store_errors = _translating(_STORE_ERRORS)

# -- parameters -----------------------------------------------------------------------------


def _normalize_endpoint(endpoint: str) -> tuple[str, str | None]:
    """``HOST[:PORT][,...]`` with the default port added and any ``http(s)://`` scheme
    removed; returns the endpoints and the protocol the scheme implied (or None)."""
    protocol = None
    out = []
    for part in (p.strip() for p in (endpoint or "").split(",")):
        if not part:
            continue
        for scheme in ("http://", "https://"):
            if part.lower().startswith(scheme):
                protocol = scheme[:-3]
                part = part[len(scheme):]
        part = part.rstrip("/")
        if part.endswith("]") or ":" not in part:  # no port (IPv6 literals are bracketed)
            part = f"{part}:{DEFAULT_ETCD_PORT}"
        out.append(part)
    return ",".join(out), protocol


def _rdzv_params(params: ParametersLike) -> Any:
    """rdzv parameters from torch's ``RendezvousParameters`` (or anything of that shape)."""
    endpoint, protocol = _normalize_endpoint(getattr(params, "endpoint", "") or "")
    given = getattr(params, "config", None) or {}
    join_timeout_given = any(given.get(name) is not None for name in JOIN_TIMEOUT_NAMES)
    config = {}
    for name, value in given.items():
        if name in IGNORED_TORCH_OPTIONS:
            log.debug("rdzv: ignoring torch rendezvous option %s=%r", name, value)
            continue
        if name == "timeout" and join_timeout_given:
            log.debug("rdzv: join_timeout is given; ignoring torchrun's timeout=%r", value)
            continue
        config[name] = value
    if protocol is not None:
        config.setdefault("protocol", protocol)
    return types.SimpleNamespace(
        backend=BACKEND,
        endpoint=endpoint,
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        local_addr=getattr(params, "local_addr", None),
        config=config,
    )


# -- store ----------------------------------------------------------------------------------


def _store_timeout(timeout: Any) -> Any:
    """c10d's timeout 0 (``kNoTimeout``) means "wait forever": the library caps it at a year."""
    if isinstance(timeout, datetime.timedelta) and timeout == datetime.timedelta(0):
        return float("inf")
    return timeout


if TORCH_AVAILABLE:
    _StoreBase: Any = _dist.Store
else:

    class _StoreBase:  # type: ignore[no-redef]
        pass


class TorchStore(_StoreBase):
    """A ``torch.distributed.Store`` (a Python subclass, which c10d supports) forwarding to a
    round's ``rdzv.Store``.

    c10d's C++ side calls a Python store through a trampoline that looks up ``set``, ``get``,
    ``add``, ``compare_set``, ``check``, ``wait``, ``multi_get``, ``multi_set``, ``append``,
    ``has_extended_api``, ``clone`` and, by their C++ names, ``deleteKey`` and ``getNumKeys``;
    ``append`` falls back to a ``compare_set`` loop. The timeout is not forwarded: C++ code,
    ``PrefixStore.set_timeout`` among it, sets the c10d base's own, so that base timeout is the
    one ``get``, ``wait`` and ``multi_get`` use when no timeout is given."""

    def __init__(self, store: Store):
        super().__init__()
        self._rdzv_store = store
        self._set_base_timeout(store.timeout)  # the run's store_timeout, for C++ callers too

    @property
    def rdzv_store(self) -> Store:
        return self._rdzv_store

    def _set_base_timeout(self, timeout: Any) -> None:
        base_set_timeout = getattr(_StoreBase, "set_timeout", None)
        if base_set_timeout is not None and isinstance(timeout, datetime.timedelta):
            base_set_timeout(self, timeout)

    def _default_timeout(self) -> Any:
        """The c10d base's timeout (0 meaning none), or None (the rdzv store's) without one."""
        base = getattr(_StoreBase, "timeout", None)
        if not isinstance(base, property):
            return None
        return _store_timeout(base.__get__(self))

    @_store_errors
    def set(self, key: str, value: Any) -> None:
        self._rdzv_store.set(key, value)

    @_store_errors
    def get(self, key: str) -> bytes:
        return self._rdzv_store.get(key, self._default_timeout())

    @_store_errors
    def add(self, key: str, value: int) -> int:
        return self._rdzv_store.add(key, value)

    @_store_errors
    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        return self._rdzv_store.compare_set(key, expected_value, desired_value)

    @_store_errors
    def check(self, keys: list[str]) -> bool:
        return self._rdzv_store.check(keys)

    @_store_errors
    def wait(self, keys: list[str], timeout: Any = None) -> None:
        if timeout is None:
            timeout = self._default_timeout()
        self._rdzv_store.wait(keys, _store_timeout(timeout))

    @_store_errors
    def delete_key(self, key: str) -> bool:
        return self._rdzv_store.delete_key(key)

    deleteKey = delete_key

    @_store_errors
    def num_keys(self) -> int:
        return self._rdzv_store.num_keys()

    getNumKeys = num_keys

    @_store_errors
    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._rdzv_store.multi_get(keys, self._default_timeout())

    @_store_errors
    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._rdzv_store.multi_set(keys, values)

    @_store_errors
    def set_timeout(self, timeout: Any) -> None:
        self._rdzv_store.set_timeout(_store_timeout(timeout))  # for users of rdzv_store
        self._set_base_timeout(timeout)

    @property
    def timeout(self) -> datetime.timedelta:
        base = getattr(_StoreBase, "timeout", None)
        if isinstance(base, property):
            return base.__get__(self)
        return self._rdzv_store.timeout

    def clone(self) -> "TorchStore":
        return self  # the rdzv store is thread-safe

    def close(self) -> None:
        self._rdzv_store.close()


# -- handler --------------------------------------------------------------------------------

_torch_bases: tuple[type, ...] = (_api.RendezvousHandler,) if TORCH_AVAILABLE else ()


class GracefulExit(SystemExit):
    """What the torch handler's ``next_rendezvous`` raises, under torch, when this node leaves
    the run as planned (it was drained, or the run closed while it waited outside the round):
    a ``SystemExit`` with status 0. ``error`` is rdzv's ``RendezvousGracefulExitError``.

    Why not torch's ``RendezvousGracefulExitError``: torch's agent (``SimpleElasticAgent.run``,
    torch 2.4 to at least 2.15) catches it and returns no result, and its launcher then fails
    on that ``None`` with an ``AttributeError``, so the node that left as planned would exit 1
    with a traceback. A ``SystemExit`` passes torch's ``except Exception`` clauses: its
    ``finally`` blocks still stop the workers and shut the handler down, its ``@record``
    entry point returns on status 0, and torchrun exits 0."""

    def __init__(self, error: errors.RendezvousGracefulExitError):
        super().__init__(0)
        self.error = error


class TorchEtcdV3RendezvousHandler(EtcdV3RendezvousHandler, *_torch_bases):  # type: ignore[misc]
    """The handler torchrun gets for ``--rdzv-backend etcd-v3`` (see the module doc)."""

    @_handler_errors
    def __init__(self, params: ParametersLike):
        super().__init__(_rdzv_params(params))

    @_handler_errors
    def next_rendezvous(self) -> Any:
        try:
            info = super().next_rendezvous()
        except errors.RendezvousGracefulExitError as e:
            if not TORCH_AVAILABLE:
                raise
            log.warning("%s; this torchrun exits 0", e)
            raise GracefulExit(e) from e
        except errors.RendezvousClosedError:
            log.warning("rdzv: run %r was closed by another node (its job failed) or by an "
                        "operator; this node stops", self.get_run_id())
            raise
        self.last_round = info.round
        if not TORCH_AVAILABLE:
            return info
        store = TorchStore(info.store)
        if hasattr(_api, "RendezvousInfo"):
            boot = info.bootstrap_store_info
            store_info = _api.RendezvousStoreInfo(boot.master_addr, boot.master_port)
            return _api.RendezvousInfo(store, info.rank, info.world_size, store_info)
        return store, info.rank, info.world_size  # torch < 2.4

    is_closed = _handler_errors(EtcdV3RendezvousHandler.is_closed)
    set_closed = _handler_errors(EtcdV3RendezvousHandler.set_closed)
    num_nodes_waiting = _handler_errors(EtcdV3RendezvousHandler.num_nodes_waiting)
    num_nodes_lost = _handler_errors(EtcdV3RendezvousHandler.num_nodes_lost)
    cancel = _handler_errors(EtcdV3RendezvousHandler.cancel)
    drain = _handler_errors(EtcdV3RendezvousHandler.drain)
    is_draining = _handler_errors(EtcdV3RendezvousHandler.is_draining)

    def shutdown(self) -> bool:
        """Releases this node, first closing the run if this node's job failed (see the module
        doc): called by torch's launcher while the ``ChildFailedError`` it raises for workers
        that failed with no restart left is in flight. Any other shutdown (success, a drain,
        Ctrl-C, a failed join, a direct call) only releases the node."""
        if _job_failed_here():
            self._close_for_failure()
        return super().shutdown()

    def _close_for_failure(self) -> None:
        """Closes the run, unless a member of this node's last round is lost (drained or dead):
        then the failure is that departure's doing, and the other nodes re-form without both."""
        run = self.get_run_id()
        try:
            lost = EtcdV3RendezvousHandler.num_nodes_lost(self)
            if lost:
                log.warning(
                    "rdzv: this node's workers failed with no restart left while %d member(s) of "
                    "its round were lost: leaving run %r open for the others", lost, run
                )
                return
            log.warning(
                "rdzv: this node's workers failed with no restart left: closing run %r, so the "
                "other nodes stop too", run
            )
            EtcdV3RendezvousHandler.set_closed(self)
        except errors.RendezvousError as e:
            log.warning("rdzv: could not close run %r after the failure: %s", run, e)


def _job_failed_here() -> bool:
    """Whether torch's launcher is ending with this node's job failed: ``launch_agent`` calls
    ``shutdown()`` in its ``finally`` while the ``ChildFailedError`` it raised for the failed
    workers propagates, which makes it the exception being handled there (torch 2.15; on a
    signal it does not call ``shutdown()`` at all)."""
    if _ChildFailedError is None:
        return False
    return isinstance(sys.exc_info()[1], _ChildFailedError)


_Creator = Callable[[ParametersLike], TorchEtcdV3RendezvousHandler]


@overload
def create_handler(params: None = None) -> _Creator: ...


@overload
def create_handler(params: ParametersLike) -> TorchEtcdV3RendezvousHandler: ...


def create_handler(
    params: ParametersLike | None = None,
) -> TorchEtcdV3RendezvousHandler | _Creator:
    """torchrun's creator for ``etcd-v3``: ``create_handler(params)`` returns a
    ``TorchEtcdV3RendezvousHandler`` for torch's ``RendezvousParameters``.
    ``create_handler()`` (how torch's entry-point loader calls it) returns the creator."""
    if params is None:
        return create_handler
    return TorchEtcdV3RendezvousHandler(params)


def register() -> None:
    """Registers ``etcd-v3`` in torch's handler registry (not needed when the package is
    installed, since the entry point does it)."""
    if not TORCH_AVAILABLE:
        raise ImportError("rdzv.torch_backend.register() needs torch")
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, create_handler)
