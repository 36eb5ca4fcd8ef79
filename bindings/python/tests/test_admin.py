"""The operator handle (rdzv.Admin) and draining against a real etcd: the status of an absent
and of a formed run, a drain seen by the watch, by the other members and by the drained node,
purge, closing a run, cancelling a watch, a watch whose etcd dies, and Ctrl-C (a real SIGINT)
ending a watch."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import PKG_ROOT, Etcd, dies_with_this_process, find_thread, wait_until
from rdzv import (
    Admin,
    RendezvousCancelledError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousInvalidArgumentError,
    RendezvousShutdownError,
    RendezvousTimeoutError,
    RunStatus,
    admin as admin_module,
)

T = 30  # seconds: the bound on any wait in these tests


@pytest.fixture
def nodes(etcd, run_id):
    """Makes handlers on the test's run and closes them all at the end."""
    made = []

    def make(n: int, min_nodes: int, max_nodes: int, **options):
        new = [etcd.handler(run_id, min_nodes, max_nodes, **options) for _ in range(n)]
        made.extend(new)
        return new

    yield make
    for h in made:
        h.close()


def form(handlers):
    """Runs next_rendezvous on every handler at once (threads); returns the handlers and their
    rounds, in rank order. The rounds' stores are closed."""
    with ThreadPoolExecutor(len(handlers)) as pool:
        futures = [pool.submit(h.next_rendezvous) for h in handlers]
        infos = [f.result(timeout=T) for f in futures]
    for info in infos:
        info.store.close()
    pairs = sorted(zip(handlers, infos), key=lambda pair: pair[1].rank)
    return [h for h, _ in pairs], [i for _, i in pairs]


def test_status_of_an_absent_run_is_empty_not_an_error(etcd, run_id):
    with Admin(etcd.url(run_id)) as admin:
        s = admin.status()
    assert isinstance(s, RunStatus)
    assert s.run_id == run_id
    assert (s.exists, s.closed, s.sealed_round) == (False, False, None)
    assert s.members == () and s.waiting == ()
    assert (s.num_lost, s.num_draining, s.num_alive) == (0, 0, 0)
    assert s.lost() == () and s.draining() == ()
    assert (s.master_addr, s.master_port) == ("", 0)
    assert s.revision > 0
    assert admin.closed
    with pytest.raises(RendezvousShutdownError):
        admin.status()


def test_a_formed_round_is_listed_in_rank_order(etcd, run_id, nodes):
    handlers, infos = form(nodes(2, 2, 2))
    # From parameters this time, and through the module's connect().
    with admin_module.connect(etcd.params(run_id, 1, 1)) as admin:
        s = admin.status()
    assert s.exists and not s.closed
    assert s.sealed_round == infos[0].round == 0
    assert [m.rank for m in s.members] == [0, 1]
    assert [m.node_id for m in s.members] == [h.node_id for h in handlers]
    assert all(m.alive and not m.draining and m.addr for m in s.members)
    assert s.master_addr == infos[0].bootstrap_store_info.master_addr == "127.0.0.1"
    assert s.master_port == infos[0].bootstrap_store_info.master_port
    assert (s.num_alive, s.num_lost, s.num_draining) == (2, 0, 0)
    assert s.waiting == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.closed = True  # type: ignore[misc]


def test_a_drained_member_is_seen_by_the_watch_and_the_others_reform_without_it(
    etcd, run_id, nodes
):
    # A lease far longer than the test and a last call longer than the join timeout: round 1
    # forms in time only because the drain is seen at once and nobody waits for the node.
    opts = dict(lease_ttl=60, last_call_timeout=60, join_timeout=20)
    handlers, _ = form(nodes(3, 2, 3, **opts))
    ids = [h.node_id for h in handlers]
    # The survivors track losses from before the drain, as a polling agent does.
    assert handlers[0].num_nodes_lost() == 0 and handlers[2].num_nodes_lost() == 0

    with Admin(etcd.url(run_id)) as admin:
        statuses = admin.watch(idle_timeout=T)
        first = next(statuses)
        assert [m.node_id for m in first.members] == ids and first.draining() == ()
        admin.drain(ids[1], "maintenance")
        changed = next(s for s in statuses if s.draining())
        statuses.close()
    assert [(m.rank, m.node_id) for m in changed.draining()] == [(1, ids[1])]
    assert changed.num_draining == 1 and changed.members[1].draining
    assert changed.lost() == () and changed.num_lost == 0, "a drained member is alive, not lost"
    assert changed.revision > first.revision

    for survivor in (handlers[0], handlers[2]):
        wait_until(lambda: survivor.num_nodes_lost() == 1, T, "the drain to count as a loss")
    assert handlers[1].is_draining() and not handlers[0].is_draining()
    with pytest.raises(RendezvousGracefulExitError, match="maintenance"):
        handlers[1].next_rendezvous()

    survivors, infos = form([handlers[0], handlers[2]])
    assert [(i.round, i.world_size) for i in infos] == [(1, 2), (1, 2)]
    assert survivors[0] is handlers[0], "rank 0 stays rank 0"
    with Admin(etcd.url(run_id)) as admin:
        s = admin.status()
    assert s.sealed_round == 1
    assert [m.node_id for m in s.members] == [ids[0], ids[2]]


