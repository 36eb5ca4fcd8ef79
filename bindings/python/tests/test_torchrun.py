"""Unmodified ``torchrun --rdzv-backend=etcd-v3`` with real PyTorch: the backend is found
through the ``torchrun.handlers`` entry point of the installed package, nodes are torchrun
processes, workers run gloo collectives. Runs in the environment made by
``scripts/torch-env.sh``; skipped only where torch is missing (a missing entry point fails)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

try:
    import torch  # noqa: F401
    import torch.distributed as dist
except ImportError:
    pytest.skip(
        "PyTorch is not installed in this Python; scripts/test.sh runs these tests in the "
        "environment scripts/torch-env.sh makes",
        allow_module_level=True,
    )

from conftest import PKG_ROOT, dies_with_this_process, free_port, wait_until  # noqa: E402

WORKER = Path(__file__).resolve().parent / "torch_workers" / "allreduce.py"
FAIL_ONE = WORKER.with_name("fail_one.py")  # plain Python: one worker exits 7, the others wait
TORCHRUN = Path(sys.executable).parent / "torchrun"
T = 180  # seconds: torch imports are slow on a loaded 2-core machine

# What torchrun logs (at ERROR, which it prints by default) when the backend fails in a place
# where it does not change the exit status: the exit barrier on our store, and shutdown.
QUIET_FAILURES = ("Traceback", "Error waiting on exit barrier", "Error shutting down rendezvous")


def test_the_entry_point_is_rdzv():
    found = [ep for ep in metadata.entry_points(group="torchrun.handlers") if ep.name == "etcd-v3"]
    assert found, "rdzv is not installed next to torch (scripts/torch-env.sh installs it)"
    (ep,) = found
    assert ep.value == "rdzv.torch_backend:create_handler"
    assert ep.load()() is ep.load()  # torch calls it with no argument and registers the result


class Nodes:
    """torchrun processes of one run, each leading a process group of its own and logging to a
    file; the ones still running at the end of the test are killed with their workers."""

    def __init__(self, etcd, run_id: str, results: Path, backend: str = "etcd-v3",
                 endpoint: str | None = None):
        self.etcd, self.run_id, self.results = etcd, run_id, results
        self.backend, self.endpoint = backend, endpoint or etcd.endpoint
        self.procs: list[subprocess.Popen] = []
        results.mkdir(parents=True, exist_ok=True)

    def start(self, nnodes, *, wait_unless=None, conf="", worker=WORKER,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        # The agents import rdzv from this checkout (the entry point only names the module).
        env = dict(os.environ, RESULT_DIR=str(self.results), OMP_NUM_THREADS="1",
                   PYTHONPATH=str(PKG_ROOT), **(env or {}))
        if wait_unless:
            env["WAIT_UNLESS_WORLD"] = str(wait_unless)
        args = [
            str(TORCHRUN),
            f"--nnodes={nnodes}",
            "--nproc-per-node=2",
            f"--rdzv-backend={self.backend}",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={self.run_id}",
            "--local-addr=127.0.0.1",
            *([f"--rdzv-conf={conf}"] if conf else []),
            "--max-restarts=0",
            "--monitor-interval=0.5",
            str(worker),
        ]
        log = self.results / f"node{len(self.procs)}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(args, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=dies_with_this_process())
        proc.log = log
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen) -> str:
        """Waits for a node to exit; it must succeed without logging a failure."""
        try:
            proc.wait(timeout=T)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            pytest.fail(f"torchrun did not finish within {T} s:\n{self.output(proc)}")
        out = self.output(proc)
        assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{out}"
        for failure in QUIET_FAILURES:
            assert failure not in out, out
        return out

    def kill(self, proc: subprocess.Popen) -> list[int]:
        """SIGKILLs a node: its agent (and its process group) and its workers, which torch
        starts in process groups of their own; returns the workers' pids once they are gone."""
        workers = [r["pid"] for r in records(self.results)
                   if r["agent"] == proc.pid and running(r["pid"])]
        os.killpg(proc.pid, signal.SIGKILL)  # the agent first: it must not see its workers die
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=T)
        wait_until(lambda: not any(map(running, workers)), T, "the killed workers to exit")
        return workers

    @staticmethod
    def output(proc: subprocess.Popen) -> str:
        return proc.log.read_text(errors="replace")[-6000:]

    def cleanup(self) -> None:
        (self.results / "release").touch()  # workers still holding a round exit
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)


