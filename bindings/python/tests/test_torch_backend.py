"""The torchrun backend's parts that do not need torch: endpoint parsing, and the plain handler
it falls back to without torch. Everything torch touches is tested with the real one
(test_torch.py, test_torchrun.py)."""

from __future__ import annotations

import importlib
import sys

import rdzv
from rdzv import torch_backend


def test_endpoint_normalisation():
    assert torch_backend._normalize_endpoint("etcd-host") == ("etcd-host:2379", None)
    assert torch_backend._normalize_endpoint("https://a:1,b") == ("a:1,b:2379", "https")
    assert torch_backend._normalize_endpoint("http://h:7/") == ("h:7", "http")
    assert torch_backend._normalize_endpoint("[::1]") == ("[::1]:2379", None)


def test_torch_options_that_do_not_apply_are_dropped():
    params = rdzv.RendezvousParameters("etcd-v3", "https://h", "job", 1, 2, is_host=True,
                                       read_timeout=60, rank=0, timeout=30)
    out = torch_backend._rdzv_params(params)
    assert out.endpoint == "h:2379"
    assert out.config == {"timeout": 30, "protocol": "https"}


def test_an_explicit_join_timeout_wins_over_torchruns_timeout():
    # torchrun's config: the --rdzv-conf options (strings), then timeout=900 when none is given.
    def config(**given):
        params = rdzv.RendezvousParameters("etcd-v3", "h", "job", 1, 2, **given)
        return torch_backend._rdzv_params(params).config

    assert config(join_timeout="10", timeout=900) == {"join_timeout": "10"}
    assert config(timeout=900, join_timeout=10) == {"join_timeout": 10}
    assert config(timeout=900) == {"timeout": 900}  # timeout alone is the join timeout
    assert config(join_timeout=None, timeout=900) == {"join_timeout": None, "timeout": 900}


def test_without_torch_the_plain_handler_is_returned(etcd, run_id, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    monkeypatch.delitem(sys.modules, "rdzv.torch_backend", raising=False)
    monkeypatch.delattr(rdzv, "torch_backend", raising=False)
    tb = importlib.import_module("rdzv.torch_backend")
    assert not tb.TORCH_AVAILABLE
    assert tb.create_handler() is tb.create_handler
    params = rdzv.RendezvousParameters("etcd-v3", etcd.endpoint, run_id, 1, 1, timeout=30,
                                       local_addr="127.0.0.1", is_host=True)
    with tb.create_handler(params) as handler:
        info = handler.next_rendezvous()
        assert isinstance(info, rdzv.RendezvousInfo)
        assert (info.rank, info.world_size) == (0, 1)
        info.store.close()
