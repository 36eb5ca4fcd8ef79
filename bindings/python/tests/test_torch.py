"""The torchrun backend with the real torch, in the environment scripts/torch-env.sh makes
(skipped where torch is not installed)."""

from __future__ import annotations

import datetime
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

try:
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from torch.distributed.elastic.rendezvous import RendezvousParameters as TorchParameters
    from torch.distributed.elastic.rendezvous import api
except ImportError:
    pytest.skip(
        "PyTorch is not installed in this Python; scripts/test.sh runs these tests in the "
        "environment scripts/torch-env.sh makes",
        allow_module_level=True,
    )

import rdzv  # noqa: E402
from conftest import wait_until  # noqa: E402
from rdzv import torch_backend  # noqa: E402


def torch_params(etcd, run_id, min_nodes, max_nodes, **config):
    config.setdefault("timeout", 30)  # torchrun always passes its join timeout as "timeout"
    return TorchParameters("etcd-v3", etcd.endpoint, run_id, min_nodes, max_nodes,
                           local_addr="127.0.0.1", **config)


def test_torch_is_detected():
    assert torch_backend.TORCH_AVAILABLE


def test_entry_point_returns_the_creator():
    assert torch_backend.create_handler() is torch_backend.create_handler


def test_handler_and_store_are_torch_types(etcd, run_id):
    params = torch_params(etcd, run_id, 1, 1, is_host=True, read_timeout=60)
    handler = torch_backend.create_handler(params)
    try:
        assert isinstance(handler, api.RendezvousHandler)
        assert handler.get_backend() == "etcd-v3" and handler.get_run_id() == run_id
        assert handler.use_agent_store is False
        info = handler.next_rendezvous()
        if hasattr(api, "RendezvousInfo"):
            assert isinstance(info, api.RendezvousInfo)
            store, rank, world_size = info.store, info.rank, info.world_size
            assert isinstance(info.bootstrap_store_info, api.RendezvousStoreInfo)
            assert info.bootstrap_store_info.master_addr == "127.0.0.1"
            assert info.bootstrap_store_info.master_port > 0
        else:
            store, rank, world_size = info
        assert (rank, world_size) == (0, 1)
        assert isinstance(store, dist.Store)
        store.set("k", "v")
        assert store.get("k") == b"v"
        assert store.add("n", 2) == 2
        assert store.compare_set("k", b"v", b"w") == b"w"
        assert store.check(["k"]) and store.num_keys() >= 2
        store.multi_set(["a", "b"], [b"1", b"2"])
        assert store.multi_get(["a", "b"]) == [b"1", b"2"]
        assert store.delete_key("a") is True
        # Through C++: PrefixStore calls back into the Python methods (c10d trampoline).
        prefixed = dist.PrefixStore("p", store)
        prefixed.set("x", b"1")
        assert prefixed.get("x") == b"1"
        assert store.get("p/x") == b"1"
        assert prefixed.add("c", 3) == 3
        prefixed.wait(["x"])
        assert prefixed.num_keys() >= 1
        store.set_timeout(datetime.timedelta(milliseconds=200))
        with pytest.raises(rdzv.RendezvousTimeoutError) as timeout_info:
            store.get("absent")
        assert isinstance(timeout_info.value, RuntimeError)  # DistStoreError where torch has it
    finally:
        assert handler.shutdown() is True
        handler.close()


def test_cpp_callers_reach_every_store_method(etcd, run_id):
    # c10d's C++ code (PrefixStore here; init_process_group and gloo in a job) calls a Python
    # store through a trampoline, by names of its own for some methods (deleteKey, getNumKeys).
    handler = torch_backend.create_handler(torch_params(etcd, run_id, 1, 1))
    try:
        store = handler.next_rendezvous().store
        before = store.num_keys()
        p = dist.PrefixStore("p", store)
        p.set("a", "1")
        assert p.get("a") == b"1" and store.get("p/a") == b"1"
        assert p.add("n", 5) == 5 and p.add("n", -2) == 3
        assert p.check(["a", "n"]) and not p.check(["absent"])
        assert p.compare_set("a", "1", "2") == b"2"
        assert p.compare_set("a", "1", "3") == b"2"  # no match: the current value
        assert p.compare_set("new", "", "x") == b"x"
        p.multi_set(["m1", "m2"], ["v1", "v2"])
        assert p.multi_get(["m1", "m2"]) == [b"v1", b"v2"]
        p.append("log", "a")  # c10d's fallback: a compare_set loop
        p.append("log", "b")
        assert p.get("log") == b"ab"
        assert p.num_keys() == before + 6  # a, n, new, m1, m2, log
        assert p.delete_key("a") is True and p.delete_key("a") is False
        assert not store.check(["p/a"])
        p.wait(["n"])
        p.wait(["n"], datetime.timedelta(seconds=5))
        assert p.clone().get("n") == b"3"
        assert p.has_extended_api() is False
    finally:
        handler.close()