@pytest.fixture
def nodes(etcd, run_id, tmp_path):
    launched = Nodes(etcd, run_id, tmp_path)
    try:
        yield launched
    finally:
        launched.cleanup()


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def records(results: Path, world: int | None = None):
    found = [json.loads(p.read_text()) for p in results.glob("[0-9]*-*.json")]
    return [r for r in found if world is None or r["world"] == world]


def assert_one_world(recs, world):
    assert sorted(r["rank"] for r in recs) == list(range(world)), recs
    assert all(r["ok"] and r["sum"] == world * (world + 1) / 2 for r in recs), recs
    assert all(r["WORLD_SIZE"] == str(world) for r in recs), recs
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in recs}) == 1, recs


def assert_run_deleted(etcd, run_id):
    # Every agent's shutdown reached rdzv, and the last one deleted the run's keys.
    assert etcd.keys(f"/rdzv/{run_id}/") == []


def test_two_nodes_of_two_workers_all_reduce(etcd, run_id, nodes):
    started = [nodes.start(2) for _ in range(2)]
    for n in started:
        nodes.finish(n)
    recs = records(nodes.results)
    assert_one_world(recs, 4)
    assert sorted(r["GROUP_RANK"] for r in recs) == ["0", "0", "1", "1"]
    assert {r["agent"] for r in recs} == {n.pid for n in started}  # 2 workers on each node
    assert_run_deleted(etcd, run_id)


def test_elastic_grow_restarts_into_a_bigger_world(etcd, run_id, nodes):
    conf = "last_call_timeout=1"
    first = nodes.start("1:2", wait_unless=4, conf=conf)
    # The first node forms a world of 2 alone; its workers hold it open until the agent
    # replaces them, which it does when the second node is counted as waiting.
    wait_until(lambda: len(records(nodes.results, 2)) == 2, T, "the 2-rank world")
    second = nodes.start("1:2", wait_unless=4, conf=conf)
    nodes.finish(second)
    nodes.finish(first)
    assert_one_world(records(nodes.results, 2), 2)
    grown = records(nodes.results, 4)
    assert_one_world(grown, 4)
    assert {r["agent"] for r in grown} == {first.pid, second.pid}
    assert_run_deleted(etcd, run_id)


def test_node_loss_the_survivor_reforms_alone(etcd, run_id, nodes):
    conf = "last_call_timeout=1,lease_ttl=3"
    # No restarts allowed: a re-forms only because it counts b as lost (membership changes do
    # not use restarts), never because its workers gave up holding the round (they exit 4).
    a = nodes.start("1:2", wait_unless=2, conf=conf)
    b = nodes.start("1:2", wait_unless=2, conf=conf)
    wait_until(lambda: len(records(nodes.results, 4)) == 4, T, "the 4-rank world")
    killed = nodes.kill(b)  # no goodbye: b's lease expires and a counts it as lost
    assert len(killed) == 2
    nodes.finish(a)
    assert_one_world(records(nodes.results, 4), 4)
    alone = records(nodes.results, 2)
    assert_one_world(alone, 2)
    assert {r["agent"] for r in alone} == {a.pid}
    assert_run_deleted(etcd, run_id)


def test_a_drained_node_exits_0_and_the_other_reforms_alone(etcd, run_id, nodes):
    import rdzv

    # As for a lost node: no restarts allowed, so a re-forms only through the drain.
    conf = "last_call_timeout=1"
    a = nodes.start("1:2", wait_unless=2, conf=conf)
    b = nodes.start("1:2", wait_unless=2, conf=conf)
    wait_until(lambda: len(records(nodes.results, 4)) == 4, T, "the 4-rank world")
    (group,) = {int(r["GROUP_RANK"]) for r in records(nodes.results, 4) if r["agent"] == b.pid}
    with rdzv.Admin(etcd.url(run_id)) as admin:
        (member,) = [m for m in admin.status().members if m.rank == group]
        admin.drain(member.node_id, "maintenance")
    # torch's agent turns RendezvousGracefulExitError into an AttributeError in its launcher
    # (exit 1); the backend's GracefulExit makes the drained torchrun exit 0 instead.
    out = nodes.finish(b)
    assert "AttributeError" not in out, out
    assert "was drained" in out and "this torchrun exits 0" in out, out
    nodes.finish(a)
    alone = records(nodes.results, 2)
    assert_one_world(alone, 2)
    assert {r["agent"] for r in alone} == {a.pid}
    assert_run_deleted(etcd, run_id)


