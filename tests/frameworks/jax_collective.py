"""A multi-process JAX program as it would run under any cluster launcher: it calls
jax.distributed.initialize() with no arguments (under `rdzv run --framework=jax` JAX finds the
coordinator, the process count and its process id in the environment), then checks two
collectives across every process's CPU devices: process_allgather, and a jitted sum of a
global array sharded over all devices (an XLA all-reduce over gloo). It records what it saw in
$RESULT_DIR/<processes>-<restart>-<process id>-<pid>.json (with its agent's pid too, so a test
can kill a node). With HOLD=1 it then stays until the file $RESULT_DIR/release exists or 120 s
pass: that is how a test holds a round open until the agent replaces it (node loss). With
BENCH=1 it prints "FIRST_COLLECTIVE <processes>" once its collectives are done, then goes on
gathering every 0.1 s, as a job in training would, until it is killed or a collective fails
(benches/frameworks/main.rs times those lines)."""

import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P


def main() -> int:
    jax.distributed.initialize()
    me, count = jax.process_index(), jax.process_count()
    # Every process contributes me + 1: the gathered vector is 1..count in process order.
    gathered = multihost_utils.process_allgather(np.array([me + 1.0]), tiled=True)
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    local = np.full((jax.local_device_count(),), me + 1.0)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
    total = float(total.addressable_data(0))
    expected_total = sum((p + 1.0) * jax.local_device_count() for p in range(count))
    ok = list(gathered) == [p + 1.0 for p in range(count)] and total == expected_total
    if os.environ.get("BENCH") == "1":
        print(f"FIRST_COLLECTIVE {count}", flush=True)
        deadline = time.monotonic() + 600  # the benchmark kills the node or closes the run
        while time.monotonic() < deadline:
            multihost_utils.process_allgather(np.array([me + 1.0]), tiled=True)
            time.sleep(0.1)  # a training step's pace, without loading the machine
        return 0
    out = Path(os.environ["RESULT_DIR"])
    record = {k: os.environ.get(k) for k in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
        "JAX_COORDINATOR_ADDRESS", "MASTER_ADDR", "MASTER_PORT")}
    record.update(process=me, processes=count, devices=jax.device_count(),
                  gathered=[float(g) for g in gathered], total=total, ok=ok,
                  pid=os.getpid(), agent=os.getppid())
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    name = f"{count}-{restart}-{me}-{os.getpid()}.json"
    (out / f".{name}").write_text(json.dumps(record))
    (out / f".{name}").rename(out / name)  # whole files only
    if not ok:
        print(f"process {me}: gathered {list(gathered)}, sum {total}", file=sys.stderr)
        return 3
    if os.environ.get("HOLD") == "1":
        deadline = time.monotonic() + 120
        while not (out / "release").exists():
            if time.monotonic() > deadline:
                return 4
            time.sleep(0.1)  # polls a file the test controls; the agent ends us first
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
