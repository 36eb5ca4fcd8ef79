"""A worker started by torchrun (or rdzv run): joins the gloo group through the environment
(MASTER_ADDR/MASTER_PORT), checks an all_reduce on every rank and records what it saw in
$RESULT_DIR/<world>-<restart>-<rank>.json (with its pid and its agent's, so a test can kill a
node). With WAIT_UNLESS_WORLD=N it then stays, until the file $RESULT_DIR/release exists or
120 s pass, whenever the world is not of size N: that is how a test holds a round open until
the agent replaces it (grow, node loss)."""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> int:
    out = Path(os.environ["RESULT_DIR"])
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    record = {k: os.environ.get(k) for k in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")}
    record.update(rank=rank, world=world, sum=t.item(), ok=t.item() == expected,
                  pid=os.getpid(), agent=os.getppid())
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    name = f"{world}-{restart}-{rank}.json"
    (out / f".{name}").write_text(json.dumps(record))
    (out / f".{name}").rename(out / name)  # whole files only
    if t.item() != expected:
        print(f"rank {rank}: all_reduce gave {t.item()}, expected {expected}", file=sys.stderr)
        return 3
    wanted = os.environ.get("WAIT_UNLESS_WORLD")
    if wanted and int(wanted) != world:
        deadline = time.monotonic() + 120
        while not (out / "release").exists():
            if time.monotonic() > deadline:
                return 4
            time.sleep(0.1)  # polls a file the test controls; the agent ends us first
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
