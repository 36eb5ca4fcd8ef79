"""The run's store (``EtcdV3RendezvousHandler.run_store``) against a real etcd: it outlives
rounds, its counter is shared by every node, and it goes with the run."""

from __future__ import annotations

import pytest

from rdzv import RendezvousShutdownError, RendezvousStateError, Store


def test_the_run_store_outlives_rounds_and_goes_with_the_run(etcd, run_id):
    with etcd.handler(run_id, 1, 1) as handler, handler.run_store() as run:
        assert isinstance(run, Store)
        assert run.add("restarts", 1) == 1
        first = handler.next_rendezvous()
        with first.store as round0:
            run.set("notes/why", "set in round 0")
            round0.set("k", b"v")
            for _ in range(2):
                handler.next_rendezvous().store.close()
            # Round 0's store was deleted when round 2 formed; the run's store stays.
            with pytest.raises(RendezvousStateError):
                round0.get("k", timeout=0)
        with handler.run_store() as again:
            assert again.get("notes/why", timeout=0) == b"set in round 0"
            assert again.add("restarts", 1) == 2
        assert any(k.endswith("/store/restarts") for k in etcd.keys(f"/rdzv/{run_id}/"))
        handler.shutdown()
        with pytest.raises(RendezvousShutdownError):
            run.set("after", b"1")
    assert etcd.keys(f"/rdzv/{run_id}/") == [], "the last node out took the run's store"


def test_every_node_adds_to_one_counter(etcd, run_id):
    with etcd.handler(run_id, 1, 2) as a, etcd.handler(run_id, 1, 2) as b:
        with a.run_store() as sa, b.run_store() as sb:
            totals = [s.add("budget", 1) for s in (sa, sb, sa, sb)]
            assert totals == [1, 2, 3, 4]
            assert sb.get("budget") == b"4"
