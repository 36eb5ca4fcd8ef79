"""``Admin``: an operator's or scheduler's handle on a run, which never joins it: the run's
status, a watch of its changes, closing it, purging what it left in etcd, and draining nodes.

    import rdzv

    with rdzv.Admin("etcd://127.0.0.1:2379/job42") as admin:
        print(admin.status())
        for status in admin.watch():    # each change; Ctrl-C ends it
            print(status.sealed_round, [m.node_id for m in status.draining()])
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from . import _ffi
from ._managed import Managed, Owned
from ._native import (
    TOKEN,
    Timeout,
    ask,
    call,
    cstr,
    lib,
    run_blocking,
    run_cancellable,
    seconds,
    take_error,
)
from .errors import (
    RendezvousCancelledError,
    RendezvousError,
    RendezvousShutdownError,
    RendezvousTimeoutError,
)
from .params import ParametersLike, native_params

__all__ = ["Admin", "Joiner", "Member", "PurgeResult", "RunStatus", "connect"]

# A watch without a timeout waits this long (the library's cap, one year), in one call: a
# cancel reaches it through its cancel token whenever it is made.
_FOREVER_MS = 365 * 86400 * 1000


@dataclass(frozen=True)
class Member:
    """A member of the sealed round."""

    rank: int
    node_id: str
    #: The address it registered; "" when it is not alive.
    addr: str
    #: Its lease is live. A member that is not alive is lost: the survivors re-form without it.
    alive: bool
    #: It was drained (a planned departure): the survivors re-form without it at once.
    draining: bool


@dataclass(frozen=True)
class Joiner:
    """A node that joined the round open for joining."""

    node_id: str
    addr: str
    #: Its rank in the sealed round if it was a member (a re-rendezvous is under way); None
    #: for a newcomer waiting to be admitted.
    member_rank: int | None
    #: It was drained: it will not be sealed into a round.
    draining: bool


@dataclass(frozen=True)
class RunStatus:
    """A run as an operator sees it, read at one etcd revision (a consistent snapshot even
    while rounds form). A run that does not exist (never started, finished and cleaned up, or
    purged) has ``exists`` False and is otherwise empty; that is not an error."""

    run_id: str
    exists: bool
    #: The run was closed (the marker lasts ``retention``).
    closed: bool
    #: The round open for joining.
    open_round: int
    #: The last sealed round (the one the members are running); None when none is recorded.
    sealed_round: int | None
    #: Rank 0's bootstrap address and port (MASTER_ADDR/MASTER_PORT); "" and 0 without a
    #: sealed round.
    master_addr: str
    master_port: int
    #: The sealed round's members, in rank order.
    members: tuple[Member, ...]
    #: Nodes that joined the open round, in arrival order: newcomers waiting to be admitted,
    #: and members already re-joining during a re-rendezvous.
    waiting: tuple[Joiner, ...]
    #: Members of the sealed round that are not alive.
    num_lost: int
    #: Members of the sealed round that are alive but drained.
    num_draining: int
    #: Live nodes of the run: members, waiting nodes and spares alike.
    num_alive: int
    #: The etcd revision the status was read at; a watch gives increasing revisions.
    revision: int

    def lost(self) -> tuple[Member, ...]:
        """Members of the sealed round whose lease has expired."""
        return tuple(m for m in self.members if not m.alive)

    def draining(self) -> tuple[Member, ...]:
        """Members of the sealed round that are alive but drained (leaving)."""
        return tuple(m for m in self.members if m.alive and m.draining)


@dataclass(frozen=True)
class PurgeResult:
    """What ``Admin.purge`` did: ``deleted`` keys, or nothing because ``refused_alive`` nodes
    of the run are alive."""

    deleted: int
    refused_alive: int

    @property
    def refused(self) -> bool:
        return self.refused_alive > 0


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw else ""


def _same_run(a: RunStatus, b: RunStatus) -> bool:
    """Whether two statuses describe the same state (etcd's revision moves with every write,
    to any run)."""
    return dataclasses.replace(a, revision=0) == dataclasses.replace(b, revision=0)


def _status_from_c(s: _ffi.rdzv_run_status_t) -> RunStatus:
    # The arrays are read only up to their counts: an empty one may point anywhere.
    members = tuple(
        Member(m.rank, _text(m.node_id), _text(m.addr), bool(m.alive), bool(m.draining))
        for m in (s.members[i] for i in range(s.num_members))
    )
    waiting = tuple(
        Joiner(
            _text(j.node_id),
            _text(j.addr),
            None if j.member_rank < 0 else j.member_rank,
            bool(j.draining),
        )
        for j in (s.waiting[i] for i in range(s.num_waiting))
    )
    return RunStatus(
        run_id=_text(s.run_id),
        exists=bool(s.exists),
        closed=bool(s.closed),
        open_round=s.open_round,
        sealed_round=s.sealed_round if s.has_sealed else None,
        master_addr=_text(s.master_addr),
        master_port=s.master_port,
        members=members,
        waiting=waiting,
        num_lost=s.num_lost,
        num_draining=s.num_draining,
        num_alive=s.num_alive,
        revision=s.revision,
    )


def _read_status(fn: Any, *args: Any) -> RunStatus:
    """Calls ``fn(*args, rdzv_run_status_t **out, rdzv_error_t **error)``, copies the status
    and frees it."""
    out = _ffi.RunStatusP()
    err = _ffi.ErrorP()
    try:
        rc = fn(*args, ctypes.byref(out), ctypes.byref(err))
        if rc != _ffi.RDZV_OK:
            raise take_error(rc, err)
        return _status_from_c(out.contents)
    finally:
        # Whatever happens after the call (a KeyboardInterrupt included), the status is freed.
        if out:
            lib().rdzv_run_status_free(out)


class Admin(Managed):
    """An operator's or scheduler's handle on one run (named by the run id and key prefix of
    its URL or parameters). It never joins the run: it holds no lease, so it is never counted,
    waited for or sealed into a round.

    ``Admin("etcd://HOST:PORT/RUN_ID")`` or ``Admin(RendezvousParameters(...))`` connects to
    etcd (at most ``connect_timeout``; ``min_nodes``/``max_nodes`` do not matter here).
    Thread-safe, except that one watch runs at a time per handle. Use it as a context manager,
    or call ``close()``. Status and watch need read access to the run's prefix in etcd;
    ``close_run``, ``purge`` and ``drain`` need write access.
    """

    def __init__(self, target: str | ParametersLike):
        L = lib()
        if isinstance(target, str):
            params = _ffi.ParamsP()
            call(L.rdzv_params_from_url, cstr(target, "url"), ctypes.byref(params))
        else:
            params = native_params(target)

        def connect() -> Any:
            try:
                out = _ffi.AdminP()
                call(L.rdzv_admin_new, params, ctypes.byref(out))
                return out
            finally:
                L.rdzv_params_free(params)

        ptr = run_blocking(connect, name="rdzv-admin-connect", discard=L.rdzv_admin_free)
        self._res = Owned(ptr, L.rdzv_admin_free, "admin handle")
        self._lock = threading.Lock()
        # A change read by a watch call that Ctrl-C abandoned: the next watch_next returns it,
        # so the handle's watch still loses nothing.
        self._pending: RunStatus | None = None

    @classmethod
    def from_url(cls, url: str) -> Admin:
        """An admin handle from ``etcd://HOST:PORT[,HOST:PORT...]/RUN_ID[?options]``."""
        return cls(url)

    @classmethod
    def from_parameters(cls, params: ParametersLike) -> Admin:
        """An admin handle from ``RendezvousParameters`` (or torch's, of the same shape)."""
        return cls(params)

    # -- reading ------------------------------------------------------------------------------

    def status(self) -> RunStatus:
        """The run's status now (two or three etcd reads, at most ``connect_timeout``). Ctrl-C
        ends it, and any call below that asks etcd."""
        L = lib()

        def work(token: Any) -> RunStatus:
            with self._res.use() as p:
                return _read_status(L.rdzv_admin_status_with_cancel, p, token)

        return run_cancellable(work, name="rdzv-admin-status")

    def watch_next(self, timeout: Timeout | None = None) -> RunStatus | None:
        """The run's current status on the handle's first watch call; after that, waits for
        the next change an operator would see (a join, a seal, a loss, a drain, a close; not
        the workers' store traffic) and returns the new status. Successive calls return every
        change in order. Returns None when nothing changed within ``timeout`` (seconds or a
        ``timedelta``; None waits as long as it takes): nothing is lost, the next call goes on
        from there. Raises ``RendezvousCancelledError`` when ``cancel()`` is called from
        another thread (during the call, or before it: a cancel is never lost),
        ``RendezvousConnectionError`` when etcd stays unreachable for
        ``connect_timeout`` (call again to resume). Ctrl-C ends the wait with
        ``KeyboardInterrupt``; the handle stays usable."""
        ms = _FOREVER_MS if timeout is None else min(_FOREVER_MS, math.ceil(seconds(timeout) * 1000))
        L = lib()

        def work(token: Any) -> RunStatus | None:
            with self._lock:
                pending, self._pending = self._pending, None
            if pending is not None:
                return pending
            with self._res.use() as p:
                try:
                    return _read_status(L.rdzv_admin_watch_with_cancel, p, ms, token)
                except RendezvousTimeoutError:
                    return None  # nothing changed

        def keep(status: RunStatus | None) -> None:
            if status is not None:
                with self._lock:
                    self._pending = status

        # On the main thread the call runs in a helper thread while this one waits in short
        # slices, so Ctrl-C is seen at once; on Ctrl-C the watch is cancelled (not left
        # running, which would make the next watch call fail) and a change it read is kept.
        return run_cancellable(work, name="rdzv-admin-watch", discard=keep)

    def watch(self, idle_timeout: Timeout | None = None) -> Iterator[RunStatus]:
        """A generator of the run's statuses: the current one first, then one per change an
        operator would see, in order (see ``watch_next``). It ends when ``cancel()`` or
        ``close()`` is called after it was made (from another thread while it waits, or from
        its consumer); Ctrl-C raises ``KeyboardInterrupt`` out of it and leaves the handle
        usable. With ``idle_timeout``, it raises ``RendezvousTimeoutError`` when nothing
        changed for that long. An etcd that stays unreachable for ``connect_timeout`` ends it
        with ``RendezvousConnectionError``. One generator at a time per handle; a later one
        starts again from the current status."""
        if idle_timeout is not None:
            seconds(idle_timeout, "idle_timeout")  # checked now, not at the first next()
        if self._res.closed:
            raise RendezvousShutdownError("the admin handle is closed")

        def statuses() -> Iterator[RunStatus]:
            # The library's watch belongs to the handle and goes on where an earlier watch
            # stopped, so each generator starts from a status of its own and then passes on
            # only what the watch reports as newer and different: every change once, in
            # order (as the Go binding's Watch does). A cancel() made while it was between two
            # watch calls (handing a status to its consumer) ends the next one: the library
            # keeps it.
            last = self.status()
            yield last
            while True:
                try:
                    status = self.watch_next(idle_timeout)
                except RendezvousCancelledError:
                    return
                except RendezvousShutdownError:
                    if self._res.closed:
                        return  # close() from another thread
                    raise
                if status is None:
                    raise RendezvousTimeoutError(f"watch: no change within {idle_timeout} s")
                if status.revision <= last.revision or _same_run(status, last):
                    continue
                last = status
                yield status

        return statuses()

    def cancel(self) -> None:
        """Wakes a ``watch_next`` (or a ``watch`` generator) running in another thread:
        ``watch_next`` raises ``RendezvousCancelledError``, the generator ends. With no watch
        call in progress, the next one to start is cancelled: a cancel is never lost (the
        library keeps it, ``rdzv_admin_cancel``), and is used up by that call. Never blocks."""
        with self._res.use() as p:
            call(lib().rdzv_admin_cancel, p)

    # -- acting -------------------------------------------------------------------------------

    def close_run(self) -> None:
        """Closes the run for every node, as a node's ``set_closed()`` does: blocked and later
        ``next_rendezvous`` calls raise ``RendezvousClosedError``. (``close()`` frees this
        handle instead.)"""
        ask(self._res, lib().rdzv_admin_close_with_cancel, TOKEN, name="rdzv-admin-close")

    def purge(self, force: bool = False) -> PurgeResult:
        """Deletes every key of the run (rounds, stores, round counter, closed marker), so its
        id can be used again at once. While any node of the run is alive it deletes nothing
        and says how many are (``refused_alive``), unless ``force``, which leaves running nodes
        without their keys (they fail). The check and the delete are one transaction."""
        deleted, alive = ctypes.c_int64(), ctypes.c_uint32()
        ask(self._res, lib().rdzv_admin_purge_with_cancel, bool(force), TOKEN,
            ctypes.byref(deleted), ctypes.byref(alive), name="rdzv-admin-purge")
        return PurgeResult(deleted.value, alive.value)

    def drain(self, node_id: str, reason: str = "") -> None:
        """Marks node ``node_id`` (a handler's ``node_id``, or as the status names it) as
        leaving the run: a planned departure (preemption notice, maintenance, scale-down).
        The other members count it in ``num_nodes_lost()`` at once and re-form without it; its
        own ``next_rendezvous`` raises ``RendezvousGracefulExitError`` and its
        ``is_draining()`` turns True. Does not close the run. ``reason`` is shown to the node
        and in logs. Raises ``RendezvousInvalidArgumentError`` naming the node if it is not a
        live node of the run."""
        node, why = cstr(node_id, "node_id"), cstr(reason, "reason")
        ask(self._res, lib().rdzv_admin_drain_with_cancel, node, why, TOKEN,
            name="rdzv-admin-drain")

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Frees the handle, once calls in other threads have returned; a watch running in
        another thread is woken first (its generator ends). Idempotent; the run is not
        affected."""
        super().close()

    def _before_close(self) -> None:
        try:
            self.cancel()
        except RendezvousError:
            pass

    def __repr__(self) -> str:
        return f"<{type(self).__name__}{' closed' if self.closed else ''}>"


def connect(target: str | ParametersLike) -> Admin:
    """``Admin(target)``: an admin handle from a URL or ``RendezvousParameters``."""
    return Admin(target)
