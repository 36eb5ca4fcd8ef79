"""A DeepSpeed training script as it would run under torchrun: ZeRO stage 1 (optimizer state
partitioned across ranks) on CPU over gloo, a tiny linear model, a few steps on random data.
DeepSpeed finds torchrun's environment itself (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT). Each process records in $RESULT_DIR/<world>-<rank>.json the world it trained
in, the steps taken, and whether every rank ended with the same weights (ZeRO-1 all-gathers
the updated partitions). With BENCH=1 it prints "FIRST_COLLECTIVE <world>" once its first step
is done and goes on training (a step every 0.1 s) until it is killed or a collective fails
(benches/frameworks/main.rs times those lines)."""

import json
import os
import sys
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

STEPS = 5
CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_optimization": {"stage": 1},
    # Plain torch.optim.SGD: DeepSpeed's fused optimizers need its C++ ops (and a compiler).
    "zero_allow_untested_optimizer": True,
}


def main() -> int:
    rank = int(os.environ["RANK"])
    torch.manual_seed(rank)  # different data on every rank
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Linear(8, 1)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=CONFIG)
    torch.manual_seed(rank + 1)
    bench = os.environ.get("BENCH") == "1"
    for step in range(6000 if bench else STEPS):
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        if bench:
            if step == 0:
                print(f"FIRST_COLLECTIVE {dist.get_world_size()}", flush=True)
            time.sleep(0.1)  # a training step's pace, without loading the machine
    if bench:
        return 0
    weights = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
    world = dist.get_world_size()
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    record = {"rank": dist.get_rank(), "world": world, "steps": engine.global_steps,
              "zero_stage": engine.zero_optimization_stage(), "same_weights": same,
              "backend": dist.get_backend()}
    record["ok"] = same and engine.global_steps == STEPS
    out = Path(os.environ["RESULT_DIR"])
    name = f"{world}-{record['rank']}.json"
    (out / f".{name}").write_text(json.dumps(record))
    (out / f".{name}").rename(out / name)  # whole files only
    dist.barrier()
    dist.destroy_process_group()
    return 0 if record["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
