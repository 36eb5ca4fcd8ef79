"""A Lightning training script as it would run under torchrun: DDP on CPU (gloo) for a tiny
linear model, a few steps on random data, with the process layout on its command line
(--devices N --num-nodes M, as one writes it for torchrun; without them, LOCAL_WORLD_SIZE and
GROUP_WORLD_SIZE, so that a benchmark can shrink the world). Lightning finds torchrun's
environment itself (its TorchElasticEnvironment: RANK, WORLD_SIZE, MASTER_ADDR, ...). Each
process records in $RESULT_DIR/<world>-<rank>.json the world Lightning trained in, the
environment Lightning detected, the steps taken, and whether every rank ended with the same
weights (DDP's all_reduce of the gradients keeps them equal). With BENCH=1 it prints
"FIRST_COLLECTIVE <world>" once its first step (and so its first gradient all_reduce) is done,
and goes on training (a step every 0.1 s) until it is killed or a collective fails
(benches/frameworks/main.rs times those lines)."""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

STEPS = 5


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.stepped = False

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_batch_end(self, *_):
        if os.environ.get("BENCH") == "1":
            if not self.stepped:
                print(f"FIRST_COLLECTIVE {self.trainer.world_size}", flush=True)
            time.sleep(0.1)  # a training step's pace, without loading the machine
        self.stepped = True

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=int(os.environ["LOCAL_WORLD_SIZE"]))
    parser.add_argument("--num-nodes", type=int, default=int(os.environ["GROUP_WORLD_SIZE"]))
    args = parser.parse_args()
    # Each rank draws different data: equal weights afterwards show the gradients were reduced.
    torch.manual_seed(int(os.environ.get("RANK", "0")))
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    model = Tiny()
    bench = os.environ.get("BENCH") == "1"
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=args.devices,
                        num_nodes=args.num_nodes, max_steps=6000 if bench else STEPS,
                        max_epochs=-1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=8))
    if bench:
        return 0
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(trainer.world_size)]
    dist.all_gather(gathered, weights)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    env = trainer.strategy.cluster_environment
    record = {
        "rank": trainer.global_rank, "world": trainer.world_size,
        "node_rank": trainer.node_rank, "local_rank": trainer.local_rank,
        "environment": type(env).__name__, "steps": trainer.global_step,
        "same_weights": same, "backend": dist.get_backend(),
        "RANK": os.environ.get("RANK"), "WORLD_SIZE": os.environ.get("WORLD_SIZE"),
    }
    record["ok"] = same and trainer.global_step == STEPS
    out = Path(os.environ["RESULT_DIR"])
    name = f"{trainer.world_size}-{trainer.global_rank}.json"
    (out / f".{name}").write_text(json.dumps(record))
    (out / f".{name}").rename(out / name)  # whole files only
    # Lightning leaves the process group up; ending it on every rank before exiting keeps a
    # rank that exits first from pulling gloo's connections from under the others.
    dist.barrier()
    dist.destroy_process_group()
    return 0 if record["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
