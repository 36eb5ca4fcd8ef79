"""In-process restart: a training function that runs again in the same process with each new
round, instead of the worker being stopped and started again (``rdzv run
--in-process-restart``).

    import torch.distributed as dist
    import rdzv.inprocess

    def train():
        dist.init_process_group("gloo")  # reads RANK, WORLD_SIZE, MASTER_ADDR... as usual
        model = DDP(build_model())         # wrapped again on each round's process group
        for step in range(load_checkpoint(), steps):
            rdzv.inprocess.check()         # leaves at once when a new round is forming
            train_step(model)
            rdzv.heartbeat(step=step)

    rdzv.inprocess.run(train)

When a round ends (a node lost or admitted, a worker of another node failed or hung), the
launcher asks each healthy worker to leave: ``check()`` raises ``Restart``, and so does a
collective that fails because its peer is gone. ``run`` catches it, tears down the default
process group (``destroy_process_group``), tells the launcher, waits for the next round and
calls the function again with that round's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT`` and ``TORCHELASTIC_RESTART_COUNT`` in ``os.environ``. What
the function built (a model on the GPU, data loaders, compiled graphs) stays in the process
for the next call to reuse.

A collective blocked on a peer is broken the moment the leave is asked, from a thread of the
wrapper's own: NCCL's communicators are aborted, and the TCP connections the function opened
(gloo's, which has no abort; a left gloo group also keeps them open until the process exits,
and its peers would block on them) are shut down, so that the collective fails at once here
and at every peer connected to it. Set ``RDZV_INPROCESS_SHUTDOWN_SOCKETS=0`` to keep them
(a connection the function opens to a service of its own is shut down too). A worker that
still does not leave within the launcher's bound (``--in-process-timeout``; 0.5 s after a hang)
is stopped alone and started again; the others stay.

With torch imported, the wrapper of global rank 0 serves each round's TCPStore at
``MASTER_ADDR:MASTER_PORT`` before calling the function, and sets
``TORCHELASTIC_USE_AGENT_STORE=True`` so that ``init_process_group`` on every rank is its
client, as when torchrun's agent serves it; the other ranks call the function once it accepts.
Otherwise a rank handed the round before rank 0 would connect first and wait out TCPStore's
retry backoff (0.25 to 0.75 s). ``RDZV_INPROCESS_HOST_STORE=0`` leaves it to rank 0's
``init_process_group``.

An exception that is not ``Restart`` is the function's own failure, unless the launcher asks
the worker to leave within ``RDZV_INPROCESS_GRACE`` seconds (3 by default) after it: a
collective usually fails a moment before the launcher learns that a peer is gone. Otherwise
it propagates and the process fails, as it would without the wrapper.

Outside ``rdzv run --in-process-restart`` (no ``RDZV_INPROCESS_FILE``), ``run(fn)`` calls
``fn`` once and ``check()`` does nothing.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional, TypeVar

__all__ = ["Restart", "check", "enabled", "restarts", "run"]

#: The variable that names this worker's control file (set by ``rdzv run``).
CONTROL_FILE_ENV = "RDZV_INPROCESS_FILE"
#: Set to 1 in a spare's environment (``--in-process-spare``): it has no place yet.
SPARE_ENV = "RDZV_INPROCESS_SPARE"
#: Set to 0 to have torch's ``init_process_group`` serve the round's store on rank 0 itself.
HOST_STORE_ENV = "RDZV_INPROCESS_HOST_STORE"
#: How long a rank waits for rank 0 to serve the round's store before calling the function.
STORE_WAIT = 60.0

T = TypeVar("T")


class Restart(Exception):
    """The launcher asked this worker to leave its training function: a new round is forming."""


class _Control:
    """The control file as last read: its generation, state and environment."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen_version: Optional[tuple] = None
        self.generation = -1
        self.state = ""
        self.env: Dict[str, str] = {}

    def refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            return
        # Every write is a new file renamed into place: its inode changes even when two
        # writes fall in one tick of the file system's clock.
        version = (st.st_ino, st.st_mtime_ns)
        if version == self.seen_version:
            return
        try:
            with open(self.path) as f:
                control = json.load(f)
        except (OSError, ValueError):
            return  # renamed into place, so never half written: try again at the next look
        self.seen_version = version
        self.generation = int(control.get("generation", -1))
        self.state = str(control.get("state", ""))
        if self.state == "run":
            self.env = {str(k): str(v) for k, v in control.get("env", {}).items()}

    def answer(self, generation: int) -> None:
        tmp = self.path + ".left.tmp"
        with open(tmp, "w") as f:
            f.write(str(generation))
        os.replace(tmp, self.path + ".left")


