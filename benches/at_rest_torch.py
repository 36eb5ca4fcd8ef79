"""What torch's own c10d rendezvous backend costs its store host at rest, to set beside
rdzv's figures (docs/BENCHMARKS.md, "At rest"). N nodes (threads, one handler each, as
torchrun makes one per node) form a round on one TCPStore; then, for SECONDS, each calls
`num_nodes_waiting()` every 0.1 s, as torch's agent does on every monitor tick under
torchrun's default `--monitor-interval`. Every request a handler sends its store goes through
its backend's `get_state` or `set_state` (one store call each): those are counted.

Usage: python benches/at_rest_torch.py [N ...] [--seconds 10]   (default N = 8 64)
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

    def get_state(self):
        with self._lock:
            self._counter[0] += 1
        return self._backend.get_state()

    def set_state(self, state, token=None):
        with self._lock:
            self._counter[0] += 1
        return self._backend.set_state(state, token)


def measure(n: int, seconds: float) -> float:
    port = free_port()
    counter, lock = [0], threading.Lock()
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
        before = counter[0]

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
        after = counter[0]
    for h in handlers:
        h.shutdown()
    return (after - before) / n / took


def main():
    args = sys.argv[1:]
    seconds = 10.0
    if "--seconds" in args:
        i = args.index("--seconds")
        seconds = float(args[i + 1])
        del args[i : i + 2]
    sizes = [int(a) for a in args] or [8, 64]
    for n in sizes:
        rate = measure(n, seconds)
        print(f"torch c10d backend, N={n:>5}: {rate:.2f} store requests per node per second at rest "
              f"(num_nodes_waiting every {TICK} s, {seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
