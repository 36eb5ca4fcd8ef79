"""Test fixtures: a real etcd (by etcd-test-server: the first on PATH on free loopback ports),
started once per session and ready when it says so; unique run ids; helpers that never wait
without a deadline."""

from __future__ import annotations

import base64
import ctypes
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

PKG_ROOT = Path(__file__).resolve().parent.parent  # bindings/python
REPO_ROOT = PKG_ROOT.parent.parent
sys.path.insert(0, str(PKG_ROOT))
# The tests run against the debug build the test command makes, never a stale release build
# that the library lookup would otherwise prefer.
_debug_library = REPO_ROOT / "target" / "debug" / "librdzv.so"
if "RDZV_LIBRARY" not in os.environ and _debug_library.is_file():
    os.environ["RDZV_LIBRARY"] = str(_debug_library)

import rdzv  # noqa: E402
from rdzv import _ffi as _rdzv_ffi  # noqa: E402

# The library reads RDZV_LOG once, when first used: this process logs at info so that
# test_logs sees records through caplog, and the store's debug records so that test_faults can
# wait for a store wait to watch; child processes get the environment as it was.
_rdzv_log = os.environ.get("RDZV_LOG")
os.environ["RDZV_LOG"] = _rdzv_log or "info,rdzv::store=debug"
_rdzv_ffi.lib()
if _rdzv_log is None:
    del os.environ["RDZV_LOG"]

# The program tries etcd up to 3 times, 30 s each.
READY_TIMEOUT = 100.0
STARTED: list[str] = []  # "etcd VERSION ready at ENDPOINT" of each server, for the summary


# libc's prctl and signal, set up here rather than in a forked child.
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
_libc_signal = _libc.signal
_libc_signal.restype = ctypes.c_void_p
_libc_signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
_PR_SET_PDEATHSIG = 1
_SIG_DFL = 0


def dies_with_this_process(*default_signals: signal.Signals):
    """A ``preexec_fn`` that ties the child to this process's life: when it ends, even by
    SIGKILL, the child gets SIGKILL (PR_SET_PDEATHSIG), so a killed test run leaves no etcd or
    node behind. Linux sends it when the *thread* that forked exits, so children are started
    from the main thread only (fixtures and tests run there), which lives as long as pytest.
    The ``default_signals`` are set to SIG_DFL in the child, for children a test signals: an
    ignored disposition inherited from whoever started the tests would survive the exec."""
    assert threading.current_thread() is threading.main_thread(), \
        "a child started from another thread would be killed when that thread exits"
    parent = os.getpid()

    def preexec() -> None:
        if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(127)
        if os.getppid() != parent:  # the parent died before the prctl: nobody will signal us
            os._exit(1)
        for signum in default_signals:
            _libc_signal(signum, _SIG_DFL)  # signal.signal() is for the main thread only

    return preexec


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A real etcd, started by the repository's etcd-test-server program (the Rust tests' own
    etcd, as a program: tests/fixtures/etcd-test-server.rs, built by ``cargo build``;
    RDZV_ETCD_TEST_SERVER names another copy). The
    program ends etcd and its data when its stdin closes: at ``stop``, or when pytest ends
    however it ends; and it removes what killed earlier runs left."""

    def __init__(self):
        program = os.environ.get("RDZV_ETCD_TEST_SERVER") or str(
            REPO_ROOT / "target" / "debug" / "etcd-test-server"
        )
        try:
            self.proc = subprocess.Popen(
                [program], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
        except OSError as e:
            raise RuntimeError(f"could not start {program} (`cargo build` builds it): {e}")
        self.lines: queue.Queue[str] = queue.Queue()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.put(line.strip())
            self.lines.put("")  # it exited

        threading.Thread(target=read, name="etcd-test-server", daemon=True).start()
        try:
            self._ready(self._answer())
        except BaseException:
            self.stop()
            raise
        STARTED.append(f"etcd {self.version} ready at {self.endpoint}")

    def _answer(self) -> str:
        try:
            return self.lines.get(timeout=READY_TIMEOUT)
        except queue.Empty:
            return f"no answer within {READY_TIMEOUT} s"

    def _ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            return ""
        return self._answer()

    def _ready(self, line: str) -> None:
        """Reads "ENDPOINT PID DATADIR VERSION"."""
        fields = line.split()
        if len(fields) < 4 or fields[0] == "error":
            raise RuntimeError(f"etcd-test-server: {line!r} (its stderr is above)")
        self.endpoint, self.pid, self.version = fields[0], int(fields[1]), fields[3]

    def _ok(self, line: str) -> None:
        if line != "ok":
            raise RuntimeError(f"etcd-test-server: {line!r}")

    def kill(self) -> None:
        """SIGKILL, as a crash would; the data stays for ``restart``."""
        self._ok(self._ask("kill"))

    def signal(self, signum: int) -> None:
        """Sends ``signum`` to etcd: SIGSTOP freezes it, SIGCONT resumes it."""
        self._ok(self._ask(f"signal {int(signum)}"))

    def restart(self) -> None:
        """Starts etcd again on the same ports and data."""
        self._ready(self._ask("restart"))

    def url(self, run_id: str, **options: object) -> str:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"etcd://{self.endpoint}/{run_id}" + (f"?{query}" if query else "")

    def params(self, run_id: str, min_nodes: int, max_nodes: int, **options: object):
        options.setdefault("join_timeout", 30)
        options.setdefault("connect_timeout", 5)
        return rdzv.RendezvousParameters(
            "etcd-v3", self.endpoint, run_id, min_nodes, max_nodes, local_addr="127.0.0.1",
            **options,
        )

    def handler(self, run_id: str, min_nodes: int, max_nodes: int, **options: object):
        return rdzv.EtcdV3RendezvousHandler(self.params(run_id, min_nodes, max_nodes, **options))

    def keys(self, prefix: str) -> list[str]:
        """The keys under ``prefix``, read through etcd's own JSON gateway (not through rdzv)."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = {"key": _b64(prefix), "range_end": _b64(end), "keys_only": True}
        request = urllib.request.Request(
            f"http://{self.endpoint}/v3/kv/range", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            kvs = json.load(response).get("kvs", [])
        return [base64.b64decode(kv["key"]).decode() for kv in kvs]

    def stop(self) -> None:
        """Closes the program's stdin: it kills etcd, removes the data and exits."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
def pytest_terminal_summary(terminalreporter) -> None:
    """Says which etcd the tests ran against (also with -q)."""
    for line in STARTED:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def etcd():
    server = Etcd()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    """A run id unique to this test (and to this session)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)[:40]
    return f"py-{name}-{uuid.uuid4().hex[:12]}"


def wait_until(predicate, timeout: float, what: str, interval: float = 0.02):
    """Polls ``predicate`` until it returns a truthy value; fails the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def find_thread(name: str):
    for t in threading.enumerate():
        if t.name == name and t.is_alive():
            return t
    return None
