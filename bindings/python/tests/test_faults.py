"""Store waits while etcd is away: a get that waits when etcd is SIGKILLed or SIGSTOPped ends
within about a second of its cancel, its handler's shutdown or its own timeout. Each case
prints how long after its trigger the get returned (before cancel tokens: 27-30 s)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import Etcd
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