def test_a_node_drains_itself(etcd, run_id, nodes):
    handlers, _ = form(nodes(2, 2, 2, lease_ttl=60))
    assert handlers[0].num_nodes_lost() == 0
    assert not handlers[1].is_draining()
    handlers[1].drain("preemption notice")
    assert handlers[1].is_draining()
    wait_until(lambda: handlers[0].num_nodes_lost() == 1, T, "the drain to count as a loss")
    with pytest.raises(RendezvousGracefulExitError, match="preemption notice"):
        handlers[1].next_rendezvous()


def test_draining_an_unknown_node_names_it(etcd, run_id):
    with Admin(etcd.url(run_id)) as admin:
        with pytest.raises(RendezvousInvalidArgumentError, match="0123456789abcdef"):
            admin.drain("0123456789abcdef", "scale down")
        with pytest.raises(RendezvousInvalidArgumentError):
            admin.drain("a/b")
        with pytest.raises(RendezvousInvalidArgumentError, match="node_id"):
            admin.drain("a\0b")
        assert not admin.status().exists, "a failed drain writes nothing"


def test_purge_is_refused_while_a_node_is_alive_and_deletes_after(etcd, run_id, nodes):
    prefix = f"/rdzv/{run_id}/"
    (node,) = nodes(1, 1, 1)
    node.next_rendezvous().store.close()
    with Admin(etcd.url(run_id)) as admin:
        before = etcd.keys(prefix)
        refused = admin.purge()
        assert refused.refused and refused.refused_alive == 1 and refused.deleted == 0
        assert etcd.keys(prefix) == before, "a refused purge deletes nothing"

        # The closed marker outlives the nodes (the last one to leave deletes the rest).
        admin.close_run()
        node.close()
        left = etcd.keys(prefix)
        assert left, "the closed marker stays after the last node left"
        done = admin.purge()
        assert not done.refused and done.deleted == len(left)
        assert etcd.keys(prefix) == []
        assert not admin.status().exists


def test_forced_purge_deletes_while_a_node_is_alive(etcd, run_id, nodes):
    (node,) = nodes(1, 1, 1)
    node.next_rendezvous().store.close()
    with Admin(etcd.url(run_id)) as admin:
        done = admin.purge(force=True)
        assert not done.refused and done.deleted > 0
        assert etcd.keys(f"/rdzv/{run_id}/") == []


def test_close_run_wakes_a_blocked_next(etcd, run_id, nodes):
    (node,) = nodes(1, 2, 2)
    with Admin(etcd.url(run_id)) as admin:
        def close_when_blocked():
            wait_until(lambda: find_thread(f"rdzv-next:{node.node_id}"), T, "next to start")
            admin.close_run()

        with ThreadPoolExecutor(1) as pool:
            closer = pool.submit(close_when_blocked)
            t0 = time.monotonic()
            with pytest.raises(RendezvousClosedError):
                node.next_rendezvous()  # join_timeout is 30 s: only the close ends it sooner
            assert time.monotonic() - t0 < 15
            closer.result(timeout=T)
        assert admin.status().closed and node.is_closed()


