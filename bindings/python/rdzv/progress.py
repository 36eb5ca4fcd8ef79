"""Progress: a worker's heartbeats and named sections, for the hang monitor of ``rdzv run``.

    import rdzv

    for step in range(start, steps):
        with rdzv.section("step"):
            loss = train_step(batch)
        rdzv.heartbeat(step=step)

Under ``rdzv run`` (``RDZV_PROGRESS_FILE`` in the environment) each call is a few stores to a
page the launcher reads, with no system call; outside it every call returns at once, but steps
and section names are still checked, so a bad one is found before a real run. The library
maps the page on the process's first progress call, and ``import rdzv`` makes that call only
under ``rdzv run``. Sections belong to the process, not to a thread.

The C functions are bound once: ``heartbeat()`` is one Python call and one ctypes call under
``rdzv run``, and one Python call outside it (the library's answer to "monitored?" never
changes in a process).

Under ``rdzv run``, ``import rdzv`` also registers ``faulthandler`` to write every thread's
stack to ``RDZV_STACKS_FILE`` on ``STACK_SIGNAL`` (``SIGRTMIN + 4``) and tells the launcher so
(``rdzv_set_stack_signal``): before it stops a hung worker, the launcher sends that signal and
keeps the stacks as evidence. It does so only when the signal's action is the default one (a
program that uses the signal keeps it), and gives up silently if anything fails.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import operator
import os
import signal
import sys
import threading
from types import TracebackType
from typing import IO, Any, Callable, Dict, Optional, Type

from . import _ffi
from ._native import cstr, take_error
from .errors import RendezvousInvalidArgumentError

__all__ = [
    "PROGRESS_FILE_ENV",
    "STACKS_FILE_ENV",
    "STACK_SIGNAL",
    "heartbeat",
    "is_monitored",
    "pause",
    "section",
    "section_begin",
    "section_end",
    "set_stack_signal",
]

#: The environment variable naming a worker's progress page; set by ``rdzv run``.
PROGRESS_FILE_ENV = "RDZV_PROGRESS_FILE"
#: The environment variable naming where a worker writes its stacks; set by ``rdzv run``.
STACKS_FILE_ENV = "RDZV_STACKS_FILE"
#: The signal ``import rdzv`` registers ``faulthandler`` on under ``rdzv run`` (0 where there
#: are no real-time signals).
STACK_SIGNAL: int = int(getattr(signal, "SIGRTMIN", -4)) + 4

_NAMES_CACHED = 256  # section names remembered: a program uses a few, over and over


def _bind() -> None:
    """Binds the C functions (loading the library) and picks the heartbeat: the C function
    under ``rdzv run``, a no-op outside it."""
    global _beat, _beat_step, _begin, _end, _monitored
    lib = _ffi.lib()
    _beat_step = lib.rdzv_heartbeat_step
    _begin = lib.rdzv_section_begin
    _end = lib.rdzv_section_end
    _monitored = bool(lib.rdzv_is_monitored())
    _beat = lib.rdzv_heartbeat if _monitored else _noop


def _noop() -> None:
    pass


def _first_beat() -> None:
    _bind()
    _beat()


def _unbound(*args: Any) -> int:
    raise RuntimeError("rdzv.progress: a C function was called before _bind()")


# Rebound by _bind on first use: `import rdzv` loads no library.
_beat: Callable[[], None] = _first_beat
_beat_step: Callable[..., int] = _unbound
_begin: Callable[..., int] = _unbound
_end: Callable[..., int] = _unbound
_monitored: Optional[bool] = None
# Section names the library accepted, encoded. Outside rdzv run a call with one of them has
# nothing left to do; under it, the C call is made with no error slot, which is cheaper.
_accepted: Dict[str, bytes] = {}
_ErrorP = _ffi.ErrorP
_byref = ctypes.byref
_MAX_STEP = 2**63


def _call(fn: Callable[..., int], arg: Any) -> None:
    """``fn(arg, &error)``, raising the library's error."""
    err = _ErrorP()
    status = fn(arg, _byref(err))
    if status:
        raise take_error(status, err)


def heartbeat(step: Optional[int] = None) -> None:
    """One heartbeat: the worker made progress (call it once per training step).

    ``step``, if given, is the step the worker reached: a global iteration that goes on from a
    checkpoint across restarts, which ``rdzv run`` compares across attempts to tell a job that
    makes no progress. Any integer type will do (``operator.index``). A step below 0 or from
    2**63 raises ``RendezvousInvalidArgumentError``, everywhere; ``heartbeat()`` without a step
    never raises.
    """
    if step is None:
        _beat()
    elif type(step) is int and 0 <= step < _MAX_STEP:
        if _monitored:
            if _beat_step(step, None):  # nothing was recorded: ask again for the error
                _call(_beat_step, step)
        elif _monitored is None:
            _bind()
            _call(_beat_step, step)
    else:
        heartbeat(_step_value(step))


def _step_value(step: Any) -> int:
    """A step that is not a plain int in range, as one, or the error it deserves (checked here:
    ctypes would wrap an int beyond 64 bits into range)."""
    try:
        value = operator.index(step)
    except TypeError:
        raise TypeError(f"step: expected an int, got {type(step).__name__}") from None
    if not 0 <= value < _MAX_STEP:
        raise RendezvousInvalidArgumentError(
            f"step: expected a non-negative step below 2**63, got {value}"
        )
    return value


