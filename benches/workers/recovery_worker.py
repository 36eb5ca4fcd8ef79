"""The recovery benchmark's worker (benches/recovery): DDP on CPU through gloo, a step of about
RECOVERY_STEP_TIME seconds (default 0.05), one rank of which faults once in the job.

Each step is a forward and backward pass of a small model wrapped in DDP (its gradients
all_reduced), then a heartbeat, then the rest of the step's time in "work". RECOVERY_PROGRESS
says how a heartbeat is sent: rdzv (rdzv.heartbeat()), nvrx (NVRx's RankMonitorClient, under
ft_launcher), nvrx-wrapper (the training function runs under NVRx's ``inprocess.Wrapper``,
which restarts it in the same process; a step pings it) or none. With RECOVERY_IN_PROCESS=1
the training function runs under rdzv.inprocess.run (`rdzv run --in-process-restart`): the model is built once per process, and
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
elif progress == "nvrx-wrapper":
    # With LOCAL_RANK set, the Wrapper always adds its GPU, NVLink and NIC health checks
    # (nvidia_resiliency_ext/inprocess/wrap.py), which fail on a machine without NVML.
    os.environ.pop("LOCAL_RANK", None)
    import nvidia_resiliency_ext.inprocess as nvrx_inprocess

    ping = [lambda: None]  # the running call's CallWrapper.ping

    def beat():
        ping[0]()

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


def env_group():
    # A peer that is gone ends a collective when its sockets reset; one frozen does not, and
    # the launcher's bound on leaving (or gloo's own timeout) ends the wait.
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=120))


def train(init_group=env_group):
    global calls
    calls += 1
    init_group()
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


def under_nvrx_wrapper():
    """NVRx 0.7's in-process restart on CPU: the Wrapper keeps its own state in a TCPStore that
    rank 0 serves at MASTER_ADDR:MASTER_PORT; the process groups meet in another one
    (RECOVERY_PG_PORT), under a prefix of their own in each of the Wrapper's iterations. Its
    monitoring polls every 0.1 s, as the launchers here do, and a rank that does not ping for
    the hang timeout (RECOVERY_HANG_TIMEOUT) is restarted (its soft timeout)."""
    td = datetime.timedelta
    hang = float(os.environ.get("RECOVERY_HANG_TIMEOUT", "5"))
    rank0 = int(os.environ["RANK"])
    world0 = int(os.environ["WORLD_SIZE"])
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["RECOVERY_PG_PORT"]), world0,
                         is_master=rank0 == 0, timeout=td(seconds=120), wait_for_workers=False)

    @nvrx_inprocess.Wrapper(
        abort=nvrx_inprocess.abort.AbortTorchDistributed(),
        health_check=None,
        finalize=None,
        initialize=None,
        soft_timeout=td(seconds=hang),
        hard_timeout=td(seconds=hang + 5),
        monitor_thread_interval=td(seconds=0.1),
        monitor_process_interval=td(seconds=0.1),
        progress_watchdog_interval=td(seconds=0.1),
        heartbeat_interval=td(seconds=0.2),
        last_call_wait=td(seconds=0.1),
        store_kwargs={"timeout": td(seconds=60)},
    )
    def wrapped(call_wrapper: nvrx_inprocess.CallWrapper = None):  # found by its annotation
        ping[0] = call_wrapper.ping
        iteration = call_wrapper.iteration

        def iteration_group():
            store = dist.PrefixStore(f"iteration-{iteration}", base)
            dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]),
                                    world_size=int(os.environ["WORLD_SIZE"]),
                                    timeout=td(seconds=120))

        train(iteration_group)

    wrapped()


if progress == "nvrx-wrapper":
    under_nvrx_wrapper()
elif in_process:
    if spare:
        import torch._dynamo  # noqa: F401 - what the wrapper warms a spare up with: ready after it

        write(f"spare-ready-{node}-{os.getpid()}", "")
    inprocess.run(train)
else:
    train()
