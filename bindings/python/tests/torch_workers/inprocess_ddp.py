"""A DDP worker (gloo, on CPU) run by ``rdzv.inprocess.run`` under ``rdzv run
--in-process-restart``: it trains a small model step after step, and each time its function
starts, after its first step, records in $RESULT_DIR/<world>-<pid>-<again>.json its pid and its
agent's, how many times it ran again in this process, its rank, the world and when. It returns after 20 steps in a
world of $FINAL_WORLD; in any other world it steps until the round ends (a node lost)."""

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import rdzv.inprocess as ip

out = Path(os.environ["RESULT_DIR"])
final_world = int(os.environ["FINAL_WORLD"])
model = torch.nn.Linear(4, 1)  # built once: kept in the process across rounds


def train() -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    ddp = torch.nn.parallel.DistributedDataParallel(model)  # wrapped again on each round's group
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    world = dist.get_world_size()
    steps = 0
    while True:
        ip.check()
        opt.zero_grad()
        ddp(torch.ones(8, 4)).sum().backward()  # all_reduces the gradients
        opt.step()
        steps += 1
        if steps == 1:
            record = {"ok": True, "pid": os.getpid(), "agent": os.getppid(),
                      "again": ip.restarts(), "rank": dist.get_rank(),
                      "world": world, "t": time.time(),
                      "restart": os.environ["TORCHELASTIC_RESTART_COUNT"]}
            name = f"{world}-{os.getpid()}-{ip.restarts()}.json"
            tmp = out / f".{name}"
            tmp.write_text(json.dumps(record))
            tmp.rename(out / name)
        if world == final_world and steps >= 20:
            break
        time.sleep(0.02)
    dist.destroy_process_group()


ip.run(train)
