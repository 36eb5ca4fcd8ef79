"""The torchrun backend's plumbing against a minimal stand-in for torch's modules (torch itself
is too large to install here; test_torch.py runs the same checks with the real one)."""

from __future__ import annotations

import abc
import datetime
import importlib
import sys
import types
from dataclasses import dataclass

import pytest

import rdzv


def fake_torch() -> dict[str, types.ModuleType]:
    torch = types.ModuleType("torch")
    dist = types.ModuleType("torch.distributed")
    elastic = types.ModuleType("torch.distributed.elastic")
    rendezvous = types.ModuleType("torch.distributed.elastic.rendezvous")
    api = types.ModuleType("torch.distributed.elastic.rendezvous.api")

    class Store:
        def __init__(self):
            self.base_timeout = None

        def set_timeout(self, timeout):
            self.base_timeout = timeout

    class DistStoreError(RuntimeError):
        pass

    dist.Store, dist.DistStoreError = Store, DistStoreError

    class RendezvousError(Exception):
        pass

    names = ["Closed", "Timeout", "Connection", "State", "GracefulExit"]
    for n in names:
        setattr(api, f"Rendezvous{n}Error", type(f"Rendezvous{n}Error", (RendezvousError,), {}))
    api.RendezvousError = RendezvousError

    class RendezvousHandler(abc.ABC):
        @abc.abstractmethod
        def get_backend(self): ...

        @property
        def use_agent_store(self):
            return False

        @abc.abstractmethod
        def next_rendezvous(self): ...

        @abc.abstractmethod
        def is_closed(self): ...

        @abc.abstractmethod
        def set_closed(self): ...

        @abc.abstractmethod
        def num_nodes_waiting(self): ...

        @abc.abstractmethod
        def get_run_id(self): ...

        @abc.abstractmethod
        def shutdown(self): ...

    @dataclass
    class RendezvousStoreInfo:
        master_addr: str
        master_port: int

    class RendezvousInfo:
        def __init__(self, store, rank, world_size, bootstrap_store_info):
            self.store, self.rank, self.world_size = store, rank, world_size
            self.bootstrap_store_info = bootstrap_store_info

    api.RendezvousHandler = RendezvousHandler
    api.RendezvousStoreInfo = RendezvousStoreInfo
    api.RendezvousInfo = RendezvousInfo
    torch.distributed, dist.elastic, elastic.rendezvous, rendezvous.api = dist, elastic, rendezvous, api
    return {m.__name__: m for m in (torch, dist, elastic, rendezvous, api)}


@pytest.fixture
def backend(monkeypatch):
    modules = fake_torch()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "rdzv.torch_backend", raising=False)
    monkeypatch.delattr(rdzv, "torch_backend", raising=False)
    module = importlib.import_module("rdzv.torch_backend")
    assert module.TORCH_AVAILABLE
    return module, modules


def torch_like_params(etcd, run_id, min_nodes, max_nodes, **config):
    # torch's RendezvousParameters has the same shape as ours
    config.setdefault("timeout", 30)
    return rdzv.RendezvousParameters("etcd-v3", etcd.endpoint, run_id, min_nodes, max_nodes,
                                     local_addr="127.0.0.1", **config)


def test_round_through_the_torch_types(etcd, run_id, backend):
    tb, modules = backend
    api, dist = modules["torch.distributed.elastic.rendezvous.api"], modules["torch.distributed"]
    params = torch_like_params(etcd, run_id, 1, 1, is_host=True, read_timeout=5, rank=0)
    handler = tb.create_handler()(params)  # as torch's entry-point loader does
    try:
        assert isinstance(handler, api.RendezvousHandler)
        assert isinstance(handler, rdzv.EtcdV3RendezvousHandler)
        assert handler.get_backend() == "etcd-v3"
        info = handler.next_rendezvous()
        assert isinstance(info, api.RendezvousInfo)
        assert isinstance(info.bootstrap_store_info, api.RendezvousStoreInfo)
        assert info.bootstrap_store_info.master_addr == "127.0.0.1"
        assert (info.rank, info.world_size) == (0, 1)
        assert handler.last_round == 0
        store = info.store
        assert isinstance(store, dist.Store)
        store.set("k", "v")
        assert store.get("k") == b"v"
        assert store.getNumKeys() == store.num_keys() == 1
        assert store.deleteKey("k") is True
        store.set_timeout(datetime.timedelta(milliseconds=100))
        assert store.base_timeout == datetime.timedelta(milliseconds=100)
        assert store.timeout == datetime.timedelta(milliseconds=100)
        with pytest.raises(dist.DistStoreError) as err:
            store.wait(["absent"])
        assert isinstance(err.value, rdzv.RendezvousTimeoutError)
        with pytest.raises(rdzv.RendezvousTimeoutError):
            store.wait(["absent"], datetime.timedelta(milliseconds=50))
        store.close()
    finally:
        assert handler.shutdown() is True
        handler.close()


def test_errors_derive_from_both_libraries(etcd, run_id, backend):
    tb, modules = backend
    api = modules["torch.distributed.elastic.rendezvous.api"]
    handler = tb.create_handler(torch_like_params(etcd, run_id, 2, 2, timeout=1))
    try:
        with pytest.raises(api.RendezvousTimeoutError) as err:
            handler.next_rendezvous()
        assert isinstance(err.value, rdzv.RendezvousTimeoutError)
        assert err.value.status_name == "RDZV_ERR_TIMEOUT"
    finally:
        handler.close()
    with pytest.raises(api.RendezvousError) as err:
        tb.create_handler(torch_like_params(etcd, run_id, 1, 1, no_such_option=1))
    assert isinstance(err.value, ValueError) and "no_such_option" in str(err.value)


def test_shutdown_releases_the_node_without_closing_the_run(etcd, run_id, backend):
    tb, modules = backend
    api = modules["torch.distributed.elastic.rendezvous.api"]
    a = tb.create_handler(torch_like_params(etcd, run_id, 1, 2))
    b = tb.create_handler(torch_like_params(etcd, run_id, 1, 2, last_call_timeout=0.5))
    try:
        assert a.shutdown() is True
        assert a.shutdown() is True
        assert not b.is_closed()
        assert b.next_rendezvous().world_size == 1  # b alone still forms a round
    finally:
        a.close()
        b.close()


def test_endpoint_normalisation(backend):
    tb, _ = backend
    assert tb._normalize_endpoint("etcd-host") == ("etcd-host:2379", None)
    assert tb._normalize_endpoint("https://a:1,b") == ("a:1,b:2379", "https")
    assert tb._normalize_endpoint("[::1]") == ("[::1]:2379", None)


def test_without_torch_the_plain_handler_is_returned(etcd, run_id, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    monkeypatch.delitem(sys.modules, "rdzv.torch_backend", raising=False)
    monkeypatch.delattr(rdzv, "torch_backend", raising=False)
    tb = importlib.import_module("rdzv.torch_backend")
    assert not tb.TORCH_AVAILABLE
    with tb.create_handler(torch_like_params(etcd, run_id, 1, 1, is_host=True)) as handler:
        info = handler.next_rendezvous()
        assert isinstance(info, rdzv.RendezvousInfo)
        info.store.close()
