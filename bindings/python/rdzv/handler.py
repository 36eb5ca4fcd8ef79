"""``EtcdV3RendezvousHandler``: one node's handle on a rendezvous, shaped like torch's
``RendezvousHandler``, and ``RendezvousInfo``/``RendezvousStoreInfo``."""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any

from . import _ffi
from ._managed import Managed, Owned
from ._native import TOKEN, ask, call, cstr, lib, run_blocking, run_cancellable
from .errors import RendezvousError, RendezvousShutdownError
from .params import ParametersLike, native_params, store_timeout_of, store_timeout_of_url
from .store import Store

__all__ = ["EtcdV3RendezvousHandler", "RendezvousInfo", "RendezvousStoreInfo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RendezvousStoreInfo:
    """MASTER_ADDR/MASTER_PORT: rank 0's address and a TCP port that was free on it."""

    master_addr: str
    master_port: int


class RendezvousInfo:
    """A completed round, as torch's ``RendezvousInfo``, plus ``round`` (0, 1, ...)."""

    __slots__ = ("_store", "_rank", "_world_size", "_bootstrap_store_info", "_round")

    def __init__(
        self,
        store: Store,
        rank: int,
        world_size: int,
        bootstrap_store_info: RendezvousStoreInfo,
        round: int = 0,
    ):
        self._store = store
        self._rank = rank
        self._world_size = world_size
        self._bootstrap_store_info = bootstrap_store_info
        self._round = round

    @property
    def store(self) -> Store:
        """The round's store (close it when done; its calls fail once the handler is closed)."""
        return self._store

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def bootstrap_store_info(self) -> RendezvousStoreInfo:
        return self._bootstrap_store_info

    @property
    def round(self) -> int:
        return self._round

    def __repr__(self) -> str:
        return (
            f"RendezvousInfo(round={self._round}, rank={self._rank}, "
            f"world_size={self._world_size}, bootstrap_store_info={self._bootstrap_store_info})"
        )


class EtcdV3RendezvousHandler(Managed):
    """One node's handle on an etcd v3 rendezvous (torch's ``RendezvousHandler`` interface).

    Create it from ``RendezvousParameters`` (``EtcdV3RendezvousHandler(params)`` or
    ``from_parameters``) or from a URL (``from_url("etcd://host:2379/run?min_nodes=2")``).
    Creating it connects to etcd and registers the node (at most ``connect_timeout``).
    Thread-safe. Use it as a context manager, or call ``close()``.
    """

    def __init__(self, params: ParametersLike):
        ptr = native_params(params)
        self._setup(ptr, store_timeout_of(getattr(params, "config", None) or {}))

    @classmethod
    def from_parameters(cls, params: ParametersLike) -> EtcdV3RendezvousHandler:
        """A handler from ``RendezvousParameters`` (or torch's, which has the same shape)."""
        return cls(params)

    @classmethod
    def from_url(cls, url: str) -> EtcdV3RendezvousHandler:
        """A handler from ``etcd://HOST:PORT[,HOST:PORT...]/RUN_ID?name=value&...``
        (schemes ``etcd``/``etcd-v3``, or ``etcds``/``etcd+https`` for TLS)."""
        out = _ffi.ParamsP()
        call(lib().rdzv_params_from_url, cstr(url, "url"), ctypes.byref(out))
        self = cls.__new__(cls)
        self._setup(out, store_timeout_of_url(url))
        return self

    def _setup(self, params_ptr: Any, store_timeout: float) -> None:
        """Connects (consuming ``params_ptr``) in a way that Ctrl-C can interrupt."""
        L = lib()

        def connect() -> Any:
            try:
                out = _ffi.RdzvP()
                call(L.rdzv_new, params_ptr, ctypes.byref(out))
                return out
            finally:
                L.rdzv_params_free(params_ptr)

        ptr = run_blocking(connect, name="rdzv-connect", discard=L.rdzv_free)
        self._run_id = L.rdzv_run_id(ptr).decode()
        self._backend = L.rdzv_backend(ptr).decode()
        self._node_id = L.rdzv_node_id(ptr).decode()
        self._store_timeout = store_timeout
        self._res = Owned(ptr, L.rdzv_free, "rendezvous handler")

    # -- torch RendezvousHandler --------------------------------------------------------------

    def get_backend(self) -> str:
        """``"etcd-v3"``."""
        return self._backend

    @property
    def use_agent_store(self) -> bool:
        """False: workers bootstrap from MASTER_ADDR/MASTER_PORT, not from this store."""
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        """Joins the next round and blocks until this node is a member of a completed round
        (at most ``join_timeout``). Raises ``RendezvousClosedError``,
        ``RendezvousGracefulExitError`` (the run closed while this node was left out, or this
        node was drained), ``RendezvousTimeoutError``,
        ``RendezvousConnectionError``, ``RendezvousShutdownError`` (``shutdown``/``close`` from
        another thread) or ``RendezvousCancelledError`` (``cancel`` from another thread, made
        during the call or before it). Ctrl-C cancels the join (the handler stays usable) and
        raises ``KeyboardInterrupt``; so it does for every call below that asks etcd."""
        L = lib()

        def work(token: Any) -> tuple[Any, Any]:
            with self._res.use() as p:
                rnd, store = _ffi.rdzv_round_t(), _ffi.StoreP()
                call(L.rdzv_next_with_cancel, p, token, ctypes.byref(rnd), ctypes.byref(store))
                return rnd, store

        rnd, store_ptr = run_cancellable(
            work,
            name=f"rdzv-next:{self._node_id}",
            discard=lambda result: L.rdzv_store_free(result[1]),
        )
        store = Store._from_ptr(store_ptr, self._store_timeout)
        info = RendezvousStoreInfo(rnd.master_addr.decode("utf-8", "replace"), rnd.master_port)
        return RendezvousInfo(store, rnd.rank, rnd.world_size, info, rnd.round)

    def run_store(self) -> Store:
        """The run's store: a ``Store`` like a round's, with the same calls, that lives as long
        as the run instead of two rounds, for what a job keeps across rounds (a restart budget:
        ``add`` is atomic across nodes; why a node left). Keys under ``notes/`` are the run's
        notes, which ``Admin.status()`` and ``rdzv status`` show. Its values go with the run:
        deleted when the last node leaves or the run is purged, expired one ``lease_ttl`` after
        no node is left; once the run is gone its calls raise ``RendezvousStateError`` and
        write nothing. Needs no round. Close it when done (``with`` block); its calls raise
        ``RendezvousShutdownError`` once this handler is shut down or closed."""
        L = lib()

        def work(token: Any) -> Any:
            with self._res.use() as p:
                out = _ffi.StoreP()
                call(L.rdzv_run_store_with_cancel, p, token, ctypes.byref(out))
                return out

        ptr = run_cancellable(
            work, name=f"rdzv-run-store:{self._node_id}", discard=L.rdzv_store_free
        )
        return Store._from_ptr(ptr, self._store_timeout)

    def _ask(self, fn: Any, *args: Any, what: str) -> None:
        ask(self._res, fn, TOKEN, *args, name=f"rdzv-{what}:{self._node_id}")

    def is_closed(self) -> bool:
        """Whether any node closed the run."""
        out = ctypes.c_bool()
        self._ask(lib().rdzv_is_closed_with_cancel, ctypes.byref(out), what="is-closed")
        return bool(out.value)

    def set_closed(self) -> None:
        """Closes the run for every node: blocked and later ``next_rendezvous`` calls anywhere
        raise ``RendezvousClosedError``."""
        self._ask(lib().rdzv_set_closed_with_cancel, what="set-closed")

    def num_nodes_waiting(self, include_lost: bool = True) -> int:
        """Nodes waiting for a new round (``rdzv_num_waiting``), PLUS, unless ``include_lost``
        is False, members of this node's last round that died (``rdzv_num_lost``).

        torch's agent re-rendezvouses only when ``num_nodes_waiting()`` is non-zero; counting
        lost members here makes the survivors of a round that lost a node form a new round
        instead of waiting on a dead peer."""
        out = ctypes.c_uint32()
        self._ask(lib().rdzv_num_waiting_with_cancel, ctypes.byref(out), what="num-waiting")
        return out.value + (self.num_nodes_lost() if include_lost else 0)

    def num_nodes_lost(self) -> int:
        """Members of this node's last round whose lease expired (``rdzv_num_lost``)."""
        out = ctypes.c_uint32()
        self._ask(lib().rdzv_num_lost_with_cancel, ctypes.byref(out), what="num-lost")
        return out.value

    def get_run_id(self) -> str:
        return self._run_id

    @property
    def node_id(self) -> str:
        """This handle's node id (hex digits, unique per handle)."""
        return self._node_id

    def shutdown(self) -> bool:
        """Releases this node (revokes its lease, wakes a blocked ``next_rendezvous``) without
        closing the run for the others. Returns True on success or if already shut down,
        False (logged) on failure, like torch."""
        try:
            with self._res.use() as p:
                call(lib().rdzv_shutdown, p)
        except RendezvousShutdownError:
            return True  # already closed
        except RendezvousError as e:
            log.warning("rdzv: shutdown of run %r failed: %s", self._run_id, e)
            return False
        return True

    # -- extras -------------------------------------------------------------------------------

    def drain(self, reason: str = "") -> None:
        """Marks this node as leaving the run (a planned departure, e.g. on a preemption
        notice), as ``Admin.drain`` does for any node: the other members count it in
        ``num_nodes_lost()`` at once and re-form without it, and this node's
        ``next_rendezvous`` raises ``RendezvousGracefulExitError``. Does not close the run.
        ``reason`` is shown in the error and in logs."""
        why = cstr(reason, "reason")
        ask(self._res, lib().rdzv_drain_with_cancel, why, TOKEN, name=f"rdzv-drain:{self._node_id}")

    def is_draining(self) -> bool:
        """Whether this node was drained (by ``drain``, an operator or a scheduler): its agent
        should stop its workers and leave. One etcd read."""
        out = ctypes.c_bool()
        self._ask(lib().rdzv_is_draining_with_cancel, ctypes.byref(out), what="is-draining")
        return bool(out.value)

    def cancel(self) -> None:
        """Ends the ``next_rendezvous`` in progress in another thread, which raises
        ``RendezvousCancelledError``, or, if none is, the next one to start: a cancel made just
        as another thread calls ``next_rendezvous`` is not lost (the library keeps it,
        ``rdzv_cancel``). It is used up once a ``next_rendezvous`` has raised because of it;
        the handler stays usable. Never blocks."""
        with self._res.use() as p:
            call(lib().rdzv_cancel, p)

    def close(self) -> None:
        """``shutdown()`` and free the handle (once calls in other threads have returned).
        Idempotent. Rounds' stores stay usable."""
        super().close()

    def _before_close(self) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<{type(self).__name__} run_id={self._run_id!r} node_id={self._node_id}{state}>"
