"""What torch's own rendezvous backends cost their store at rest, to set beside rdzv's
figures (docs/BENCHMARKS.md, "At rest"). N nodes (threads, one handler each, as torchrun makes
one per node) form a round; then, for SECONDS, each calls `num_nodes_waiting()` every 0.1 s,
as torch's agent does on every monitor tick under torchrun's default `--monitor-interval`.

- c10d (the default): one TCPStore. Every request a handler sends its store goes through its
  backend's `get_state` or `set_state` (one store call each): those are counted, and the
  bytes of state each answer carries (the whole state, whatever changed).
- `--etcd-v2 HOST:PORT`: torch's legacy `etcd` backend, on an etcd serving the v2 API (3.4
  with `--enable-v2`; 3.6 removed it), through python-etcd. Every HTTP request of every client
  goes through python-etcd's `Client.api_execute`: those are counted, the lease renewals of
  its background threads included.

Usage: python benches/at_rest_torch.py [N ...] [--seconds 10] [--etcd-v2 HOST:PORT]
       (default N = 8 64)
"""

import socket
import sys
import threading
import time

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

TICK = 0.1  # torchrun's default --monitor-interval


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Counted:
    """A backend whose store calls are counted (all of them go through these two methods)."""

    def __init__(self, backend, counter, lock):
        self._backend, self._counter, self._lock = backend, counter, lock

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def _count(self, result):
        # Every answer carries the whole state, base64-encoded on the wire (4/3 of its size).
        with self._lock:
            self._counter[0] += 1
            self._counter[1] += len(result[0]) * 4 // 3 if result else 0
        return result

    def get_state(self):
        return self._count(self._backend.get_state())

    def set_state(self, state, token=None):
        return self._count(self._backend.set_state(state, token))


def c10d_handlers(n: int, counter, lock):
    port = free_port()
    handlers = []
    for i in range(n):
        params = RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{port}",
            run_id=f"rest-{n}",
            min_nodes=n,
            max_nodes=n,
            is_host=(i == 0),
            join_timeout=600,
            last_call_timeout=1,
        )
        backend, store = create_backend(params)
        handlers.append(create_handler(store, Counted(backend, counter, lock), params))
    return handlers


def etcd_v2_handlers(n: int, endpoint: str, counter, lock):
    import etcd  # python-etcd, which torch's legacy backend needs
    from torch.distributed.elastic.rendezvous.etcd_rendezvous import create_rdzv_handler

    execute = etcd.Client.api_execute

    def counted(self, *args, **kwargs):
        with lock:
            counter[0] += 1
        return execute(self, *args, **kwargs)

    etcd.Client.api_execute = counted
    run_id = f"rest-v2-{n}-{time.monotonic_ns()}"
    return [
        create_rdzv_handler(
            RendezvousParameters(
                backend="etcd",
                endpoint=endpoint,
                run_id=run_id,
                min_nodes=n,
                max_nodes=n,
                last_call_timeout=1,
            )
        )
        for _ in range(n)
    ]


def measure(n: int, seconds: float, etcd_v2) -> tuple[float, float]:
    """Requests, and bytes the store answered (c10d only), per node per second at rest."""
    counter, lock = [0, 0], threading.Lock()
    if etcd_v2:
        handlers = etcd_v2_handlers(n, etcd_v2, counter, lock)
    else:
        handlers = c10d_handlers(n, counter, lock)
    joined = [None] * n

    def join(i):
        joined[i] = handlers[i].next_rendezvous()

    threads = [threading.Thread(target=join, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(j is not None for j in joined), "a node did not join"
    time.sleep(1)  # the joins' own traffic ends
    stop = time.monotonic() + seconds
    with lock:
        before, bytes_before = counter[0], counter[1]

    def monitor(h):
        while time.monotonic() < stop:
            assert h.num_nodes_waiting() == 0
            time.sleep(TICK)

    threads = [threading.Thread(target=monitor, args=(h,)) for h in handlers]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    with lock:
        after, bytes_after = counter[0], counter[1]
    for h in handlers:
        h.shutdown()
    return (after - before) / n / took, (bytes_after - bytes_before) / n / took


def main():
    args = sys.argv[1:]
    seconds = 10.0
    if "--seconds" in args:
        i = args.index("--seconds")
        seconds = float(args[i + 1])
        del args[i : i + 2]
    etcd_v2 = None
    if "--etcd-v2" in args:
        i = args.index("--etcd-v2")
        etcd_v2 = args[i + 1]
        del args[i : i + 2]
    sizes = [int(a) for a in args] or [8, 64]
    what = "legacy etcd (v2) backend" if etcd_v2 else "c10d backend"
    unit = "etcd v2 requests" if etcd_v2 else "store requests"
    for n in sizes:
        rate, answered = measure(n, seconds, etcd_v2)
        carried = "" if etcd_v2 else f", {answered / 1024:.1f} KiB of state answered"
        print(f"torch {what}, N={n:>5}: {rate:.2f} {unit}{carried} per node per second at "
              f"rest (num_nodes_waiting every {TICK} s, {seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
