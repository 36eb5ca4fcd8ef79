"""`rdzv lighthouse` beside torchft's own Lighthouse, in the same run: how long N replica groups
take to get a quorum, as torchft's managers ask for one before every step. Run with
`scripts/torchft-test.sh --bench [N ...]` (default N = 1 8 64 256); prints medians and ratios.

Each configuration serves one job: torchft's `LighthouseServer` (in this process, all its state
in memory), two `rdzv lighthouse` processes on etcd with the replica groups talking to the
leader ("rdzv, leader"), and the same talking to the other one, which forwards ("rdzv,
follower"). N replica groups are threads of this process with a `LighthouseClient` each
(torchft's own client), released at once by a barrier; a time is from the release to the last
group's return. One more client heartbeats for every live group every 100 ms, as a manager does.

- fast path: the same N groups ask again (quorum_id unchanged; rdzv writes nothing to etcd);
- membership change: a new group has asked first, then the N ask: the quorum takes it in and
  quorum_id grows (rdzv writes the new id to etcd before answering);
- loss: one group stops heartbeating and asking; the others ask at once; the time is from its
  last heartbeat to the survivors' quorum, noticed when its heartbeat times out
  (HEARTBEAT_TIMEOUT_MS; join_timeout is longer, so the rule that ends the wait is the
  heartbeat's)."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

HEARTBEAT_TIMEOUT_MS = 1000
JOIN_TIMEOUT_MS = 60000
TICK_MS = 100
BEAT = 0.1


def torchft_server():
    from torchft._torchft import LighthouseServer

    s = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=JOIN_TIMEOUT_MS,
                         quorum_tick_ms=TICK_MS, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    return s.address(), s.shutdown


def rdzv_servers(rdzv: str, endpoint: str, via_follower: bool):
    job = f"bench-{uuid.uuid4().hex[:10]}"
    procs, addresses = [], []
    for _ in range(2):
        p = subprocess.Popen([rdzv, "lighthouse", "--bind=127.0.0.1:0", "--min_replicas=1",
                              f"--join_timeout_ms={JOIN_TIMEOUT_MS}",
                              f"--quorum_tick_ms={TICK_MS}",
                              f"--heartbeat_timeout_ms={HEARTBEAT_TIMEOUT_MS}",
                              f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job}",
                              "--rdzv-conf=lease_ttl=2"],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        procs.append(p)
        leading = len(procs) == 1
        for line in p.stderr:
            m = re.search(r"serving on (\S+)", line)
            if m:
                addresses.append(m.group(1))
                if not leading:
                    break
            if leading and "lighthouse: leading" in line:
                break
        threading.Thread(target=lambda p=p: [None for _ in p.stderr], daemon=True).start()

    def stop():
        for p in procs:
            p.terminate()
            p.wait()

    return addresses[1 if via_follower else 0], stop


class Groups:
    """Replica groups as threads, each asking for a quorum when released."""

    def __init__(self, addr: str):
        from torchft._torchft import LighthouseClient

        self.addr = addr
        self.client = LighthouseClient
        self.beat = LighthouseClient(addr, timedelta(seconds=30))
        self.live: list[str] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.beater = threading.Thread(target=self._heartbeats, daemon=True)
        self.beater.start()

    def _heartbeats(self):
        while not self.stopped.is_set():
            with self.lock:
                live = list(self.live)
            for r in live:
                try:
                    self.beat.heartbeat(r)
                except Exception:
                    pass
            time.sleep(BEAT)

    def add(self, replica_id: str):
        self.beat.heartbeat(replica_id)
        with self.lock:
            self.live.append(replica_id)

    def remove(self, replica_id: str) -> float:
        with self.lock:
            self.live.remove(replica_id)
        return time.monotonic()

    def ask_all(self, ids: list[str], early: list[str] = ()) -> tuple[float, list]:
        """Seconds from releasing `ids` at once to the last return; `early` asked before."""
        clients = {r: self.client(self.addr, timedelta(seconds=30)) for r in [*ids, *early]}
        results, ends, errors = {}, {}, []
        barrier = threading.Barrier(len(ids) + 1)

        def ask(r, wait):
            if wait:
                barrier.wait()
            try:
                q = clients[r].quorum(replica_id=r, timeout=timedelta(seconds=60))
                results[r] = (q.quorum_id, sorted(m.replica_id for m in q.participants))
            except Exception as e:
                errors.append(f"{r}: {e!r}")
            ends[r] = time.monotonic()

        threads = [threading.Thread(target=ask, args=(r, False)) for r in early]
        for t in threads:
            t.start()
        if early:
            time.sleep(0.05)  # the newcomer's ask reaches the lighthouse first
        more = [threading.Thread(target=ask, args=(r, True)) for r in ids]
        for t in more:
            t.start()
        barrier.wait()
        start = time.monotonic()
        for t in threads + more:
            t.join()
        if errors:
            raise RuntimeError(errors[0])
        return max(ends[r] for r in ids) - start, list(results.values())

    def close(self):
        self.stopped.set()
        self.beater.join()


def measure(addr: str, n: int, reps: int) -> dict:
    g = Groups(addr)
    ids = [f"r{i}" for i in range(n)]
    for r in ids:
        g.add(r)
    _, got = g.ask_all(ids)
    assert all(q[1] == sorted(ids) for q in got), got
    fast, change, loss = [], [], []
    for _ in range(reps):
        took, got = g.ask_all(ids)
        assert len({q[0] for q in got}) == 1, "one quorum_id"
        fast.append(took)
    for k in range(reps):
        newcomer = f"new{k}"
        g.add(newcomer)
        before = got[0][0]
        took, got = g.ask_all(ids, early=[newcomer])
        ids.append(newcomer)
        assert all(q[1] == sorted(ids) for q in got), "the newcomer is in"
        assert got[0][0] > before, "quorum_id grows"
        change.append(took)
    if n >= 2:
        for _ in range(min(reps, 3)):
            victim = ids.pop(0)
            stopped = g.remove(victim)
            _, got = g.ask_all(ids)
            assert all(q[1] == sorted(ids) for q in got), "the lost group is out"
            loss.append(time.monotonic() - stopped)
    g.close()
    return {"fast": fast, "change": change, "loss": loss}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rdzv")
    ap.add_argument("endpoint")
    ap.add_argument("sizes", nargs="*", type=int, default=[1, 8, 64, 256])
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    configs = [
        ("torchft", lambda: torchft_server()),
        ("rdzv, leader", lambda: rdzv_servers(a.rdzv, a.endpoint, False)),
        ("rdzv, follower", lambda: rdzv_servers(a.rdzv, a.endpoint, True)),
    ]
    print(f"{os.cpu_count()} cores, load {open('/proc/loadavg').read().split()[0]}; "
          f"heartbeat_timeout {HEARTBEAT_TIMEOUT_MS} ms, medians of {a.reps} "
          f"(loss: of up to 3) in ms")
    print(f"{'N':>4} {'lighthouse':<15} {'fast path':>10} {'x':>6} {'change':>10} {'x':>6} "
          f"{'loss':>8} {'x':>6}")
    for n in a.sizes:
        base = None
        for name, start in configs:
            addr, stop = start()
            try:
                m = measure(addr, n, a.reps)
            finally:
                stop()
            med = {k: (statistics.median(v) * 1000 if v else float("nan")) for k, v in m.items()}
            base = base or med
            ratio = {k: med[k] / base[k] if base[k] == base[k] else float("nan") for k in med}
            print(f"{n:>4} {name:<15} {med['fast']:>10.2f} {ratio['fast']:>6.2f} "
                  f"{med['change']:>10.2f} {ratio['change']:>6.2f} {med['loss']:>8.0f} "
                  f"{ratio['loss']:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # torchft's clients and server keep runtime threads that abort the interpreter's
    # finalization ("exception not rethrown"); everything is measured and printed by now.
    os._exit(0)
