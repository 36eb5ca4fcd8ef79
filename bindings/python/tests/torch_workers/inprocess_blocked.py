"""Two processes of one gloo group, driven by test_inprocess_torch.py: ``wrapped`` runs its
function under ``rdzv.inprocess.run`` (its control file is the test's), ``peer`` is a plain
process. After one all_reduce together, one of them is blocked in the next on the other:

- BLOCKED=wrapped: the peer stops taking part (it hangs), the wrapped one all_reduces;
- BLOCKED=peer: the wrapped one steps with ``check()`` only, the peer all_reduces.

Both wrap a model in DDP first (its construction is collective), the wrapped one on a model
it keeps across calls, as a training function does: the DDP reducer, kept alive by the model's
parameters, then keeps the left group's connections open (``destroy_process_group`` does not
close them).

Each writes $OUT/<role>-ready after the first all_reduce; the wrapped one writes
$OUT/wrapped-again when its function is called again, the peer $OUT/peer-failed (the time)
when its blocked all_reduce fails. Both then wait for $OUT/end."""

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import rdzv.inprocess as ip

role = sys.argv[1]
blocked = os.environ["BLOCKED"]
out = Path(os.environ["OUT"])


def mark(name: str, text: str = "") -> None:
    tmp = out / f".{name}"
    tmp.write_text(text)
    tmp.rename(out / name)  # whole files only


def wait_for_end() -> None:
    while not (out / "end").exists():
        time.sleep(0.05)


model = torch.nn.Linear(4, 4)  # kept in the process across calls


def join() -> torch.Tensor:
    # The group's own timeout is far past every bound the test holds the wrapper to.
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
    torch.nn.parallel.DistributedDataParallel(model)
    t = torch.ones(4)
    dist.all_reduce(t)
    mark(f"{role}-ready")
    return t


def wrapped() -> None:
    if ip.restarts() > 0:
        mark("wrapped-again")
        wait_for_end()
        return
    t = join()
    while True:
        ip.check()
        if blocked == "wrapped":
            dist.all_reduce(t)  # the peer never joins it
        else:
            time.sleep(0.01)


if role == "wrapped":
    ip.run(wrapped)
else:
    t = join()
    if blocked == "peer":
        try:
            dist.all_reduce(t)  # the wrapped one never joins it
        except RuntimeError:
            mark("peer-failed", repr(time.time()))
    wait_for_end()