_control: Optional[_Control] = None
# The generation the function is running in; a leave of a later one ends it.
_running = -1
_restarts = 0
# The sockets open when the function was last called: the ones it opens are its own.
_sockets_before: frozenset = frozenset()
# The last leave answered while waiting for a round.
_answered = -1


def _set_answered(generation: int) -> None:
    global _answered
    _answered = generation


def enabled() -> bool:
    """Whether this process runs under ``rdzv run --in-process-restart``."""
    return bool(os.environ.get(CONTROL_FILE_ENV))


def _the_control() -> Optional[_Control]:
    global _control
    if _control is None and enabled():
        _control = _Control(os.environ[CONTROL_FILE_ENV])
    return _control


def _leave_asked() -> bool:
    control = _the_control()
    if control is None:
        return False
    control.refresh()
    return control.state == "leave" and control.generation > _running


def check() -> None:
    """Raises ``Restart`` when the launcher asks this worker to leave (a ``stat`` of the
    control file; it is read only when it changed). Call it once a step."""
    if _leave_asked():
        raise Restart("a new round is forming")


def restarts() -> int:
    """How many times ``run`` has called the function again in this process."""
    return _restarts


def _grace() -> float:
    try:
        return float(os.environ.get("RDZV_INPROCESS_GRACE", "3"))
    except ValueError:
        return 3.0


def _wait(until: Callable[[], bool], timeout: Optional[float]) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    while not until():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _torch_distributed() -> Any:
    """torch.distributed if the program imported it, else None (never imported here)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available():
        return None
    return dist


def _abort_nccl() -> None:
    """Aborts NCCL's communicators, which ends a collective blocked in them (from any thread).
    Gloo has no such call: a collective on a dead peer fails on its own, one on a peer cut off
    waits for its timeout."""
    dist = _torch_distributed()
    if dist is None or not dist.is_initialized():
        return
    try:
        if dist.get_backend() != "nccl":
            return
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()
    except Exception:  # noqa: BLE001 - best effort: the launcher's bound is the backstop
        pass


def _open_sockets() -> Dict[int, str]:
    """This process's sockets: fd to ``socket:[inode]``."""
    found: Dict[int, str] = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:"):
            found[int(fd)] = link
    return found


def _shut_down_sockets() -> int:
    """Shuts down the connected TCP sockets the function opened (gloo's connections among
    them), so that a collective blocked on them fails here and at the peer; listening sockets
    stay (gloo's listener aborts the process if its socket fails). Returns how many."""
    if os.environ.get("RDZV_INPROCESS_SHUTDOWN_SOCKETS", "1") == "0":
        return 0
    if _torch_distributed() is None:
        return 0  # no torch.distributed: nothing of torch's to break
    # Also while a process group is being made (not initialized yet): its init waits on the
    # store and its peers, and fails at once when its connections go.
    shut = 0
    for fd, link in _open_sockets().items():
        if link in _sockets_before:
            continue
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            # The fd may have been closed and reused since it was listed: the copy must be
            # the same socket.
            same = os.readlink(f"/proc/self/fd/{sock.fileno()}") == link
            tcp = sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
            if same and tcp and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                sock.shutdown(socket.SHUT_RDWR)
                shut += 1
        except OSError:
            pass  # not connected, or already shut down
        finally:
            sock.close()  # the copy only: the owner's fd stays open
    return shut


def _abort() -> None:
    """Breaks a collective blocked in the function's process group (from any thread)."""
    _abort_nccl()
    _shut_down_sockets()


def _tear_down() -> None:
    dist = _torch_distributed()
    if dist is None or not dist.is_initialized():
        return
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - an aborted group may refuse: it is gone either way
        pass


def _watch_for_leave(stop: threading.Event) -> None:
    """Beside the function: on a leave, breaks a blocked collective (``_abort``)."""
    while not stop.wait(0.02):
        if _leave_asked():
            _abort()
            return


