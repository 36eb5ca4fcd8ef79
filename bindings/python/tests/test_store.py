"""Store semantics against a real etcd, on the store of a one-node round."""

from __future__ import annotations

import datetime
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import wait_until
from rdzv import (
    RendezvousCancelledError,
    RendezvousClosedError,
    RendezvousInvalidArgumentError,
    RendezvousShutdownError,
    RendezvousTimeoutError,
    Store,
)

T = 30  # seconds: the bound on any wait in these tests


@pytest.fixture
def node(etcd, run_id):
    with etcd.handler(run_id, 1, 1) as handler:
        info = handler.next_rendezvous()
        with info.store:
            yield handler, info


@pytest.fixture
def store(node) -> Store:
    return node[1].store


def test_set_get_bytes_and_str(store):
    store.set("b", b"\x00\xffbin")
    store.set("s", "h\u00e9llo")
    store.set("ba", bytearray(b"ba"))
    store.set("mv", memoryview(b"mv"))
    store.set("empty", b"")
    assert store.get("b") == b"\x00\xffbin"
    assert store.get("s") == "h\u00e9llo".encode()
    assert store.get("ba") == b"ba" and store.get("mv") == b"mv"
    assert store.get("empty") == b""
    store.set("s", "overwritten")
    assert store.get("s", timeout=0) == b"overwritten"


def test_value_types_are_checked(store):
    with pytest.raises(TypeError):
        store.set("k", 12)
    with pytest.raises(TypeError):
        store.get(b"bytes-key")


@pytest.mark.parametrize("key", ["", "nul\0key", "x" * 5000])
def test_bad_keys(store, key):
    with pytest.raises(RendezvousInvalidArgumentError):
        store.set(key, b"v")


def test_get_times_out(store):
    t0 = time.monotonic()
    with pytest.raises(RendezvousTimeoutError, match="absent"):
        store.get("absent", timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < T
    with pytest.raises(RendezvousTimeoutError):
        store.get("absent", timeout=datetime.timedelta(milliseconds=100))
    with pytest.raises(RendezvousTimeoutError):
        store.get("absent", timeout=0)


def test_get_waits_for_a_key_set_later(store):
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(store.get, "later", T)
        store.set("later", b"here")
        assert waiting.result(timeout=T) == b"here"


def test_add(store):
    assert store.add("n", 5) == 5  # absent counts as 0
    assert store.add("n", -7) == -2
    assert store.add("n", 0) == -2
    assert store.get("n") == b"-2"
    store.set("text", "abc")
    with pytest.raises(RendezvousInvalidArgumentError):
        store.add("text", 1)
    store.set("big", str(2**63 - 1))
    with pytest.raises(RendezvousInvalidArgumentError):
        store.add("big", 1)  # overflow
    with pytest.raises(TypeError):
        store.add("n", 1.5)


def test_add_is_exact_under_concurrency(store):
    def adder():
        for _ in range(25):
            store.add("counter", 1)

    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(adder) for _ in range(4)]:
            f.result(timeout=T)
    assert store.get("counter") == b"100"


def test_compare_set(store):
    # absent, expected empty: sets
    assert store.compare_set("cs", b"", b"first") == b"first"
    # wrong expected: unchanged, returns the current value
    assert store.compare_set("cs", b"nope", b"second") == b"first"
    assert store.get("cs") == b"first"
    # right expected (str accepted): swaps
    assert store.compare_set("cs", "first", "second") == b"second"
    assert store.get("cs") == b"second"
    # absent, expected not empty: returns expected, store unchanged
    assert store.compare_set("other", b"exp", b"des") == b"exp"
    assert not store.check(["other"])


def test_wait_and_check(store):
    assert store.check([]) is True
    assert store.check(["w1"]) is False
    store.set("w1", b"1")
    assert store.check(["w1"]) is True and store.check("w1") is True
    assert store.check(["w1", "w2"]) is False
    store.wait(["w1"], timeout=T)
    t0 = time.monotonic()
    with pytest.raises(RendezvousTimeoutError):
        store.wait(["w1", "w2"], timeout=datetime.timedelta(seconds=0.2))
    assert time.monotonic() - t0 < T
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(store.wait, ["w2", "w3"], T)
        store.multi_set(["w2", "w3"], [b"2", b"3"])
        assert waiting.result(timeout=T) is None


def test_delete_key_and_num_keys(store):
    before = store.num_keys()
    store.set("d1", b"x")
    store.set("d2", b"y")
    assert store.num_keys() == before + 2
    assert store.delete_key("d1") is True
    assert store.delete_key("d1") is False
    assert store.num_keys() == before + 1
    assert not store.check(["d1"]) and store.check(["d2"])


