"""rdzv against torchft's Lighthouse, in the same run: how long N participants take to get a
quorum (torchft) or a round (rdzv), and how long the survivors take to get the next one after
one participant is SIGKILLed. Run with `scripts/bench.sh --quorum` (starts etcd, installs
torchft beside the cached PyTorch); prints medians and ratios.

What each guarantees differs and is printed with the numbers: the Lighthouse is one process
holding the membership in memory (it forgets everything when it restarts, and nothing
replicates it); rdzv's membership is in etcd, replicated by raft when etcd is a cluster, and
a round once sealed never changes.

Formation: N threads in this process, each with its own client (torchft) or handle (rdzv,
min_nodes = max_nodes = N), released at once by a barrier; the time is from the release to the
last participant's return. Loss: N participant processes form a quorum or round, one is
SIGKILLed; the time is from the kill to the last survivor holding a quorum or round of N-1.
rdzv notices a death when the lease expires (LOSS_TTL); torchft when the heartbeat times out
(the same LOSS_TTL), or sooner: once more than half of the heartbeating replicas ask for a
quorum, one that does not ask within join_timeout is left out. Both poll at the same interval (POLL)."""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

LOSS_TTL = 3.0  # seconds: torchft's heartbeat timeout, rdzv's lease_ttl
LAST_CALL = 0.5  # rdzv's last call once min_nodes joined (torchft: join_timeout)
POLL = 0.1  # how often a participant looks for a membership change (an agent's monitor loop)


def lighthouse(min_replicas: int):
    from torchft._torchft import LighthouseServer

    return LighthouseServer(bind="127.0.0.1:0", min_replicas=min_replicas,
                            join_timeout_ms=int(LAST_CALL * 1000),
                            heartbeat_timeout_ms=int(LOSS_TTL * 1000))


def torchft_quorum(client, replica_id: str):
    return client.quorum(replica_id=replica_id, timeout=timedelta(seconds=120))


def rdzv_url(endpoint: str, run: str, min_nodes: int, max_nodes: int) -> str:
    return (f"etcd://{endpoint}/{run}?min_nodes={min_nodes}&max_nodes={max_nodes}"
            f"&lease_ttl={LOSS_TTL:g}&last_call_timeout={LAST_CALL:g}&join_timeout=120")


def released_together(n: int, prepare, call) -> float:
    """Seconds from releasing n threads at once to the last return of call(prepared)."""
    prepared = [prepare(i) for i in range(n)]
    barrier = threading.Barrier(n + 1)
    ends = [0.0] * n
    errors = []

    def run(i):
        barrier.wait()
        try:
            call(i, prepared[i])
        except Exception as e:  # reported below, with the participant
            errors.append(f"participant {i}: {e!r}")
        ends[i] = time.monotonic()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.monotonic()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    return max(ends) - start


def formation_torchft(n: int) -> float:
    from torchft._torchft import LighthouseClient

    server = lighthouse(n)
    try:
        sizes = []

        def call(i, client):
            sizes.append(len(torchft_quorum(client, f"r{i}").participants))

        took = released_together(
            n, lambda i: LighthouseClient(server.address(), timedelta(seconds=30)), call)
        assert sizes == [n] * n, sizes
        return took
    finally:
        server.shutdown()


def formation_rdzv(endpoint: str, n: int) -> float:
    import rdzv

    url = rdzv_url(endpoint, f"quorum-{uuid.uuid4().hex[:8]}", n, n)
    handlers = []
    sizes = []

    def call(i, h):
        info = h.next_rendezvous()
        sizes.append(info.world_size)
        info.store.close()

    def prepare(i):
        h = rdzv.EtcdV3RendezvousHandler.from_url(url)
        handlers.append(h)
        return h

    try:
        took = released_together(n, prepare, call)
    finally:
        for h in handlers:
            h.close()
    assert sizes == [n] * n, sizes
    return took


# --- loss: participant processes -------------------------------------------------------------