def test_a_timeout_set_from_cpp_bounds_get_and_wait(etcd, run_id):
    # PrefixStore.set_timeout (like any C++ caller) sets the c10d base's timeout, never our
    # Python set_timeout: get, wait and multi_get without a timeout must use it. The run's own
    # store timeout is 60 s, so a store that ignored it would fail the time bound below.
    handler = torch_backend.create_handler(torch_params(etcd, run_id, 1, 1, store_timeout=60))
    try:
        store = handler.next_rendezvous().store
        assert store.timeout == datetime.timedelta(seconds=60)
        p = dist.PrefixStore("p", store)
        p.set_timeout(datetime.timedelta(milliseconds=300))
        assert store.timeout == p.timeout == datetime.timedelta(milliseconds=300)
        for call in (lambda: p.get("absent"), lambda: p.wait(["absent"]),
                     lambda: p.multi_get(["absent"]), lambda: store.get("absent")):
            start = time.monotonic()
            with pytest.raises(dist.DistStoreError):
                call()
            assert time.monotonic() - start < 20
        store.set_timeout(datetime.timedelta(seconds=7))  # and the other way round
        assert p.timeout == datetime.timedelta(seconds=7)
    finally:
        handler.close()


def test_registered_backend(etcd, run_id):
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    torch_backend.register()  # what the entry point does when the package is installed
    handler = get_rendezvous_handler(torch_params(etcd, run_id, 1, 1))
    try:
        assert isinstance(handler, torch_backend.TorchEtcdV3RendezvousHandler)
    finally:
        handler.close()


def test_errors_are_torch_errors(etcd, run_id):
    handler = torch_backend.create_handler(torch_params(etcd, run_id, 2, 2, timeout=1))
    try:
        with pytest.raises(api.RendezvousTimeoutError) as info:
            handler.next_rendezvous()
        assert isinstance(info.value, rdzv.RendezvousTimeoutError)
    finally:
        handler.close()
    with pytest.raises(api.RendezvousError):
        torch_backend.create_handler(torch_params(etcd, run_id, 1, 1, no_such_option=1))


def test_shutdown_releases_the_node_without_closing_the_run(etcd, run_id):
    a = torch_backend.create_handler(torch_params(etcd, run_id, 1, 2))
    b = torch_backend.create_handler(torch_params(etcd, run_id, 1, 2, last_call_timeout=0.5))
    try:
        assert a.shutdown() is True
        assert not b.is_closed()
        assert b.next_rendezvous().world_size == 1  # b alone still forms a round
    finally:
        a.close()
        b.close()


def test_join_timeout_wins_over_torchruns_timeout(etcd, run_id):
    # torchrun's config puts `timeout` last (900 s; less here, so that a fault fails in time).
    handler = torch_backend.create_handler(torch_params(etcd, run_id, 2, 2, join_timeout="1",
                                                        timeout=40))
    try:
        start = time.monotonic()
        with pytest.raises(api.RendezvousTimeoutError, match="join_timeout=1 s"):
            handler.next_rendezvous()
        assert time.monotonic() - start < 20
    finally:
        handler.close()


def launcher_shutdown(handler, error: BaseException) -> None:
    """What torch's ``launch_agent`` does: ``shutdown()`` in the ``finally`` of a ``try`` that
    ends with ``error``."""
    with pytest.raises(type(error)):
        try:
            raise error
        finally:
            assert handler.shutdown() is True


def failed_job() -> ChildFailedError:
    return ChildFailedError("train.py", {0: ProcessFailure(0, 12345, 7, "")})


def formed_pair(etcd, run_id):
    a, b = (torch_backend.create_handler(torch_params(etcd, run_id, 2, 2)) for _ in range(2))
    with ThreadPoolExecutor(2) as pool:
        for info in pool.map(lambda h: h.next_rendezvous(), (a, b)):
            assert info.world_size == 2
    return a, b


