"""One rank of a gloo group under ``rdzv.inprocess.run``, driven by test_inprocess_torch.py
through its control file ($CONTROL): its function marks $OUT/enter-<RANK> with the time it was
called and the environment's TORCHELASTIC_USE_AGENT_STORE, all_reduces its rank + 1 with the
others, marks $OUT/sum-<RANK> with the result, and returns."""

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import rdzv.inprocess as ip

out = Path(os.environ["OUT"])


def mark(name: str, text: str) -> None:
    tmp = out / f".{name}"
    tmp.write_text(text)
    tmp.rename(out / name)  # whole files only


def train() -> None:
    rank = os.environ["RANK"]
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE")
    mark(f"enter-{rank}", json.dumps({"t": time.time(), "agent_store": agent_store}))
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    t = torch.tensor([float(rank) + 1])
    dist.all_reduce(t)
    dist.destroy_process_group()
    mark(f"sum-{rank}", str(t.item()))


ip.run(train)
