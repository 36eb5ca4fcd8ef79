"""Test fixtures: a real etcd (the first on PATH: Debian's 3.4 or one built by
scripts/etcd-build.sh) on free loopback ports, started once per session and ready when it says
so; unique run ids; helpers that never wait without a deadline."""

from __future__ import annotations

import base64
import collections
import ctypes
import json
import os
import re
import shutil
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

READY_TIMEOUT = 30.0
# The server version in etcd's startup log: "etcd Version: 3.4.23" (3.4) or
# "etcd-version":"3.7.3" (3.5 and later, JSON).
VERSION_LOG = re.compile(r'etcd Version: (\S+)|"etcd-version":"([^"]+)"')
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
    def __init__(self, data_dir: Path):
        etcd = shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("etcd must be on PATH to run these tests")
        self.client_port = free_port()
        self.peer_port = free_port()
        self.name = f"rdzv-py-{os.getpid()}"
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self.version = "(version not logged)"
        ready = threading.Event()
        self.proc = subprocess.Popen(
            [
                etcd,
                "--name", self.name,
                "--data-dir", str(data_dir),
                "--listen-client-urls", client,
                "--advertise-client-urls", client,
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"{self.name}={peer}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            # Started by the session fixture, on the main thread: it lives as long as pytest.
            preexec_fn=dies_with_this_process(),
        )

        def drain() -> None:  # keeps reading so etcd never blocks on a full pipe
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.log.append(line.rstrip())
                found = None if ready.is_set() else VERSION_LOG.search(line)
                if found:
                    self.version = found.group(1) or found.group(2)
                if "ready to serve client requests" in line:
                    ready.set()

        threading.Thread(target=drain, name="etcd-log", daemon=True).start()
        if not ready.wait(READY_TIMEOUT):
            self.stop()
            raise RuntimeError(
                f"etcd did not report ready within {READY_TIMEOUT} s:\n" + "\n".join(self.log)
            )
        STARTED.append(f"etcd {self.version} ready at {self.endpoint}")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

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
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
def pytest_terminal_summary(terminalreporter) -> None:
    """Says which etcd the tests ran against (also with -q)."""
    for line in STARTED:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory):
    server = Etcd(tmp_path_factory.mktemp("etcd") / "data")
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