def participant_torchft(addr: str, replica_id: str) -> None:
    """Calls quorum in a loop (as torchft's manager does every step) and heartbeats; prints a
    line each time the quorum's size changes."""
    from torchft._torchft import LighthouseClient

    client = LighthouseClient(addr, timedelta(seconds=30))
    beat = LighthouseClient(addr, timedelta(seconds=30))

    def heartbeat():
        while True:
            beat.heartbeat(replica_id)
            time.sleep(POLL)

    threading.Thread(target=heartbeat, daemon=True).start()
    size = None
    while True:
        q = torchft_quorum(client, replica_id)
        if len(q.participants) != size:
            size = len(q.participants)
            print(json.dumps({"size": size, "at": time.monotonic()}), flush=True)
        time.sleep(POLL)


def participant_rdzv(url: str) -> None:
    """Forms a round, then polls for a change as an agent does and re-forms on one."""
    import rdzv

    h = rdzv.EtcdV3RendezvousHandler.from_url(url)
    while True:
        info = h.next_rendezvous()
        print(json.dumps({"size": info.world_size, "at": time.monotonic()}), flush=True)
        info.store.close()
        while h.num_nodes_waiting() == 0:  # waiting and lost nodes, as torch's agent reads it
            time.sleep(POLL)


def recovery(cmd_of, n: int) -> float:
    """Seconds from SIGKILL of one of n participants to the last survivor's quorum of n-1."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen(cmd_of(i), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=env) for i in range(n)]
    for p in procs:  # each participant's lines, read by a thread of its own
        p.lines = queue.Queue()
        threading.Thread(target=lambda p=p: [p.lines.put(x) for x in p.stdout] + [p.lines.put("")],
                         daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        for p in procs:  # every participant holds the full quorum
            next_line_until(p, n, deadline)
        victim = procs[-1]
        killed = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        done = [next_line_until(p, n - 1, deadline) for p in procs[:-1]]
        return max(done) - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def next_line_until(p, size: int, deadline: float) -> float:
    """When participant p printed a quorum of `size`; fails at the deadline."""
    while True:
        try:
            line = p.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = ""
        if not line:
            raise RuntimeError(f"no quorum of {size} from a participant before the deadline")
        got = json.loads(line)
        if got["size"] == size:
            return got["at"]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("endpoint", help="etcd HOST:PORT for rdzv")
    ap.add_argument("--sizes", type=int, nargs="*", default=[2, 8, 64, 256])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--loss", type=int, nargs="*", default=[2, 8],
                    help="participant counts for the loss measurement (processes)")
    ap.add_argument("--participant", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.participant:
        kind, *rest = args.participant
        return participant_torchft(*rest) if kind == "torchft" else participant_rdzv(*rest)

    import torchft  # noqa: F401  (fails early, and clearly, where it is not installed)

    print(f"formation: N threads released at once, time to the last return "
          f"(median of {args.repeats}); torchft Lighthouse (in memory) vs rdzv (etcd at "
          f"{args.endpoint})")
    for n in args.sizes:
        t = statistics.median(formation_torchft(n) for _ in range(args.repeats))
        r = statistics.median(formation_rdzv(args.endpoint, n) for _ in range(args.repeats))
        print(f"N={n:>4}  torchft {ms(t)}  rdzv {ms(r)}  rdzv/torchft {r / t:6.2f}x")

    print(f"loss: N participant processes, one SIGKILLed, time to the survivors' next quorum "
          f"(median of 3); heartbeat timeout = lease_ttl = {LOSS_TTL:g} s, polled every "
          f"{POLL:g} s; join_timeout = last call = {LAST_CALL:g} s")
    me = [sys.executable, os.path.abspath(__file__), args.endpoint, "--participant"]
    for n in args.loss:
        t_runs, r_runs = [], []
        for _ in range(3):
            server = lighthouse(n - 1)
            try:
                t_runs.append(recovery(lambda i: me + ["torchft", server.address(), f"r{i}"], n))
            finally:
                server.shutdown()
            url = rdzv_url(args.endpoint, f"loss-{uuid.uuid4().hex[:8]}", n - 1, n)
            r_runs.append(recovery(lambda i: me + ["rdzv", url], n))
        t, r = statistics.median(t_runs), statistics.median(r_runs)
        print(f"N={n:>4}  torchft {ms(t)}  rdzv {ms(r)}  rdzv/torchft {r / t:6.2f}x  "
              f"(rdzv's floor: {LOSS_TTL:g} s until the lease expires)")


if __name__ == "__main__":
    main()