def _accept(name: str, begin: bool) -> None:
    """The first call with ``name``: checked and made by the library, then remembered."""
    if _monitored is None:
        _bind()
    raw = cstr(name, "section name")
    _call(_begin if begin else _end, raw)
    if len(_accepted) < _NAMES_CACHED:
        _accepted[name] = raw


def section_begin(name: str) -> None:
    """Opens the section ``name`` (1 to 39 bytes of UTF-8): ``rdzv run --section-timeout
    name=SECONDS`` runs until ``section_end(name)``. Sections nest. A bad name raises
    ``RendezvousInvalidArgumentError``, everywhere."""
    raw = _accepted.get(name)
    if raw is None:
        _accept(name, begin=True)
    elif _monitored and _begin(raw, None):
        _call(_begin, raw)  # not expected for a name accepted before


def section_end(name: str) -> None:
    """Closes the innermost open section called ``name`` and records how long it took. A bad
    name raises ``RendezvousInvalidArgumentError``, and so, under ``rdzv run``, does a section
    that is not open."""
    raw = _accepted.get(name)
    if raw is None:
        _accept(name, begin=False)
    elif _monitored:
        # With the error slot: "not open" carries the library's message, and asking again
        # could close a section another thread has just opened.
        _call(_end, raw)


class section(contextlib.ContextDecorator):
    """The section ``name``, open inside a ``with`` block or for each call of a decorated
    function::

        with rdzv.section("checkpoint"):
            save(model)

        @rdzv.section("forward")
        def forward(batch): ...

    The section opens on entry (a bad name raises there) and closes on exit. When the block
    raises, a failure to close the section is dropped so that the block's exception is the one
    seen.
    """

    def __init__(self, name: str) -> None:
        cstr(name, "section name")  # a wrong type shows where the section is made
        self.name = name

    def __enter__(self) -> section:
        section_begin(self.name)
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if exc_type is None:
            section_end(self.name)
            return
        with contextlib.suppress(Exception):
            section_end(self.name)

    def __repr__(self) -> str:
        return f"rdzv.section({self.name!r})"


def is_monitored() -> bool:
    """Whether this process runs under the progress monitoring of ``rdzv run`` (its heartbeats
    and sections are seen). Loads the library on first use."""
    if _monitored is None:
        _bind()
    return bool(_monitored)


def pause() -> None:
    """Pauses the hang monitoring of this process until its next heartbeat or section: its
    silence is no longer taken for a hang. Call it before work without steps that may outlast
    the hang timeout (a final checkpoint, an evaluation, ``destroy_process_group``). The
    interpreter's exit pauses by itself (see ``_pause_at_exit``). Never raises; a no-op
    outside ``rdzv run``."""
    if _monitored is None:
        _bind()
    if _monitored:
        _ffi.lib().rdzv_progress_pause()


def set_stack_signal(signum: int) -> None:
    """Tells ``rdzv run`` which signal makes this process write its threads' stacks to the
    file named by ``RDZV_STACKS_FILE``; 0 takes it back. ``import rdzv`` does this for
    ``faulthandler`` already; call it only for a handler of your own, since the launcher sends
    the signal to a hung worker and its default action would end the process."""
    err = _ErrorP()
    status = _ffi.lib().rdzv_set_stack_signal(int(signum), _byref(err))
    if status:
        raise take_error(status, err)


# The file faulthandler writes to: kept open for the life of the process (faulthandler holds
# its file descriptor, not the object).
_stacks_file: Optional[IO[str]] = None


def _default_action(signum: int) -> bool:
    """Whether ``signum``'s action is the default one. Python's view (``signal.getsignal``)
    misses handlers installed by native code or faulthandler, so the kernel is asked too."""
    if signal.getsignal(signum) != signal.SIG_DFL:
        return False
    if not sys.platform.startswith("linux"):
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    # glibc's struct sigaction starts with the handler; the buffer is larger than the struct.
    old = (ctypes.c_void_p * 32)()
    if libc.sigaction(ctypes.c_int(signum), None, ctypes.byref(old)) != 0:
        return False
    return not old[0]  # SIG_DFL is 0


def _install_stack_dumps() -> None:
    """Under ``rdzv run`` with a stacks file: faulthandler on STACK_SIGNAL, said to the
    launcher. Never raises: a worker is never failed for its evidence."""
    global _stacks_file
    path = os.environ.get(STACKS_FILE_ENV)
    if not path or not os.environ.get(PROGRESS_FILE_ENV) or _stacks_file is not None:
        return
    try:
        if STACK_SIGNAL <= 0 or not is_monitored() or not _default_action(STACK_SIGNAL):
            return
        stacks = open(path, "a")
        try:
            faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)
            set_stack_signal(STACK_SIGNAL)
        except Exception:
            with contextlib.suppress(Exception):
                faulthandler.unregister(STACK_SIGNAL)
            stacks.close()
            raise
        _stacks_file = stacks
    except Exception:
        return


def _pause_at_exit(owner: int = os.getpid()) -> None:
    """The interpreter is exiting: the end of the program is not a hang. Registered with
    threading's exit hooks, which run before the interpreter waits for its threads and before
    every ``atexit`` handler; a forked child that exits leaves its parent watched."""
    if os.getpid() == owner and _monitored:
        with contextlib.suppress(Exception):
            _ffi.lib().rdzv_progress_pause()


def _register_exit_pause() -> None:
    if not os.environ.get(PROGRESS_FILE_ENV):
        return
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(_pause_at_exit)
            return
    except RuntimeError:  # already shutting down
        return
    atexit.register(_pause_at_exit)


_install_stack_dumps()
_register_exit_pause()