def exits(procs: list[subprocess.Popen], timeout: float) -> dict[int, float]:
    """Waits for the processes to exit, at most ``timeout`` seconds; returns when (``time.time``)
    each was seen gone, by pid. Fails the test with their output at the deadline."""
    seen: dict[int, float] = {}

    def all_gone() -> bool:
        for p in procs:
            if p.pid not in seen and p.poll() is not None:
                seen[p.pid] = time.time()
        return len(seen) == len(procs)

    deadline = time.monotonic() + timeout
    while not all_gone():
        if time.monotonic() > deadline:
            logs = "\n---\n".join(Nodes.output(p) for p in procs if p.pid not in seen)
            pytest.fail(f"torchrun still running after {timeout} s:\n{logs}")
        time.sleep(0.02)  # the poll of a child's exit; the deadline bounds it
    return seen


JOIN_TIMEOUT = 5  # seconds


def test_an_explicit_join_timeout_wins_over_torchruns_timeout(etcd, run_id, nodes):
    # torchrun adds timeout=900 to every rendezvous config that names no `timeout`, after the
    # user's --rdzv-conf options: the user's join_timeout must still be the one that counts.
    alone = nodes.start(2, conf=f"join_timeout={JOIN_TIMEOUT}")
    join = f"/rdzv/{run_id}/r/{0:020}/join/"
    wait_until(lambda: etcd.keys(join) or alone.poll() is not None, T, "the node to join",
               interval=0.1)
    joined = time.time()
    waited = exits([alone], JOIN_TIMEOUT + 60)[alone.pid] - joined  # 900 s before the fix
    out = Nodes.output(alone)
    assert alone.returncode != 0, out
    assert "RendezvousTimeoutError" in out and f"join_timeout={JOIN_TIMEOUT} s" in out, out
    assert JOIN_TIMEOUT - 0.5 <= waited <= JOIN_TIMEOUT + 20, (waited, out)


HEALTHY_EXIT = 10  # seconds from the failed worker's exit to the healthy node's torchrun's exit
HOLD = 20  # seconds the c10d comparison's workers wait before they give up (exit 4)