def test_shutdown_closes_the_run_when_the_launcher_fails_the_job(etcd, run_id):
    # Workers failed with no restart left: torch's launcher raises ChildFailedError and shuts
    # the handler down; the other node must find the run closed, not wait for this one.
    a, b = formed_pair(etcd, run_id)
    try:
        launcher_shutdown(a, failed_job())
        assert b.is_closed()
        start = time.monotonic()
        with pytest.raises(api.RendezvousClosedError):
            b.next_rendezvous()
        assert time.monotonic() - start < 20  # join_timeout is 30
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("error", [
    api.RendezvousTimeoutError("a failed join"),
    KeyboardInterrupt(),  # Ctrl-C before the workers start (later, torch skips shutdown)
    torch_backend.GracefulExit(rdzv.RendezvousGracefulExitError("drained")),
    RuntimeError("anything else"),
], ids=["timeout", "ctrl-c", "drained", "other"])
def test_shutdown_leaves_the_run_open_unless_the_job_failed(etcd, run_id, error):
    a, b = formed_pair(etcd, run_id)
    try:
        launcher_shutdown(a, error)
        assert not b.is_closed()
    finally:
        a.close()
        b.close()


def test_a_failure_while_a_member_is_lost_leaves_the_run_open(etcd, run_id):
    # A drained (or dead) member explains the failure: the others re-form without both.
    a, b = formed_pair(etcd, run_id)
    c = torch_backend.create_handler(torch_params(etcd, run_id, 1, 2))
    try:
        b.drain("maintenance")
        wait_until(lambda: a.num_nodes_lost() == 1, 10, "the drain to count as a loss")
        launcher_shutdown(a, failed_job())
        assert not c.is_closed()
    finally:
        for h in (a, b, c):
            h.close()


def test_a_drained_node_gets_a_system_exit_of_status_0(etcd, run_id):
    # torch's agent turns RendezvousGracefulExitError into an AttributeError in its launcher;
    # a SystemExit(0) passes its `except Exception` clauses and ends torchrun with 0.
    handler = torch_backend.create_handler(torch_params(etcd, run_id, 1, 1))
    try:
        assert handler.next_rendezvous().world_size == 1
        handler.drain("maintenance")
        with pytest.raises(torch_backend.GracefulExit) as info:
            handler.next_rendezvous()
        assert info.value.code == 0
        assert not isinstance(info.value, Exception)  # past torch's `except Exception`
        assert isinstance(info.value.error, rdzv.RendezvousGracefulExitError)
        assert "maintenance" in str(info.value.error)
    finally:
        handler.close()


# rdzv.launch with torch's own LaunchConfig and ChildFailedError (test_launch.py: without torch)


def _launched_rank_and_world():
    import os

    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def _launched_rank_1_raises():
    import os

    if os.environ["RANK"] == "1":
        raise KeyError("no such shard")
    return "ok"


def test_rdzv_launch_takes_torchs_launch_config_and_raises_torchs_child_failed_error():
    from torch.distributed.launcher.api import LaunchConfig

    from rdzv.launch import elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", max_restarts=0)
    assert elastic_launch(config, _launched_rank_and_world)() == {0: (0, 2), 1: (1, 2)}
    with pytest.raises(ChildFailedError) as caught:
        elastic_launch(config, _launched_rank_1_raises)()
    failure = caught.value.failures[1]
    assert isinstance(failure, ProcessFailure)
    assert failure.exitcode == 1
    # torch's ProcessFailure keeps the error file's message object as it is.
    assert failure.message["message"] == "KeyError: 'no such shard'", failure.message
    assert "_launched_rank_1_raises FAILED" in str(caught.value)


def test_rdzv_launchs_events_and_metrics_reach_torchs_own_record_and_put_metric(monkeypatch):
    """What a program configured for torch's agent (its events handler, its metrics handler)
    gets from rdzv.launch: the job's events as torch Events through ``events.record``, its
    metrics through ``metrics.put_metric``."""
    import torch.distributed.elastic.events as torch_events
    import torch.distributed.elastic.metrics as torch_metrics
    from torch.distributed.launcher.api import LaunchConfig

    from rdzv.launch import elastic_launch

    recorded, put = [], []
    monkeypatch.setattr(torch_events, "record", lambda event, *a, **k: recorded.append(event))
    monkeypatch.setattr(torch_metrics, "put_metric",
                        lambda name, value, group="torchelastic": put.append((group, name, value)))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", max_restarts=0)
    assert elastic_launch(config, _launched_rank_and_world)() == {0: (0, 2), 1: (1, 2)}
    assert all(isinstance(e, torch_events.Event) for e in recorded)
    workers = [e for e in recorded if e.source == torch_events.EventSource.WORKER]
    assert sorted(e.metadata["global_rank"] for e in workers) == [0, 1]
    assert all(e.name == "torchelastic.worker.status.SUCCEEDED" for e in workers)
    assert ("torchelastic", "workers.default_role.run_success_no_retries", 1) in put, put
