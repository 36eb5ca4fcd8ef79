"""The torchrun backend with the real torch (skipped when torch is not installed)."""

from __future__ import annotations

import datetime

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.rendezvous import RendezvousParameters as TorchParameters  # noqa: E402
from torch.distributed.elastic.rendezvous import api  # noqa: E402

import rdzv  # noqa: E402
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