def test_a_job_that_fails_on_one_node_fails_on_every_node(etcd, run_id, nodes, tmp_path):
    # One node's worker exits 7 with no restart left; the other node's workers are healthy and
    # would wait 120 s. The failing node's shutdown closes the run, so the healthy node's agent,
    # which sees it lost and re-rendezvouses, ends at once instead of waiting join_timeout
    # (300 s here, torchrun's 900 by default) for a node that will not come back.
    import rdzv

    conf = "join_timeout=300"
    healthy = nodes.start(2, conf=conf, worker=FAIL_ONE)
    failing = nodes.start(2, conf=conf, worker=FAIL_ONE, env={"FAIL_LOCAL_RANK": "0"})
    failed = nodes.results / "failed"
    wait_until(lambda: failed.exists() or failing.poll() is not None, T, "the worker to fail")
    assert failed.exists(), Nodes.output(failing)
    gone = exits([healthy, failing], 3 * HEALTHY_EXIT)
    failed_at = float(failed.read_text())
    out_healthy, out_failing = Nodes.output(healthy), Nodes.output(failing)
    assert failing.returncode == 1 and "exitcode  : 7" in out_failing, out_failing
    assert "closing run" in out_failing, out_failing
    assert healthy.returncode == 1 and "RendezvousClosedError" in out_healthy, out_healthy
    assert "exitcode  : 4" not in out_healthy, out_healthy  # its workers did not give up
    healthy_after = gone[healthy.pid] - failed_at
    assert 0 < healthy_after <= HEALTHY_EXIT, (healthy_after, out_healthy)
    with rdzv.Admin(etcd.url(run_id)) as admin:
        assert admin.status().closed

    # torch's c10d backend, the same workers, the failing node not the store's host: its
    # shutdown closes the rendezvous too, but a running agent asks c10d only how many nodes
    # wait to join, so the healthy node goes on until its own workers give up (HOLD).
    c10d = Nodes(etcd, run_id, tmp_path / "c10d", backend="c10d",
                 endpoint=f"127.0.0.1:{free_port()}")
    try:
        hold = {"HOLD_SECONDS": str(HOLD)}
        c10d_healthy = c10d.start(2, conf="is_host=1", worker=FAIL_ONE, env=hold)
        c10d_failing = c10d.start(2, conf="is_host=0", worker=FAIL_ONE,
                                  env={"FAIL_LOCAL_RANK": "0", **hold})
        c10d_gone = exits([c10d_healthy, c10d_failing], T + HOLD)
    finally:
        c10d.cleanup()
    out = Nodes.output(c10d_healthy)
    c10d_after = c10d_gone[c10d_healthy.pid] - float((c10d.results / "failed").read_text())
    assert c10d_healthy.returncode == 1 and "exitcode  : 4" in out, out
    assert c10d_failing.returncode == 1, Nodes.output(c10d_failing)
    print(f"the healthy node exits {healthy_after:.2f} s after the failed worker on etcd-v3, "
          f"{c10d_after:.2f} s on c10d (when its workers give up, after {HOLD} s)")
    assert c10d_after > healthy_after


def test_a_node_stopped_by_sigterm_leaves_the_run_open(etcd, run_id, nodes):
    # torch's launcher does not shut the handler down on a signal; the run must stay open and
    # the other node re-form alone once the stopped node's lease expires (no restart spent).
    conf = "last_call_timeout=1,lease_ttl=3"
    a = nodes.start("1:2", wait_unless=2, conf=conf)
    b = nodes.start("1:2", wait_unless=2, conf=conf)
    wait_until(lambda: len(records(nodes.results, 4)) == 4, T, "the 4-rank world")
    os.kill(b.pid, signal.SIGTERM)
    exits([b], T)
    assert b.returncode != 0, Nodes.output(b)
    nodes.finish(a)
    alone = records(nodes.results, 2)
    assert_one_world(alone, 2)
    assert {r["agent"] for r in alone} == {a.pid}
    assert_run_deleted(etcd, run_id)


STORE_WORKER = """
import datetime, sys, torch, torch.distributed as dist
from rdzv import torch_backend
from torch.distributed.elastic.rendezvous import RendezvousParameters
params = RendezvousParameters("etcd-v3", sys.argv[1], sys.argv[2], int(sys.argv[3]),
                              int(sys.argv[3]), timeout=120, local_addr="127.0.0.1")
handler = torch_backend.create_handler(params)
info = handler.next_rendezvous()
assert isinstance(info.store, dist.Store)
dist.init_process_group("gloo", store=info.store, rank=info.rank, world_size=info.world_size,
                        timeout=datetime.timedelta(seconds=120))
t = torch.tensor([float(info.rank + 1)])
dist.all_reduce(t)
dist.barrier()
print(info.rank, dist.get_world_size(), t.item(), flush=True)
dist.destroy_process_group()
assert handler.shutdown()
"""


def test_the_rdzv_store_initializes_a_process_group(etcd, run_id):
    world = 3
    procs = [
        subprocess.Popen([sys.executable, "-c", STORE_WORKER, etcd.endpoint, run_id, str(world)],
                         env=dict(os.environ, PYTHONPATH=str(PKG_ROOT)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=dies_with_this_process())
        for _ in range(world)
    ]
    lines = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=T)
            assert p.returncode == 0, out[-4000:]
            lines.append(out.strip().splitlines()[-1].split())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sorted(int(rank) for rank, _, _ in lines) == list(range(world))
    expected = sum(range(1, world + 1))
    assert all(int(w) == world and float(s) == expected for _, w, s in lines), lines
    assert_run_deleted(etcd, run_id)


def test_gloo_is_available():
    assert dist.is_available() and dist.is_gloo_available()
