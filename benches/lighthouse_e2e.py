"""An end-to-end torchft job on CPU with its Lighthouse killed mid-run: two replica groups of
torchft's DDP (torchft's Manager, DistributedDataParallel and OptimizerWrapper over Gloo, a
small model on synthetic data, as torchft's own manager_integ_test trains), each a process of
its own, stepping for the whole run. Run with `scripts/torchft-test.sh --e2e`.

rdzv: two `rdzv lighthouse` processes on a 3-member etcd (lease_ttl at its default, 10 s: the
lighthouse holds quorums back while etcd has not confirmed its lease for two thirds of it, which
an etcd election must not reach), the managers on the follower. Every kill waits for steps, not
for a timer: once every group has committed STEPS steps the leading lighthouse is SIGKILLed; once
every group has committed STEPS more, etcd's raft leader; once STEPS more, the run ends (each wait
gives up after PATIENCE s). torchft: its own `torchft_lighthouse`, SIGKILLed the same way once
every group has committed STEPS steps; what follows is watched for PHASE s.

A group process that exits before the run's end is started again, as an elastic agent would, and
counted. Prints, per kill, the longest pause between two steps of any group after it (against
the median step) and how many steps came; per group, its restarts and how it exited. Exits 1
when, with rdzv lighthouse, a group committed no step after a kill, a group was restarted, a wait
for steps gave up, or a group did not finish (exit 0 once told to stop); and when torchft's
baseline never stepped before its kill (the comparison would be empty)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

STEPS = 10
PATIENCE = 120.0
PHASE = 6.0
# A worker's own limit, should the harness die without telling it to stop.
LONGEST = 900.0


def worker(replica_id: int, lighthouse: str, stop: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn, optim
    from torchft.ddp import DistributedDataParallel
    from torchft.manager import Manager
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo
    from datetime import timedelta

    store = dist.TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)
    torch.manual_seed(42)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4))

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    manager = Manager(pg=ProcessGroupGloo(), min_replica_size=1, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"group{replica_id}",
                      store_addr="localhost", store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=lighthouse, timeout=timedelta(seconds=30),
                      quorum_timeout=timedelta(seconds=30))
    ddp = DistributedDataParallel(manager, model)
    opt = OptimizerWrapper(manager, optim.Adam(model.parameters()))
    loss_fn = nn.CrossEntropyLoss()
    end = time.monotonic() + LONGEST
    while time.monotonic() < end and not os.path.exists(stop):
        before = manager.current_step()
        opt.zero_grad()
        loss = loss_fn(ddp(torch.rand(8, 3)), torch.randint(4, (8,)))
        loss.backward()
        opt.step()  # the manager counts a step once every group agreed to commit it
        print(json.dumps({"t": time.time(), "step": manager.current_step(),
                          "committed": manager.current_step() > before}), flush=True)
        time.sleep(0.05)  # a step of compute
    manager.shutdown(wait=False)
    os._exit(0)


class Proc:
    def __init__(self, argv, env=None):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)
        self.lines: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=lambda: [self.lines.append(x) for x in self.p.stdout],
                         daemon=True).start()
        threading.Thread(target=lambda: [self.err.append(x) for x in self.p.stderr],
                         daemon=True).start()

    def wait_err(self, pattern: str, timeout: float = 30) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for x in list(self.err):
                m = re.search(pattern, x)
                if m:
                    return m.group(1) if m.groups() else x
            time.sleep(0.02)
        raise RuntimeError(f"no line matching {pattern!r}: {''.join(self.err)[-2000:]}")


class Group:
    """One replica group: its worker process, started again whenever it exits before `stop`
    is set (each start counted)."""

    def __init__(self, python: str, i: int, lighthouse: str, stop: str):
        self.argv = [python, __file__, "--worker", str(i), lighthouse, stop]
        self.stop = stop
        self.procs = [Proc(self.argv)]

    @property
    def restarts(self) -> int:
        return len(self.procs) - 1

    def supervise(self) -> None:
        """Starts the worker again if it exited while the run goes on."""
        if not os.path.exists(self.stop) and self.procs[-1].p.poll() is not None:
            self.procs.append(Proc(self.argv))

    @property
    def lines(self) -> list[str]:
        return [x for p in self.procs for x in list(p.lines)]

    @property
    def err(self) -> list[str]:
        return [x for p in self.procs for x in list(p.err)]

    def exits(self) -> list:
        return [p.p.poll() for p in self.procs]


def wait_steps(groups: list[Group], more: int, patience: float = PATIENCE) -> bool:
    """Waits until every group has committed `more` steps beyond what it had; False if one
    had not after `patience` s."""
    start = [len(steps(g)) for g in groups]
    end = time.monotonic() + patience
    while time.monotonic() < end:
        for g in groups:
            g.supervise()
        if all(len(steps(g)) - s >= more for g, s in zip(groups, start)):
            return True
        time.sleep(0.05)
    return False


def raft_leader(endpoints: list[str]) -> int:
    """The index of the etcd member that leads (etcd's JSON gateway: maintenance status)."""
    for i, ep in enumerate(endpoints):
        req = urllib.request.Request(f"http://{ep}/v3/maintenance/status", data=b"{}",
                                     method="POST")
        st = json.loads(urllib.request.urlopen(req, timeout=5).read())
        if st.get("leader") == st["header"]["member_id"]:
            return i
    raise RuntimeError("no etcd member leads")


def steps(group: Group) -> list[tuple[float, int]]:
    out = []
    for x in list(group.lines):
        try:
            d = json.loads(x)
        except ValueError:
            continue
        if d["committed"]:
            out.append((d["t"], d["step"]))
    return out


def after(group_steps, at: float, until: float):
    """The longest pause (s) between committed steps across [at, until], and how many."""
    ts = [t for t, _ in group_steps]
    before = [t for t in ts if t <= at]
    inside = [t for t in ts if at < t <= until]
    if not inside:
        return float("inf"), 0
    points = ([before[-1]] if before else []) + inside
    gaps = [b - a for a, b in zip(points, points[1:])] or [inside[0] - at]
    return max(gaps), len(inside)


def report(name: str, groups: list[Group], kills: list[tuple[str, float]], end: float) -> list[str]:
    """Prints the run; returns what failed in it (steps after a kill, restarts, exits)."""
    print(f"== {name}")
    failed = []
    for g_i, g in enumerate(groups):
        s = steps(g)
        ts = [t for t, _ in s]
        med = statistics.median([b - a for a, b in zip(ts, ts[1:])]) if len(ts) > 2 else float("nan")
        exits = g.exits()
        restarted = f"restarted {g.restarts} time(s)" if g.restarts else "restarted: no"
        print(f"  group{g_i}: {len(s)} committed steps, median step {med * 1000:.0f} ms, "
              f"{restarted}, exit {', '.join(map(str, exits))}")
        if g.restarts:
            failed.append(f"group{g_i} restarted {g.restarts} time(s)")
        if exits[-1] != 0:
            failed.append(f"group{g_i} did not finish (exit {exits[-1]})")
        if not s:
            print("    its last lines: " + "".join(g.err[-5:]))
        for i, (what, at) in enumerate(kills):
            until = kills[i + 1][1] if i + 1 < len(kills) else end
            gap, n = after(s, at, until)
            print(f"    after {what}: longest pause {gap * 1000:.0f} ms, {n} steps in "
                  f"{until - at:.1f} s")
            if n == 0:
                failed.append(f"group{g_i}: no step after {what}")
    return failed


def run_rdzv(python: str, rdzv: str, endpoints: list[str], etcd_pids: list[int],
             stop: str) -> list[str]:
    ep = ",".join(endpoints)
    job = f"e2e-{os.getpid()}"
    common = ["lighthouse", "--bind=127.0.0.1:0", "--min_replicas=1", "--join_timeout_ms=1000",
              "--heartbeat_timeout_ms=2000", f"--rdzv-endpoint={ep}", f"--rdzv-id={job}"]
    leader = Proc([rdzv, *common])
    leader.wait_err(r"lighthouse: leading")
    follower = Proc([rdzv, *common])
    addr = follower.wait_err(r"serving on (\S+)")
    groups = [Group(python, i, addr, stop) for i in range(2)]
    failed = []
    kills = []
    if not wait_steps(groups, STEPS):
        failed.append(f"not every group committed {STEPS} steps before the first kill")
    kills.append(("SIGKILL of the leading lighthouse", time.time()))
    leader.p.kill()
    if not wait_steps(groups, STEPS):
        failed.append(f"not every group committed {STEPS} steps after the lighthouse's kill")
    i = raft_leader(endpoints)
    kills.append((f"SIGKILL of etcd's raft leader (member {i})", time.time()))
    os.kill(etcd_pids[i], signal.SIGKILL)
    if not wait_steps(groups, STEPS):
        failed.append(f"not every group committed {STEPS} steps after etcd's leader's kill")
    end = time.time()
    open(stop, "w").close()
    for g in groups:
        try:
            g.procs[-1].p.wait(60)
        except subprocess.TimeoutExpired:
            g.procs[-1].p.kill()
            g.procs[-1].p.wait()
    follower.p.terminate()
    failed += report("rdzv lighthouse (2 processes, 3-member etcd; the managers on the follower)",
                     groups, kills, end)
    for who, lighthouse in (("killed", leader), ("surviving", follower)):
        print(f"  what the {who} lighthouse said:")
        for line in lighthouse.err:
            if "lighthouse:" in line and "serving on" not in line:
                print("    " + line.rstrip())
    return failed


def run_torchft(python: str, stop: str) -> list[str]:
    bindir = os.path.dirname(python)
    lh = Proc([os.path.join(bindir, "torchft_lighthouse"), "--bind=127.0.0.1:0",
               "--min_replicas=1", "--join_timeout_ms=1000", "--heartbeat_timeout_ms=2000"])
    addr = lh.wait_err(r"Lighthouse listening on: (\S+)")
    port = addr.rsplit(":", 1)[1]
    addr = f"http://127.0.0.1:{port}"
    groups = [Group(python, i, addr, stop) for i in range(2)]
    failed = []
    if not wait_steps(groups, STEPS):
        failed.append(f"torchft's baseline: not every group committed {STEPS} steps before "
                      "its Lighthouse's kill")
    kills = [("SIGKILL of torchft's Lighthouse", time.time())]
    lh.p.kill()
    # Its groups cannot get a quorum any more: watched, not waited for, and not restarted.
    time.sleep(PHASE)
    end = time.time()
    open(stop, "w").close()
    for g in groups:
        g.procs[-1].p.kill()
        g.procs[-1].p.wait()
    report("torchft_lighthouse (one process)", groups, kills, end)
    return failed


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("rdzv")
    ap.add_argument("endpoints")
    ap.add_argument("pids")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rdzv-e2e-") as work:
        failed = run_torchft(sys.executable, os.path.join(work, "stop-torchft"))
        failed += run_rdzv(sys.executable, a.rdzv, a.endpoints.split(","),
                           [int(p) for p in a.pids.split(",")], os.path.join(work, "stop-rdzv"))
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
        sys.exit(1)
    print("every group stepped after every kill, none restarted, all finished")


if __name__ == "__main__":
    main()
