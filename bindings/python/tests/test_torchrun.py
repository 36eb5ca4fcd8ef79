"""Unmodified ``torchrun --rdzv-backend=etcd-v3`` with real PyTorch: the backend is found
through the ``torchrun.handlers`` entry point of the installed package, nodes are torchrun
processes, workers run gloo collectives. Runs in the environment made by
``scripts/torch-env.sh`` (skipped where torch or the installed package is missing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from conftest import PKG_ROOT, wait_until  # noqa: E402

WORKER = Path(__file__).resolve().parent / "torch_workers" / "allreduce.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
T = 180  # seconds: torch imports are slow on a loaded 2-core machine


def entry_point():
    found = [ep for ep in metadata.entry_points(group="torchrun.handlers") if ep.name == "etcd-v3"]
    return found[0] if found else None


pytestmark = pytest.mark.skipif(
    entry_point() is None or not TORCHRUN.exists(),
    reason="rdzv is not installed next to torch (run scripts/torch-env.sh)",
)


def test_the_entry_point_is_rdzv():
    ep = entry_point()
    assert ep.value == "rdzv.torch_backend:create_handler"
    assert ep.load()() is ep.load()  # torch calls it with no argument and registers the result


def torchrun(etcd, run_id, nnodes, nproc, results, *, wait_unless=None, conf="", restarts=0):
    # The agents import rdzv from this checkout (the entry point only names the module).
    env = dict(os.environ, RESULT_DIR=str(results), OMP_NUM_THREADS="1", PYTHONPATH=str(PKG_ROOT))
    if wait_unless:
        env["WAIT_UNLESS_WORLD"] = str(wait_unless)
    args = [
        str(TORCHRUN),
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=etcd-v3",
        f"--rdzv-endpoint={etcd.endpoint}",
        f"--rdzv-id={run_id}",
        "--local-addr=127.0.0.1",
        *([f"--rdzv-conf={conf}"] if conf else []),
        f"--max-restarts={restarts}",
        "--monitor-interval=0.5",
        str(WORKER),
    ]
    # A session of its own, so a test can kill the agent and its workers together.
    return subprocess.Popen(args, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc) -> str:
    try:
        out, _ = proc.communicate(timeout=T)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {T} s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{out[-4000:]}"
    return out


def records(results: Path, world: int | None = None):
    found = [json.loads(p.read_text()) for p in results.glob("[0-9]*-*.json")]
    return [r for r in found if world is None or r["world"] == world]


def assert_one_world(recs, world):
    assert sorted(r["rank"] for r in recs) == list(range(world)), recs
    assert all(r["ok"] and r["sum"] == world * (world + 1) / 2 for r in recs), recs
    assert all(r["WORLD_SIZE"] == str(world) for r in recs), recs
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in recs}) == 1, recs


def test_two_nodes_of_two_workers_all_reduce(etcd, run_id, tmp_path):
    nodes = [torchrun(etcd, run_id, 2, 2, tmp_path) for _ in range(2)]
    for n in nodes:
        finish(n)
    recs = records(tmp_path)
    assert_one_world(recs, 4)
    assert sorted(r["GROUP_RANK"] for r in recs) == ["0", "0", "1", "1"]


def test_elastic_grow_restarts_into_a_bigger_world(etcd, run_id, tmp_path):
    conf = "last_call_timeout=1"
    first = torchrun(etcd, run_id, "1:2", 2, tmp_path, wait_unless=4, conf=conf)
    try:
        # The first node forms a world of 2 alone and its workers hold it open.
        wait_until(lambda: len(records(tmp_path, 2)) == 2, T, "the 2-rank world")
        second = torchrun(etcd, run_id, "1:2", 2, tmp_path, wait_unless=4, conf=conf)
        finish(second)
        finish(first)
    finally:
        (tmp_path / "release").touch()
        for p in (first,):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert_one_world(records(tmp_path, 2), 2)
    assert_one_world(records(tmp_path, 4), 4)


def test_node_loss_the_survivor_reforms_alone(etcd, run_id, tmp_path):
    conf = "last_call_timeout=1,lease_ttl=3"
    a = torchrun(etcd, run_id, "1:2", 2, tmp_path, wait_unless=2, conf=conf, restarts=2)
    b = torchrun(etcd, run_id, "1:2", 2, tmp_path, wait_unless=2, conf=conf, restarts=2)
    try:
        wait_until(lambda: len(records(tmp_path, 4)) == 4, T, "the 4-rank world")
        os.killpg(b.pid, signal.SIGKILL)  # the agent and its workers, no goodbye
        b.wait(timeout=T)
        finish(a)
    finally:
        (tmp_path / "release").touch()
        for p in (a, b):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert_one_world(records(tmp_path, 4), 4)
    assert_one_world(records(tmp_path, 2), 2)


STORE_WORKER = """
import sys, torch, torch.distributed as dist
from rdzv import torch_backend
from torch.distributed.elastic.rendezvous import RendezvousParameters
params = RendezvousParameters("etcd-v3", sys.argv[1], sys.argv[2], 3, 3, timeout=120,
                              local_addr="127.0.0.1")
handler = torch_backend.create_handler(params)
info = handler.next_rendezvous()
store, rank, world = (info.store, info.rank, info.world_size) if hasattr(info, "store") else info
assert isinstance(store, dist.Store)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(rank, world, t.item(), flush=True)
dist.destroy_process_group()
handler.shutdown()
"""


def test_the_rdzv_store_initializes_a_process_group(etcd, run_id):
    procs = [
        subprocess.Popen([sys.executable, "-c", STORE_WORKER, etcd.endpoint, run_id],
                         env=dict(os.environ, PYTHONPATH=str(PKG_ROOT)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(3)
    ]
    lines = []
    for p in procs:
        out, _ = p.communicate(timeout=T)
        assert p.returncode == 0, out[-4000:]
        lines.append(out.strip().splitlines()[-1].split())
    assert sorted(int(r) for r, _, _ in lines) == [0, 1, 2]
    assert all((w, s) == ("3", "6.0") for _, w, s in lines), lines


def test_dist_is_available():
    assert dist.is_available() and dist.is_gloo_available()