def test_multi_set_and_multi_get(store):
    keys = [f"m/{i}" for i in range(5)]
    store.multi_set(keys, [f"v{i}" if i % 2 else f"v{i}".encode() for i in range(5)])
    assert store.multi_get(keys) == [f"v{i}".encode() for i in range(5)]
    assert store.multi_get(list(reversed(keys)), timeout=0) == [
        f"v{i}".encode() for i in reversed(range(5))
    ]
    assert store.multi_get([]) == []
    with pytest.raises(RendezvousTimeoutError):
        store.multi_get(keys + ["m/missing"], timeout=0.2)
    with pytest.raises(RendezvousInvalidArgumentError):
        store.multi_set(["a", "b"], [b"1"])


def test_large_value(store):
    value = bytes(range(256)) * 4096  # 1 MiB
    store.set("large", value)
    assert store.get("large") == value


def test_set_timeout(store):
    assert store.timeout == datetime.timedelta(seconds=300)
    store.set_timeout(datetime.timedelta(milliseconds=200))
    assert store.timeout == datetime.timedelta(milliseconds=200)
    t0 = time.monotonic()
    with pytest.raises(RendezvousTimeoutError):
        store.get("absent")  # the default timeout now applies
    with pytest.raises(RendezvousTimeoutError):
        store.wait(["absent"])
    assert time.monotonic() - t0 < T
    store.set_timeout(1.5)
    assert store.timeout == datetime.timedelta(seconds=1.5)
    with pytest.raises(RendezvousInvalidArgumentError):
        store.set_timeout(-1)


def test_store_timeout_option(etcd, run_id):
    with etcd.handler(run_id, 1, 1, store_timeout=0.2) as h:
        with h.next_rendezvous().store as store:
            assert store.timeout == datetime.timedelta(seconds=0.2)
            t0 = time.monotonic()
            with pytest.raises(RendezvousTimeoutError):
                store.get("absent")
            assert time.monotonic() - t0 < 5


def test_store_dies_with_its_handler_and_closes_once(etcd, run_id):
    handler = etcd.handler(run_id, 1, 1)
    store = handler.next_rendezvous().store
    store.set("k", b"v")
    handler.close()
    with pytest.raises(RendezvousShutdownError):
        store.get("k")
    store.close()
    store.close()  # idempotent
    assert store.closed
    with pytest.raises(RendezvousShutdownError):
        store.get("k")


def test_store_waits_end_on_cancel_close_and_shutdown(etcd, run_id):
    with etcd.handler(run_id, 1, 1) as handler:
        store = handler.next_rendezvous().store
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(store.get, "never")
            store.cancel()  # once, even if the get has not started yet: it is not lost
            with pytest.raises(RendezvousCancelledError):
                waiting.result(timeout=T)
            store.set("still", b"usable")
            # With no wait running, a cancel ends the next one at once, and is used up by it.
            store.cancel()
            t0 = time.monotonic()
            with pytest.raises(RendezvousCancelledError):
                store.get("still", 60)
            assert time.monotonic() - t0 < 3
            assert store.get("still", 5) == b"usable"

            waiting = pool.submit(store.get, "never")
            wait_until(lambda: store._res._users == 1, T, "the get to be in flight")
            with etcd.handler(run_id, 1, 1) as other:
                other.set_closed()
            with pytest.raises(RendezvousClosedError):
                waiting.result(timeout=T)

    with etcd.handler(run_id + "-shutdown", 1, 1) as handler:
        store = handler.next_rendezvous().store
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(store.wait, ["never"])
            wait_until(lambda: store._res._users == 1, T, "the wait to be in flight")
            handler.shutdown()
            with pytest.raises(RendezvousShutdownError):
                waiting.result(timeout=T)


def test_close_while_a_get_is_blocked_defers_the_free(etcd, run_id):
    with etcd.handler(run_id, 1, 1) as handler:
        store = handler.next_rendezvous().store
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(store.get, "never", 1.0)
            wait_until(lambda: store._res._users == 1, T, "the get to be in flight")
            store.close()  # returns at once; the free waits for the get
            assert store.closed and store._res._ptr is not None
            with pytest.raises(RendezvousTimeoutError):
                waiting.result(timeout=T)
        assert store._res._ptr is None  # freed by the last user


def test_round_store_is_scoped_to_the_round(etcd, run_id):
    with etcd.handler(run_id, 1, 1) as handler:
        with handler.next_rendezvous().store as first:
            first.set("k", b"round0")
            with handler.next_rendezvous().store as second:
                assert not second.check(["k"])
                second.set("k", b"round1")
                assert first.get("k") == b"round0"


def test_store_cannot_be_constructed():
    with pytest.raises(TypeError):
        Store()
