"""Calls while etcd is away: a get that waits when etcd is SIGKILLed or SIGSTOPped ends
within about a second of its cancel, its handler's shutdown or its own timeout, and any call
that asks a frozen etcd ends within about a second of Ctrl-C. Each case prints how long after
its trigger the call returned (before cancel tokens: 27-30 s)."""

from __future__ import annotations

import _thread
import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import Etcd, find_thread, wait_until
import rdzv
from rdzv import (
    RendezvousCancelledError,
    RendezvousConnectionError,
    RendezvousShutdownError,
    RendezvousTimeoutError,
)

# "At once": about a second at most. Machines running many tests at once are slow.
PROMPT = 3.0


class Records(logging.Handler):
    """The library's records (through the "rdzv" logger), to wait for what a call does (its
    store wait watching, its reads failing) instead of sleeping."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.added = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.added:
            self.lines.append(record.getMessage())
            self.added.notify_all()

    def mark(self) -> int:
        with self.added:
            return len(self.lines)

    def wait_for(self, since: int, run_id: str, what: str) -> None:
        with self.added:
            seen = self.added.wait_for(
                lambda: any(run_id in line and what in line for line in self.lines[since:]), 20
            )
        assert seen, f"no record {what!r} of run {run_id}"


@pytest.fixture
def records():
    logger = logging.getLogger("rdzv")
    handler, level = Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def private_etcd():
    """An etcd of this test's own, which it kills or freezes."""
    server = Etcd()
    yield server
    server.stop()  # SIGKILL ends a frozen etcd too


def timed(fn, *args):
    """``fn(*args)``'s exception (or None) and when it returned."""
    try:
        fn(*args)
        return None, time.monotonic()
    except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
        return e, time.monotonic()


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
@pytest.mark.parametrize("trigger", ["cancel", "shutdown", "deadline"])
def test_a_waiting_get_ends_promptly_when_etcd_goes_away(private_etcd, records, run_id, fault,
                                                         trigger):
    etcd = private_etcd
    handler = etcd.handler(run_id, 1, 1, close_timeout=2)
    store = handler.next_rendezvous().store
    timeout = 3.0 if trigger == "deadline" else 60.0
    since = records.mark()
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(timed, store.get, "never", timeout)
        records.wait_for(since, run_id, "store wait watching")
        since = records.mark()
        if fault == "SIGKILL":
            etcd.kill()
            # Its watch broke, and its read finds etcd gone (a warning after a second of that).
            records.wait_for(since, run_id, "still retrying")
        else:
            etcd.signal(signal.SIGSTOP)  # its read after the watch's set-up hangs
        fired = time.monotonic()
        if trigger == "cancel":
            store.cancel()
        elif trigger == "shutdown":
            pool.submit(handler.shutdown)  # blocks up to close_timeout while etcd is away
        else:
            fired = started + timeout
        error, returned = waiting.result(timeout=60)
    late = returned - fired
    print(f"get, etcd {fault} under it, {trigger}: returned {late:.2f} s after it ({error!r})")
    if fault == "SIGSTOP":
        etcd.signal(signal.SIGCONT)
    store.close()
    handler.close()
    expected = {
        "cancel": (RendezvousCancelledError,),
        "shutdown": (RendezvousShutdownError,),
        # A deadline that passes while etcd does not answer is reported as etcd's failure.
        "deadline": (RendezvousTimeoutError, RendezvousConnectionError),
    }[trigger]
    assert isinstance(error, expected), repr(error)
    assert late < PROMPT, f"returned {late:.1f} s after its {trigger}"


@pytest.fixture
def python_handles_sigint():
    """SIGINT raises KeyboardInterrupt for the test's duration (see test_rendezvous.py)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def test_ctrl_c_ends_calls_that_ask_a_frozen_etcd(run_id, python_handles_sigint):
    """Each call runs with a cancel token of its own that Ctrl-C cancels: it ends within about
    a second, and its worker thread is gone with it (before, the worker went on until
    connect_timeout, 60 s here, and Ctrl-C waited for it up to 10 s)."""
    own = Etcd()
    try:
        with own.handler(run_id, 1, 1, connect_timeout=60, close_timeout=2) as node:
            store = node.next_rendezvous().store
            admin = rdzv.Admin(own.url(run_id, connect_timeout=60))
            own.signal(signal.SIGSTOP)
            calls = {
                f"rdzv-num-waiting:{node.node_id}": node.num_nodes_waiting,
                f"rdzv-is-closed:{node.node_id}": node.is_closed,
                f"rdzv-set-closed:{node.node_id}": node.set_closed,
                store._name: lambda: store.set("k", "v"),
                "rdzv-admin-status": admin.status,
            }
            # num_waiting and is_closed answer from the node's membership watch while it is in
            # sync (it may have synced before etcd froze, on a loaded machine): they may return at
            # once, asking etcd nothing. Every other call asks etcd and must end on Ctrl-C.
            watched = {f"rdzv-num-waiting:{node.node_id}", f"rdzv-is-closed:{node.node_id}"}
            for thread, call in calls.items():
                returned = threading.Event()

                def interrupt_when_running(
                    thread: str = thread, returned: threading.Event = returned
                ) -> None:
                    wait_until(lambda: find_thread(thread) or returned.is_set(), 20,
                               f"{thread} to start")
                    if not returned.is_set():
                        _thread.interrupt_main()  # what Ctrl-C does

                with ThreadPoolExecutor(1) as pool:
                    interrupter = pool.submit(interrupt_when_running)
                    t0 = time.monotonic()
                    answered = False
                    try:
                        call()
                        answered = True
                    except KeyboardInterrupt:
                        pass
                    finally:
                        returned.set()
                    took = time.monotonic() - t0
                    interrupter.result(timeout=20)
                assert not answered or thread in watched, f"{thread}: no KeyboardInterrupt"
                if answered:
                    assert took < PROMPT, f"{thread} answered from the watch in {took:.2f} s"
                print(f"{thread}, etcd frozen, Ctrl-C: returned after {took:.2f} s")
                assert took < 20 + PROMPT, thread
                worker = find_thread(thread)
                if worker is not None:  # it signalled its end and may not have exited yet
                    worker.join(PROMPT)
                    assert not worker.is_alive(), f"{thread}: the call went on after Ctrl-C"
            own.signal(signal.SIGCONT)
            store.close()
            admin.close()
    finally:
        own.stop()
