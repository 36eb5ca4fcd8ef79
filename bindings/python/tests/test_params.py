"""RendezvousParameters: torch's semantics, and validation with errors that name the culprit.
Nothing here needs etcd except the connection test, which uses a port nobody listens on."""

from __future__ import annotations

import datetime
import time

import pytest

from conftest import free_port
from rdzv import (
    EtcdV3RendezvousHandler,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousInvalidArgumentError,
    RendezvousParameters,
)
from rdzv.params import option_value

EP = "127.0.0.1:2379"


def make(**kwargs):
    return RendezvousParameters("etcd-v3", EP, "run", 1, 2, **kwargs)


def test_attributes_and_get():
    p = RendezvousParameters("etcd-v3", EP, "run", 2, 4, local_addr="10.0.0.1", join_timeout=5)
    assert (p.backend, p.endpoint, p.run_id, p.min_nodes, p.max_nodes, p.local_addr) == (
        "etcd-v3", EP, "run", 2, 4, "10.0.0.1")
    assert p.config == {"join_timeout": 5}
    assert p.get("join_timeout") == 5
    assert p.get("missing") is None and p.get("missing", 7) == 7


@pytest.mark.parametrize(
    "value, expected",
    [(True, True), (False, False), (1, True), (0, False), ("yes", True), ("Y", True), ("t", True),
     ("TRUE", True), ("1", True), ("no", False), ("n", False), ("f", False), ("False", False),
     ("0", False)],
)
def test_get_as_bool(value, expected):
    assert make(flag=value).get_as_bool("flag") is expected


@pytest.mark.parametrize("value", ["maybe", 2, -1, "", 1.0])
def test_get_as_bool_rejects(value):
    with pytest.raises(ValueError, match="flag"):
        make(flag=value).get_as_bool("flag")


def test_get_as_bool_default_and_none():
    p = make(flag=None)
    assert p.get_as_bool("flag") is None
    assert p.get_as_bool("flag", True) is None  # torch: a None value is returned as is
    assert p.get_as_bool("absent", True) is True
    assert p.get_as_bool("absent") is None


def test_get_as_int():
    p = make(n="42", m=7, bad="x")
    assert p.get_as_int("n") == 42 and p.get_as_int("m") == 7
    assert p.get_as_int("absent") is None and p.get_as_int("absent", 3) == 3
    with pytest.raises(ValueError, match="bad"):
        p.get_as_int("bad")


@pytest.mark.parametrize(
    "args, word",
    [
        (("", EP, "run", 1, 2), "backend"),
        (("etcd-v3", EP, "run", 0, 2), "min_nodes"),
        (("etcd-v3", EP, "run", 3, 2), "max_nodes"),
        (("etcd-v3", EP, "run", True, 2), "min_nodes"),
    ],
)
def test_constructor_checks(args, word):
    with pytest.raises(RendezvousInvalidArgumentError, match=word) as info:
        RendezvousParameters(*args)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RendezvousError)


def test_valid_options_pass():
    make(join_timeout=1.5, last_call_timeout=datetime.timedelta(milliseconds=250), lease_ttl=2,
         store_timeout="10", key_prefix="/custom", nnodes="1:3", close_timeout=0.5,
         connect_timeout=1e-3, timeout=900, min_workers=1, max_workers=2, unused=None).validate()


@pytest.mark.parametrize(
    "options, word",
    [
        ({"bogus_option": "1"}, "bogus_option"),
        ({"join_timeout": "soon"}, "join_timeout"),
        ({"join_timeout": -1}, "join_timeout"),
        ({"join_timeout": float("inf")}, "join_timeout"),
        ({"last_call_timeout": True}, "last_call_timeout"),
        ({"lease_ttl": 1}, "lease_ttl"),
        ({"protocol": "ftp"}, "protocol"),
        ({"key_prefix": "no-slash"}, "key_prefix"),
        ({"nnodes": "3:2"}, "max_nodes"),
        ({"cacert": "/x.pem"}, "cacert"),
        ({"password": "secret"}, "password"),
        ({"store_timeout": object()}, "store_timeout"),
        ({"local_addr": "has space"}, "local_addr"),
    ],
)
def test_bad_option_is_named(options, word):
    with pytest.raises(RendezvousInvalidArgumentError, match=word):
        make(**options).validate()


@pytest.mark.parametrize(
    "args, word",
    [
        (("zookeeper", EP, "run", 1, 2), "backend"),
        (("etcd-v3", "", "run", 1, 2), "endpoint"),
        (("etcd-v3", EP, "", 1, 2), "run_id"),
        (("etcd-v3", EP, "bad\0id", 1, 2), "run_id"),
        (("etcd-v3", EP, "run", 1, 2**32), "max_nodes"),
    ],
)
def test_bad_fields_are_named(args, word):
    with pytest.raises(RendezvousInvalidArgumentError, match=word):
        RendezvousParameters(*args).validate()


def test_handler_rejects_bad_option_before_connecting():
    p = RendezvousParameters("etcd-v3", f"127.0.0.1:{free_port()}", "run", 1, 1, joint_timeout=3)
    t0 = time.monotonic()
    with pytest.raises(RendezvousInvalidArgumentError, match="joint_timeout"):
        EtcdV3RendezvousHandler(p)
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize(
    "url, word",
    [
        ("http://127.0.0.1:2379/run", "http"),
        ("etcd://127.0.0.1:2379/run?min_nodes=1&frobnicate=2", "frobnicate"),
        ("etcd://127.0.0.1:2379/run?min_nodes=3&max_nodes=2", "max_nodes"),
    ],
)
def test_bad_url_is_named(url, word):
    with pytest.raises(RendezvousInvalidArgumentError, match=word):
        EtcdV3RendezvousHandler.from_url(url)


def test_unreachable_etcd_is_a_connection_error():
    p = RendezvousParameters("etcd-v3", f"127.0.0.1:{free_port()}", "run", 1, 1, connect_timeout=1)
    t0 = time.monotonic()
    with pytest.raises(RendezvousConnectionError) as info:
        EtcdV3RendezvousHandler(p)
    assert time.monotonic() - t0 < 15
    assert p.endpoint in str(info.value)  # the message names the endpoint


@pytest.mark.parametrize(
    "value, text",
    [("30", "30"), (30, "30"), (0.5, "0.5"), (1e-05, "0.00001"), (1e16, "10000000000000000"),
     (datetime.timedelta(minutes=2), "120"), (datetime.timedelta(milliseconds=1), "0.001")],
)
def test_option_values_are_plain_decimals(value, text):
    assert option_value("x", value) == text