def _warm_up() -> None:
    """A spare (``rdzv run --in-process-spare``) imports, while it waits for a place, what
    torch imports lazily on a first use the function is likely to make: DDP's first wrap
    imports ``torch._dynamo`` (1.3 s of 1.6 s on a core), which a worker started again had
    imported in its last run."""
    if os.environ.get(SPARE_ENV) != "1" or "torch" not in sys.modules:
        return
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # noqa: BLE001 - only a head start: the function imports it anyway
        pass


def _serve_round_store() -> Any:
    """With torch imported, global rank 0 serves the round's TCPStore at ``MASTER_PORT`` before
    the function starts, and every rank's ``init_process_group`` is a client of it
    (``TORCHELASTIC_USE_AGENT_STORE``, as when torchrun's agent serves it). Otherwise a rank
    handed the round a few milliseconds before rank 0 connects before rank 0's
    ``init_process_group`` listens, and sits out TCPStore's retry backoff (0.25 to 0.75 s).
    Returns the store (kept for the round), None on other ranks or without torch."""
    dist = _torch_distributed()
    address = _master()
    if dist is None or address is None or os.environ.get(HOST_STORE_ENV, "1") == "0":
        return None
    if os.environ.get("RANK") != "0":
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        return None
    try:
        store = dist.TCPStore(address[0], address[1], is_master=True, wait_for_workers=False)
    except Exception:  # noqa: BLE001 - the port is taken: init_process_group says so itself
        return None
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    return store


def _master() -> Optional[tuple]:
    """The round's MASTER_ADDR and MASTER_PORT, if both are there."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    return (host, int(port)) if host and port.isdigit() else None


def _round_store_ready() -> bool:
    """On a rank other than 0 that left rank 0 to serve the round's store
    (``_serve_round_store``): waits until it accepts a connection. False when a leave is asked
    first (the round ended before this worker started in it)."""
    address = _master()
    serving = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if not serving or os.environ.get("RANK") == "0" or address is None:
        return True
    deadline = time.monotonic() + STORE_WAIT
    said = False
    while time.monotonic() < deadline:
        if _leave_asked():
            return False
        try:
            socket.create_connection(address, timeout=1).close()
            return True
        except OSError:
            if not said:
                sys.stderr.write(
                    f"rdzv.inprocess: waiting for rank 0 to serve the round's store at "
                    f"{address[0]}:{address[1]}\n"
                )
                said = True
            time.sleep(0.002)
    return True  # the function's own connect says what is wrong


def _next_round(control: _Control) -> bool:
    """Whether the launcher has handed out a round after the one the function ran in. A leave
    asked meanwhile (the round handed out ended before the function started in it: a spare
    still importing, a worker between two rounds) is answered at once: this worker is not in
    the function, so it has already left."""
    control.refresh()
    if control.state == "leave" and control.generation > _running:
        if control.generation != _answered:
            control.answer(control.generation)
            _set_answered(control.generation)
        return False
    return control.state == "run" and control.generation > _running


def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Calls ``fn(*args, **kwargs)``, and again in each new round the launcher forms, until it
    returns; returns its value. See the module's documentation."""
    global _running, _restarts, _sockets_before
    control = _the_control()
    if control is None:
        return fn(*args, **kwargs)
    control.refresh()
    _warm_up()
    while True:
        _wait(lambda: _next_round(control), None)
        _running = control.generation
        os.environ.update(control.env)
        store = _serve_round_store()
        if not _round_store_ready():
            # Not in the function yet: it has already left.
            control.answer(control.generation)
            continue
        _sockets_before = frozenset(_open_sockets().values())
        stop = threading.Event()
        watcher = threading.Thread(target=_watch_for_leave, args=(stop,), daemon=True)
        watcher.start()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not isinstance(e, Restart) and not _wait(_leave_asked, _grace()):
                raise
            # One write: two workers' lines on a shared stderr must not interleave.
            sys.stderr.write(
                "rdzv.inprocess: leaving the training function for the next round "
                f"({type(e).__name__}: {e})\n"
            )
            sys.stderr.flush()
        finally:
            stop.set()
        _abort()
        _tear_down()
        store = None  # noqa: F841 - the round's store closes before the leave is answered
        control.answer(control.generation)
        _restarts += 1
