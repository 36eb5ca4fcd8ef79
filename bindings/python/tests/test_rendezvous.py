"""Rendezvous scenarios against a real etcd: nodes as threads and as processes, closing,
cancelling, Ctrl-C, timeouts, late arrivals and lost members."""

from __future__ import annotations

import _thread
import ctypes
import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import PKG_ROOT, dies_with_this_process, find_thread, wait_until
from rdzv import (
    Admin,
    EtcdV3RendezvousHandler,
    RendezvousCancelledError,
    RendezvousClosedError,
    RendezvousShutdownError,
    RendezvousTimeoutError,
    _ffi,
)

T = 30  # seconds: the bound on any wait in these tests
NODE = PKG_ROOT / "examples" / "node.py"


def next_thread(handler):
    """The worker thread of a next_rendezvous() running on the main thread, or None."""
    return find_thread(f"rdzv-next:{handler.node_id}")


def wait_for_next(handler):
    return wait_until(lambda: next_thread(handler), T, "next_rendezvous to start")


def test_single_node(etcd, run_id):
    with etcd.handler(run_id, 1, 1) as h:
        assert h.get_run_id() == run_id
        assert h.get_backend() == "etcd-v3"
        assert h.use_agent_store is False
        assert h.node_id and int(h.node_id, 16) >= 0  # hex
        assert h.num_nodes_waiting() == 0 and h.num_nodes_lost() == 0
        assert h.is_closed() is False
        info = h.next_rendezvous()
        with info.store:
            assert (info.round, info.rank, info.world_size) == (0, 0, 1)
            assert info.bootstrap_store_info.master_addr == "127.0.0.1"  # local_addr
            assert 0 < info.bootstrap_store_info.master_port < 65536
        with h.next_rendezvous().store as store:  # a new round
            assert store is not info.store
        assert h.num_nodes_waiting() == 0


def test_from_url(etcd, run_id):
    url = etcd.url(run_id, min_nodes=1, max_nodes=1, local_addr="localhost", store_timeout=7)
    with EtcdV3RendezvousHandler.from_url(url) as h:
        assert h.get_run_id() == run_id
        info = h.next_rendezvous()
        with info.store:
            assert info.bootstrap_store_info.master_addr == "localhost"
            assert info.store.timeout.total_seconds() == 7


