"""``rdzv.launch``: torch's ``elastic_launch`` on rdzv's agent. Real ``rdzv run`` processes
(the checkout's build), real workers, a real etcd for the two-node job; functions that return,
raise, exit and die by a signal. (With torch's own ``LaunchConfig`` and ``ChildFailedError``:
test_torch.py.)"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from rdzv import launch
from rdzv.launch import LaunchConfig, LaunchError, elastic_launch

# The workers' functions: module-level, so that a worker imports them by name.


def rank_times(x):
    return {"value": int(os.environ["RANK"]) * x, "world": int(os.environ["WORLD_SIZE"]),
            "pid": os.getpid()}


def rank_1_raises(x):
    if os.environ["RANK"] == "1":
        raise ValueError(f"bad input {x}")
    return x


def rank_0_segfaults():
    if os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGSEGV)
    return "alive"


def one_node(nproc: int = 2, **fields) -> LaunchConfig:
    fields.setdefault("max_restarts", 0)
    return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, rdzv_backend="c10d",
                        rdzv_endpoint="localhost:0", **fields)


def test_a_function_returns_each_ranks_value_by_global_rank():
    values = elastic_launch(one_node(), rank_times)(10)
    assert sorted(values) == [0, 1]
    assert [values[r]["value"] for r in (0, 1)] == [0, 10]
    assert {values[r]["world"] for r in (0, 1)} == {2}
    assert values[0]["pid"] != values[1]["pid"] != os.getpid(), "each ran in its own worker"


def test_a_function_that_raises_is_a_child_failed_error_naming_the_rank_and_its_error():
    with pytest.raises(launch.ChildFailedError) as caught:
        elastic_launch(one_node(), rank_1_raises)(3)
    e = caught.value
    assert e.name == "rank_1_raises"
    assert sorted(e.failures) == [1], "rank 0 returned; the launcher stopped no one"
    failure = e.failures[1]
    assert (failure.local_rank, failure.exitcode) == (1, 1)
    assert failure.pid > 0
    assert "ValueError: bad input 3" in failure.message
    assert os.path.isfile(failure.error_file), "the error file is kept for the report"


def test_a_worker_killed_by_a_signal_is_torchs_negative_exit_code():
    with pytest.raises(launch.ChildFailedError) as caught:
        elastic_launch(one_node(), rank_0_segfaults)()
    failure = caught.value.failures[0]
    assert failure.exitcode == -signal.SIGSEGV
    assert failure.signal_name() == "SIGSEGV"


def test_a_restart_that_succeeds_returns_the_last_attempts_values(tmp_path):
    marker = tmp_path / "failed-once"
    values = elastic_launch(one_node(max_restarts=1), fails_once)(str(marker))
    assert values == {0: 1, 1: 1}, "both ranks ran again, with restart count 1"


def fails_once(marker):
    if os.environ["RANK"] == "0" and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt")
    return int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def test_a_command_runs_with_its_arguments_and_its_exit_code_is_reported():
    assert elastic_launch(one_node(1), "/bin/sh")("-c", "exit 0") == {0: None}
    with pytest.raises(launch.ChildFailedError) as caught:
        elastic_launch(one_node(1), "/bin/sh")("-c", "exit 3")
    assert caught.value.name == "/bin/sh"
    assert caught.value.failures[0].exitcode == 3


def test_two_nodes_on_etcd_each_get_their_own_workers_values(etcd, run_id):
    config = LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=1, rdzv_backend="etcd-v3",
                          rdzv_endpoint=etcd.endpoint, run_id=run_id, max_restarts=0,
                          rdzv_configs={"join_timeout": 60}, local_addr="127.0.0.1")
    with ThreadPoolExecutor(2) as pool:
        nodes = [pool.submit(elastic_launch(config, rank_times), 5) for _ in range(2)]
        values = [n.result(timeout=120) for n in nodes]
    assert sorted(len(v) for v in values) == [1, 1]
    merged = {rank: v for node in values for rank, v in node.items()}
    assert sorted(merged) == [0, 1], "the two nodes' workers are ranks 0 and 1"
    assert [merged[r]["value"] for r in (0, 1)] == [0, 5]
    assert {merged[r]["world"] for r in (0, 1)} == {2}


def test_a_launch_that_fails_before_its_workers_is_a_launch_error():
    # Two nodes on port 0: refused by rdzv run before any worker starts (status 2).
    config = LaunchConfig(min_nodes=1, max_nodes=2, nproc_per_node=1, rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0")
    with pytest.raises(LaunchError) as caught:
        elastic_launch(config, rank_times)(1)
    assert caught.value.exit_code == 2


def test_the_config_becomes_rdzv_runs_flags_and_bad_fields_are_named():
    config = LaunchConfig(min_nodes=1, max_nodes=4, nproc_per_node=8, run_id="job",
                          rdzv_backend="etcd-v3", rdzv_endpoint="etcd:2379",
                          rdzv_configs={"last_call_timeout": 2, "is_host": False},
                          max_restarts=5, monitor_interval=0.5, local_addr="10.0.0.7",
                          duplicate_stdout_filters=["loss", "step"])
    flags = launch.command_line(config, ["--hang-timeout", "5m"])
    pairs = dict(zip(flags[::2], flags[1::2]))
    assert pairs["--nnodes"] == "1:4"
    assert pairs["--nproc-per-node"] == "8"
    assert pairs["--rdzv-id"] == "job"
    assert pairs["--rdzv-endpoint"] == "etcd:2379"
    assert pairs["--rdzv-conf"] == "last_call_timeout=2,is_host=false,timeout=900"
    assert pairs["--max-restarts"] == "5"
    assert pairs["--monitor-interval"] == "0.5"
    assert pairs["--role"] == "default_role", "torch's LaunchConfig default"
    assert pairs["--duplicate-stdout-filters"] == "loss,step"
    assert flags[-2:] == ["--hang-timeout", "5m"], "rdzv's own flags come last"
    assert "--event-log-handler" not in flags, "defaults are left to rdzv run"
    with pytest.raises(ValueError, match="min_nodes/max_nodes"):
        launch.command_line(LaunchConfig(min_nodes=3, max_nodes=2, nproc_per_node=1))
    with pytest.raises(ValueError, match=r"rdzv_configs\['x'\]"):
        launch.command_line(LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1,
                                         rdzv_configs={"x": "a,b"}))


def test_the_jobs_events_and_metrics_reach_the_handlers_a_program_adds(tmp_path):
    from rdzv import events

    seen, metrics = [], []
    events.add_handler(seen.append)
    events.add_metric_handler(metrics.append)
    try:
        marker = tmp_path / "failed-once"
        elastic_launch(one_node(max_restarts=1), fails_once)(str(marker))
    finally:
        events.remove_handler(seen.append)
        events.remove_metric_handler(metrics.append)
    statuses = [(e.source, e.metadata["state"], e.metadata["global_rank"])
                for e in seen if e.name.startswith("torchelastic.worker.status.")]
    assert ("WORKER", "FAILED", 0) in statuses, statuses
    assert ("WORKER", "SUCCEEDED", 0) in statuses and ("WORKER", "SUCCEEDED", 1) in statuses
    assert statuses[-1] == ("AGENT", "SUCCEEDED", None), statuses
    assert all(e.timestamp > 0 for e in seen)
    assert any(e.name == "rdzv.round.formed" for e in seen)
    last = {m.name: m.value for m in metrics}
    assert last["workers.default_role.run_success_with_retries"] == 1, last
    assert last["workers.default_role.run_total"] == 1
