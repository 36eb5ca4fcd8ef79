"""The recovery benchmark's worker (benches/recovery): DDP on CPU through gloo, a step of about
RECOVERY_STEP_TIME seconds (default 0.05), one rank of which faults once in the job.

Each step is a forward and backward pass of a small model wrapped in DDP (its gradients
all_reduced), then a heartbeat, then the rest of the step's time in "work". RECOVERY_PROGRESS
says how a heartbeat is sent: rdzv (rdzv.heartbeat()), nvrx (NVRx's RankMonitorClient, under
ft_launcher) or none. With RECOVERY_IN_PROCESS=1 the training function runs under
rdzv.inprocess.run (`rdzv run --in-process-restart`): the model is built once per process, and
the function is called again, in the same process, for each new round.

Rank RECOVERY_FAULT_RANK faults at its step RECOVERY_FAULT_STEP, or at its first step after
that once the benchmark has created RECOVERY_DIR/armed (it does once the job is at rest: with
spares, once each node's spare is ready), once in the job (the first to create
RECOVERY_DIR/faulted): with RECOVERY_FAULT=crash it exits 1, with hang it stops stepping
(no heartbeat, no collective: its peers block in the next all_reduce). Just before, it writes
RECOVERY_DIR/fault with the wall-clock time. Faults of a whole node (a SIGKILL of every process,
a SIGSTOP) are the benchmark's own.

Every worker writes RECOVERY_DIR/pid-NODE-PID when it starts (so that the benchmark can signal
every process of node RECOVERY_NODE), and each time its function took a first step in a
process group, RECOVERY_DIR/first-NODE-PID-N.json (N: the function's calls so far in this
process): its rank, world size, restart count and the wall-clock time of that step. A spare
(``rdzv run --in-process-spare``) writes RECOVERY_DIR/spare-ready-NODE-PID once it has imported
what it imports and is about to wait for a place. Files are whole (written, then renamed). The
workers stop at the first step at which one of them sees RECOVERY_DIR/done (agreed through an
all_reduce: a rank that stopped alone would leave its peers blocked in their next collective).
"""

import json
import os
import time

out = os.environ["RECOVERY_DIR"]
node = os.environ["RECOVERY_NODE"]
fault = os.environ.get("RECOVERY_FAULT", "none")
fault_rank = int(os.environ.get("RECOVERY_FAULT_RANK", "-1"))
fault_step = int(os.environ.get("RECOVERY_FAULT_STEP", "20"))
progress = os.environ.get("RECOVERY_PROGRESS", "none")
in_process = os.environ.get("RECOVERY_IN_PROCESS") == "1"
step_time = float(os.environ.get("RECOVERY_STEP_TIME", "0.05"))
done = os.path.join(out, "done")
armed = os.path.join(out, "armed")
spare = os.environ.get("RDZV_INPROCESS_SPARE") == "1"


def write(name, text):
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)  # whole files only


def first_to(name):
    """Whether this process is the first in the job to claim `name`."""
    try:
        os.close(os.open(os.path.join(out, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


write(f"pid-{node}-{os.getpid()}", "")

import datetime  # noqa: E402: the pid file comes before any import that takes long

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if progress == "rdzv":
    import rdzv

    beat = rdzv.heartbeat
elif progress == "nvrx":
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    beat = client.send_heartbeat
else:

    def beat():
        pass


if in_process:
    import rdzv.inprocess as inprocess

    check = inprocess.check
else:

    def check():
        pass


model = torch.nn.Linear(64, 64)  # kept across calls of train() in one process
calls = 0


def train():
    global calls
    calls += 1
    # A peer that is gone ends a collective when its sockets reset; one frozen does not, and
    # the launcher's bound on leaving (or gloo's own timeout) ends the wait.
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=120))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.001)
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = 0
    stop = torch.zeros(1)
    while True:
        began = time.monotonic()
        check()
        stop[0] = float(os.path.exists(done))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        opt.zero_grad()
        ddp(torch.ones(8, 64)).sum().backward()
        opt.step()
        beat()
        steps += 1
        if steps == 1:
            first = {"rank": rank, "world": world, "t": time.time(), "call": calls,
                     "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
            write(f"first-{node}-{os.getpid()}-{calls}.json", json.dumps(first))
        due = rank == fault_rank and steps >= fault_step and fault != "none"
        if due and os.path.exists(armed) and first_to("faulted"):
            write("fault", json.dumps({"t": time.time(), "pid": os.getpid(), "node": node}))
            if fault == "crash":
                os._exit(1)
            while not os.path.exists(done):
                time.sleep(0.05)  # hung: no heartbeat, no collective
            os._exit(0)
        time.sleep(max(0.0, step_time - (time.monotonic() - began)))
    dist.destroy_process_group()


if in_process:
    if spare:
        import torch._dynamo  # noqa: F401 - what the wrapper warms a spare up with: ready after it

        write(f"spare-ready-{node}-{os.getpid()}", "")
    inprocess.run(train)
else:
    train()
