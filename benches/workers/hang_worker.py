"""The launcher benchmark's worker for a hang: a gloo job on CPU that steps, one rank of which
hangs once in the job.

Each step is a small all_reduce through torch.distributed (gloo, init from the launcher's
environment), then a heartbeat, then HANG_WORKER_STEP_TIME seconds (default 0.05) of "work".
HANG_WORKER_PROGRESS says how a heartbeat is sent:
  rdzv   rdzv.heartbeat() (the Python binding: PYTHONPATH and RDZV_LIBRARY reach it)
  nvrx   NVRx's RankMonitorClient: init_workload_monitoring() before the process group,
         send_heartbeat() each step (under ft_launcher)
  none   no heartbeat (a launcher without hang detection)

Rank HANG_WORKER_RANK hangs after the heartbeat of step HANG_WORKER_STEP (after the warm-up),
once in the job: the first to create HANG_WORKER_DIR/hung hangs, later attempts step on. Just
before hanging it writes the wall-clock time (time.time()) and its pid to HANG_WORKER_DIR/hang;
then it sleeps (only the end of the run, below, ends it). Its peers block in the next
all_reduce, as ranks of a real job do.

Every worker writes HANG_WORKER_DIR/pid-PID when it starts (so that the benchmark can end what
a launcher left behind), and once its first all_reduce completed, HANG_WORKER_DIR/first-PID:
one JSON object with its rank, world size and the wall-clock times of its start, of `import
torch` done, of the process group's init done and of the first step. Files are whole (written
then renamed).

HANG_WORKER_HOW says how it hangs: sleep (time.sleep, the default), c (in C holding the GIL:
libc's usleep through ctypes.PyDLL), stop (SIGSTOP to itself). With HANG_WORKER_SECTIONS=1
(and rdzv's progress), every all_reduce is the section "allreduce".

A worker exits 0 once the file named by PEER_WORKER_DONE exists (checked each step, and every
50 ms while hung), or after PEER_WORKER_LIFETIME seconds (default 300); the process group's
timeout is that lifetime too, so peers blocked on the hung rank end with it.
"""

import ctypes
import json
import os
import time

start = time.time()
out = os.environ["HANG_WORKER_DIR"]
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
progress = os.environ.get("HANG_WORKER_PROGRESS", "none")
hang_rank = int(os.environ.get("HANG_WORKER_RANK", "-1"))
hang_step = int(os.environ.get("HANG_WORKER_STEP", "20"))
step_time = float(os.environ.get("HANG_WORKER_STEP_TIME", "0.05"))
done = os.environ.get("PEER_WORKER_DONE")
lifetime = float(os.environ.get("PEER_WORKER_LIFETIME", "300"))
how = os.environ.get("HANG_WORKER_HOW", "sleep")
sections = os.environ.get("HANG_WORKER_SECTIONS") == "1" and progress == "rdzv"
ends = time.monotonic() + lifetime


def write(name, text):
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)  # whole files only


def finished():
    return (done is not None and os.path.exists(done)) or time.monotonic() > ends


write(f"pid-{os.getpid()}", "")

import datetime  # noqa: E402: the times above are taken before any import that takes long

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

imported = time.time()

if progress == "rdzv":
    import rdzv

    beat = rdzv.heartbeat
    if sections:
        _all_reduce = dist.all_reduce

        def all_reduce(t):
            with rdzv.section("allreduce"):
                _all_reduce(t)

        dist.all_reduce = all_reduce
elif progress == "nvrx":
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    beat = client.send_heartbeat
else:

    def beat():
        pass


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=lifetime))
initialized = time.time()

tensor = torch.ones(16)
step = 0
while not finished():
    dist.all_reduce(tensor)
    beat()
    if step == 0:
        times = {"rank": rank, "world": world, "start": start, "imported": imported,
                 "initialized": initialized, "stepped": time.time()}
        write(f"first-{os.getpid()}", json.dumps(times))
    if rank == hang_rank and step == hang_step:
        try:
            os.close(os.open(os.path.join(out, "hung"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass  # hung once already: this attempt steps on
        else:
            write("hang", f"{time.time()!r} {os.getpid()}\n")
            if how == "stop":
                import signal

                os.kill(os.getpid(), signal.SIGSTOP)  # only a SIGKILL ends it
            in_c = ctypes.PyDLL(None).usleep if how == "c" else None
            while not finished():
                # hung: no heartbeat, no collective, only the end to notice
                if in_c is not None:
                    in_c(50000)
                else:
                    time.sleep(0.05)
            break
    step += 1
    time.sleep(step_time)