def run_nodes(urls):
    procs = [
        subprocess.Popen([sys.executable, str(NODE), url], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=dies_with_this_process())
        for url in urls
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, f"node failed ({p.returncode}): {out} {err}"
            lines = out.strip().splitlines()
            assert len(lines) == 1, out
            results.append(json.loads(lines[0]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=T)
    return results


def test_nodes_as_processes(etcd, run_id):
    n = 3
    url = etcd.url(run_id, min_nodes=n, max_nodes=n, join_timeout=60)
    results = run_nodes([url] * n)
    assert sorted(r["rank"] for r in results) == list(range(n))
    for r in results:
        assert r["lang"] == "python"
        assert r["world_size"] == n
        assert r["round"] == results[0]["round"]
        assert r["peers"] == ["python"] * n  # read every peer's value


def test_example_reports_errors_as_json(etcd, run_id):
    from conftest import free_port

    r = subprocess.run(
        [sys.executable, str(NODE), f"etcd://127.0.0.1:{free_port()}/{run_id}?connect_timeout=1"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2
    report = json.loads(r.stdout)
    assert report["lang"] == "python" and report["error"] == "RDZV_ERR_CONNECTION"
    r = subprocess.run([sys.executable, str(NODE)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 64 and "usage" in r.stderr


def test_min_below_max_completes_after_last_call(etcd, run_id):
    with etcd.handler(run_id, 2, 4, last_call_timeout=1) as a, \
            etcd.handler(run_id, 2, 4, last_call_timeout=1) as b:
        t0 = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(h.next_rendezvous) for h in (a, b)]
            infos = [f.result(timeout=T) for f in futures]
        elapsed = time.monotonic() - t0
        assert sorted(i.rank for i in infos) == [0, 1]
        assert all(i.world_size == 2 for i in infos)
        assert infos[0].round == infos[1].round
        assert elapsed >= 0.9, "a round below max_nodes must wait for last_call_timeout"
        for i in infos:
            i.store.close()


def test_full_round_does_not_wait_for_last_call(etcd, run_id):
    with etcd.handler(run_id, 1, 2, last_call_timeout=60) as a, \
            etcd.handler(run_id, 1, 2, last_call_timeout=60) as b:
        t0 = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(h.next_rendezvous) for h in (a, b)]
            infos = [f.result(timeout=T) for f in futures]
        assert time.monotonic() - t0 < T
        assert sorted(i.rank for i in infos) == [0, 1]
        for i in infos:
            i.store.close()


def test_set_closed_wakes_a_blocked_next(etcd, run_id):
    with etcd.handler(run_id, 2, 2) as a, etcd.handler(run_id, 2, 2) as b:
        def close_when_blocked():
            wait_for_next(a)
            b.set_closed()

        with ThreadPoolExecutor(1) as pool:
            closer = pool.submit(close_when_blocked)
            t0 = time.monotonic()
            with pytest.raises(RendezvousClosedError):
                a.next_rendezvous()  # join_timeout is 30 s: only the close ends it sooner
            assert time.monotonic() - t0 < 15
            closer.result(timeout=T)
        assert a.is_closed() and b.is_closed()
        with pytest.raises(RendezvousClosedError):
            b.next_rendezvous()


def test_cancel_wakes_a_blocked_next_and_handler_stays_usable(etcd, run_id):
    with etcd.handler(run_id, 2, 2) as a, etcd.handler(run_id, 2, 2) as b:
        def cancel_once_blocked():
            wait_for_next(a)
            a.cancel()  # once: a cancel is never lost

        with ThreadPoolExecutor(1) as pool:
            canceller = pool.submit(cancel_once_blocked)
            t0 = time.monotonic()
            with pytest.raises(RendezvousCancelledError):
                a.next_rendezvous()
            assert time.monotonic() - t0 < 15
            canceller.result(timeout=T)

        with ThreadPoolExecutor(1) as pool:
            other = pool.submit(b.next_rendezvous)
            mine = a.next_rendezvous()
            theirs = other.result(timeout=T)
        assert {mine.rank, theirs.rank} == {0, 1}
        assert mine.world_size == theirs.world_size == 2
        mine.store.close()
        theirs.store.close()


@pytest.fixture
def python_handles_sigint():
    """SIGINT raises KeyboardInterrupt for the test's duration. interrupt_main() does nothing
    unless Python handles SIGINT, and Python does not when the runner inherited it ignored (as
    a background job of a non-interactive shell does)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def test_ctrl_c_cancels_next_and_handler_stays_usable(etcd, run_id, python_handles_sigint):
    with etcd.handler(run_id, 2, 2) as a, etcd.handler(run_id, 2, 2) as b:
        def interrupt_when_blocked():
            wait_for_next(a)
            _thread.interrupt_main()  # what Ctrl-C does

        with ThreadPoolExecutor(1) as pool:
            interrupter = pool.submit(interrupt_when_blocked)
            t0 = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                a.next_rendezvous()
            assert time.monotonic() - t0 < 15
            interrupter.result(timeout=T)
        # The join was cancelled, not abandoned: otherwise this next would fail with
        # "another call to next is already running".

        with ThreadPoolExecutor(1) as pool:
            other = pool.submit(b.next_rendezvous)
            mine = a.next_rendezvous()
            theirs = other.result(timeout=T)
        assert {mine.rank, theirs.rank} == {0, 1}
        mine.store.close()
        theirs.store.close()


def test_a_cancel_before_next_is_called_ends_it_at_once(etcd, run_id):
    """The race a cancel used to lose (made just before the join starts), made deterministic:
    with no next_rendezvous running, cancel() ends the next one, at once (join_timeout is
    30 s), and is used up by it."""
    with etcd.handler(run_id, 2, 2) as a, etcd.handler(run_id, 2, 2) as b:
        a.cancel()
        t0 = time.monotonic()
        with pytest.raises(RendezvousCancelledError):
            a.next_rendezvous()
        assert time.monotonic() - t0 < 3
        # Nothing was joined, and the cancel was used up: a round of two forms now.
        with ThreadPoolExecutor(1) as pool:
            other = pool.submit(b.next_rendezvous)
            mine = a.next_rendezvous()
            theirs = other.result(timeout=T)
        assert mine.world_size == theirs.world_size == 2
        mine.store.close()
        theirs.store.close()


def test_the_handles_cancel_is_kept_by_the_library(etcd, run_id):
    """cancel() is the library's (rdzv_cancel, rdzv_store_cancel, rdzv_admin_cancel): made with
    no call running, it ends the next call to start, even one made through the C functions
    directly, and is used up by it."""
    L = _ffi.lib()
    with etcd.handler(run_id, 2, 2) as a:
        a.cancel()
        with a._res.use() as p:
            rnd, store = _ffi.rdzv_round_t(), _ffi.StoreP()
            assert L.rdzv_next(p, ctypes.byref(rnd), ctypes.byref(store), None) == _ffi.RDZV_ERR_CANCELLED
    with etcd.handler(run_id + "-one", 1, 1) as one, Admin(etcd.url(run_id)) as admin:
        info = one.next_rendezvous()
        with info.store as store:
            store.set("here", "v")
            store.cancel()
            with store._res.use() as p:
                ptr, n = _ffi.BytesP(), ctypes.c_size_t()
                status = L.rdzv_store_get(p, b"here", 60000, ctypes.byref(ptr), ctypes.byref(n), None)
            assert status == _ffi.RDZV_ERR_CANCELLED
            assert store.get("here", T) == b"v"  # used up
        admin.cancel()
        with admin._res.use() as p:
            out = _ffi.RunStatusP()
            assert L.rdzv_admin_watch(p, 60000, ctypes.byref(out), None) == _ffi.RDZV_ERR_CANCELLED
        assert admin.watch_next(T) is not None  # used up: the handle's first watch call


def test_join_timeout(etcd, run_id):
    with etcd.handler(run_id, 2, 2, join_timeout=1) as a:
        t0 = time.monotonic()
        with pytest.raises(RendezvousTimeoutError):
            a.next_rendezvous()
        assert 0.9 <= time.monotonic() - t0 < 15
        assert a.num_nodes_waiting() == 0  # still usable


def test_shutdown_wakes_a_blocked_next_and_close_is_idempotent(etcd, run_id):
    a = etcd.handler(run_id, 2, 2)

    def shutdown_when_blocked():
        wait_for_next(a)
        return a.shutdown()

    with ThreadPoolExecutor(1) as pool:
        stopper = pool.submit(shutdown_when_blocked)
        t0 = time.monotonic()
        with pytest.raises(RendezvousShutdownError):
            a.next_rendezvous()
        assert time.monotonic() - t0 < 15
        assert stopper.result(timeout=T) is True
    assert a.shutdown() is True  # idempotent
    with pytest.raises(RendezvousShutdownError):
        a.next_rendezvous()
    a.close()
    a.close()
    assert a.closed
    for call in (a.next_rendezvous, a.is_closed, a.set_closed, a.num_nodes_waiting, a.cancel):
        with pytest.raises(RendezvousShutdownError):
            call()
    assert a.get_run_id() == run_id


def test_context_manager_closes(etcd, run_id):
    with etcd.handler(run_id, 1, 1) as h:
        pass
    assert h.closed
    with pytest.raises(RendezvousShutdownError):
        h.num_nodes_waiting()


def test_late_arrival_waits_and_is_admitted(etcd, run_id):
    opts = dict(last_call_timeout=1)
    with etcd.handler(run_id, 2, 3, **opts) as a, etcd.handler(run_id, 2, 3, **opts) as b, \
            etcd.handler(run_id, 2, 3, **opts) as c, ThreadPoolExecutor(3) as pool:
        first = [pool.submit(h.next_rendezvous) for h in (a, b)]
        ia, ib = (f.result(timeout=T) for f in first)
        assert ia.world_size == ib.world_size == 2

        late = pool.submit(c.next_rendezvous)
        wait_until(lambda: a.num_nodes_waiting() == 1, T, "a to see the late node")
        assert a.num_nodes_waiting(include_lost=False) == 1 and a.num_nodes_lost() == 0
        assert not late.done()

        again = [pool.submit(h.next_rendezvous) for h in (a, b)]
        ja, jb = (f.result(timeout=T) for f in again)
        jc = late.result(timeout=T)
        assert ja.world_size == jb.world_size == jc.world_size == 3
        assert ja.round == jb.round == jc.round > ia.round
        assert (ja.rank < jb.rank) == (ia.rank < ib.rank)  # survivors keep their order
        assert jc.rank == 2
        for info in (ia, ib, ja, jb, jc):
            info.store.close()


JOIN_AND_HOLD = """
import sys
sys.path.insert(0, sys.argv[2])
from rdzv import EtcdV3RendezvousHandler
h = EtcdV3RendezvousHandler.from_url(sys.argv[1])
info = h.next_rendezvous()
print("joined", info.rank, flush=True)
sys.stdin.read()  # hold the membership until killed
"""


def test_lost_member_counts_as_waiting(etcd, run_id):
    url = etcd.url(run_id, min_nodes=2, max_nodes=2, lease_ttl=2, join_timeout=T)
    peer = subprocess.Popen([sys.executable, "-c", JOIN_AND_HOLD, url, str(PKG_ROOT)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=dies_with_this_process())
    try:
        with etcd.handler(run_id, 2, 2, lease_ttl=2) as a, ThreadPoolExecutor(2) as pool:
            line = pool.submit(peer.stdout.readline)
            info = a.next_rendezvous()
            assert line.result(timeout=T).startswith("joined")
            assert a.num_nodes_waiting() == 0
            peer.kill()  # SIGKILL: no shutdown, the lease must expire
            peer.wait(timeout=T)
            wait_until(lambda: a.num_nodes_lost() == 1, T, "the dead member to be noticed")
            assert a.num_nodes_waiting(include_lost=False) == 0
            assert a.num_nodes_waiting() == 1  # what torch's agent polls
            info.store.close()
    finally:
        if peer.poll() is None:
            peer.kill()
        peer.wait(timeout=T)


INTERRUPTED_NODE = """
import signal
# SIGINT must raise KeyboardInterrupt whatever disposition this process inherited: Python
# leaves an inherited SIG_IGN in place.
signal.signal(signal.SIGINT, signal.default_int_handler)
import sys, threading, time
sys.path.insert(0, sys.argv[2])
from rdzv import EtcdV3RendezvousHandler
h = EtcdV3RendezvousHandler.from_url(sys.argv[1])
name = "rdzv-next:" + h.node_id

def announce():  # tells the parent once next_rendezvous is under way
    deadline = time.monotonic() + 30
    while not any(t.name == name for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    print("blocked", flush=True)

threading.Thread(target=announce, daemon=True).start()
t0 = time.monotonic()
try:
    h.next_rendezvous()
    print("joined", flush=True)
except KeyboardInterrupt:
    print("interrupted", round(time.monotonic() - t0, 3), h.num_nodes_waiting(), flush=True)
h.close()
"""


def test_real_sigint_interrupts_next(etcd, run_id):
    url = etcd.url(run_id, min_nodes=2, max_nodes=2, join_timeout=T)
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_NODE, url, str(PKG_ROOT)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=dies_with_this_process(signal.SIGINT))
    # Not `with ThreadPoolExecutor`: its exit waits for the reader, which a child that never
    # prints would block forever. The child is killed first, which ends the read.
    reader = ThreadPoolExecutor(1)
    try:
        assert reader.submit(proc.stdout.readline).result(timeout=T).strip() == "blocked"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=T)
        assert proc.returncode == 0, err
        assert out.startswith("interrupted"), (out, err)
        assert float(out.split()[1]) < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=T)
        reader.shutdown(wait=True)


def _etcd_requests(etcd, method: str) -> float:
    """Unary calls of ``method`` etcd has handled, from its metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://{etcd.endpoint}/metrics", timeout=10) as response:
        body = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("grpc_server_handled_total{") and f'grpc_method="{method}"' in line
    )


def test_torchs_monitor_tick_costs_etcd_nothing_at_rest(etcd, run_id):
    """torch's agent calls num_nodes_waiting() every monitor tick (0.1 s by default) on every
    node: answered from the library's membership watch, so a job at rest costs etcd its lease
    refreshes alone (docs/OPERATIONS.md, "At rest")."""
    with etcd.handler(run_id, 1, 1) as h:
        h.next_rendezvous()
        # The first calls start the watch and read etcd until it is in sync: wait until a
        # batch of polls reaches etcd no more.
        def quiet() -> bool:
            reads = _etcd_requests(etcd, "Range")
            for _ in range(50):
                h.num_nodes_waiting()
                h.is_closed()
            return _etcd_requests(etcd, "Range") == reads

        wait_until(quiet, T, "polls answered from the membership watch")
        before = (_etcd_requests(etcd, "Range"), _etcd_requests(etcd, "Txn"))
        for _ in range(500):
            assert h.num_nodes_waiting() == 0
            assert h.is_closed() is False
        assert (_etcd_requests(etcd, "Range"), _etcd_requests(etcd, "Txn")) == before