def test_watch_next_times_out_and_then_returns_the_change(etcd, run_id, nodes):
    (node,) = nodes(1, 1, 1)
    with Admin(etcd.url(run_id)) as admin:
        first = admin.watch_next(T)
        assert first is not None and first.num_alive == 1
        t0 = time.monotonic()
        assert admin.watch_next(0.3) is None  # nothing changed
        assert time.monotonic() - t0 >= 0.25
        # A change made while no watch call runs is not lost.
        node.close()
        changed = admin.watch_next(T)
        assert changed is not None and changed.num_alive == 0
        assert changed.revision > first.revision
        with pytest.raises(RendezvousInvalidArgumentError):
            admin.watch_next(-1)


def test_cancel_ends_a_watch_in_another_thread(etcd, run_id):
    with Admin(etcd.url(run_id)) as admin:
        assert admin.watch_next(T) is not None  # the handle's first watch call: the status now
        # watch_next raises, and the handle stays usable.
        with ThreadPoolExecutor(1) as pool:
            blocked = pool.submit(admin.watch_next, T)
            admin.cancel()  # once, even if the call has not started yet: it is not lost
            with pytest.raises(RendezvousCancelledError):
                blocked.result(timeout=T)
        assert admin.watch_next(0.2) is None

        got_first = threading.Event()

        def consume():
            seen = []
            for status in admin.watch():
                seen.append(status)
                got_first.set()
            return seen

        with ThreadPoolExecutor(1) as pool:
            consumer = pool.submit(consume)
            assert got_first.wait(T)
            # Once: the generator was made before it, so it ends whether its thread is inside
            # the library's watch or between two calls.
            admin.cancel()
            seen = consumer.result(timeout=T)
        assert [s.exists for s in seen] == [False]
        # A new generator starts again from the current status.
        again = admin.watch()
        assert next(again).exists is False
        again.close()


def test_watch_idle_timeout(etcd, run_id):
    with Admin(etcd.url(run_id)) as admin:
        statuses = admin.watch(idle_timeout=0.3)
        assert next(statuses).exists is False
        with pytest.raises(RendezvousTimeoutError):
            next(statuses)


def test_a_watch_ends_with_a_connection_error_when_etcd_dies(run_id):
    own = Etcd()  # this test's own etcd, since it kills it
    try:
        with Admin(own.url(run_id, connect_timeout=2)) as admin:
            # idle_timeout far above connect_timeout: timing out instead would fail the test.
            statuses = admin.watch(idle_timeout=T)
            assert next(statuses).exists is False
            own.stop()
            t0 = time.monotonic()
            with pytest.raises(RendezvousConnectionError):
                next(statuses)
            assert time.monotonic() - t0 < 20
    finally:
        own.stop()


WATCHER = """
import signal
# SIGINT must raise KeyboardInterrupt whatever disposition this process inherited: Python
# leaves an inherited SIG_IGN in place.
signal.signal(signal.SIGINT, signal.default_int_handler)
import sys, threading, time
sys.path.insert(0, sys.argv[2])
import rdzv

admin = rdzv.Admin(sys.argv[1])
# The handle's first watch call returns the status at once; made here, so that the watch the
# parent interrupts is one that waits for a change.
admin.watch_next(30)
first_done = threading.Event()
first_workers = []

def announce():  # tells the parent once the watch for the next change is under way
    first_done.wait(30)
    deadline = time.monotonic() + 30
    while not any(t.name == "rdzv-admin-watch" and t.is_alive() and t not in first_workers
                  for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)
    print("blocked", flush=True)

threading.Thread(target=announce, daemon=True).start()
try:
    for status in admin.watch():
        first_workers.extend(t for t in threading.enumerate() if t.name == "rdzv-admin-watch")
        first_done.set()
    print("ended", flush=True)
except KeyboardInterrupt:
    # The watch was cancelled, not left running: another watch call on the handle works.
    print("interrupted", admin.watch_next(0.2), flush=True)
admin.close()
"""


def test_real_sigint_ends_a_watch(etcd, run_id):
    proc = subprocess.Popen([sys.executable, "-c", WATCHER, etcd.url(run_id), str(PKG_ROOT)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=dies_with_this_process(signal.SIGINT))
    reader = ThreadPoolExecutor(1)
    try:
        assert reader.submit(proc.stdout.readline).result(timeout=T).strip() == "blocked"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        # Nothing changes in the run: without Ctrl-C support the watch would never end.
        out, err = proc.communicate(timeout=T)
        assert proc.returncode == 0, err
        assert out.strip() == "interrupted None", (out, err)
        assert time.monotonic() - t0 < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=T)
        reader.shutdown()  # after the kill: a readline still waiting sees the end of the output
