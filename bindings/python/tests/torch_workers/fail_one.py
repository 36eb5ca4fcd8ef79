"""A plain Python worker (no torch) started by torchrun: records itself in
$RESULT_DIR/<world>-<restart>-<rank>.json as allreduce.py does. On the node given
FAIL_LOCAL_RANK, that local rank then exits 7 once every rank of its world has recorded itself
(every node is running), after writing the time of its exit to $RESULT_DIR/failed. The other
workers wait for the file $RESULT_DIR/release, or HOLD_SECONDS (120 by default) and then exit 4:
they never fail because a peer did, so when a node exits earlier, its agent decided it."""

import json
import os
import sys
import time
from pathlib import Path


def wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # polls files the test and the other workers write
    return True


def main() -> int:
    out = Path(os.environ["RESULT_DIR"])
    hold = float(os.environ.get("HOLD_SECONDS", "120"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    record = {k: os.environ.get(k) for k in ("GROUP_RANK", "LOCAL_RANK", "MASTER_PORT")}
    record.update(rank=rank, world=world, pid=os.getpid(), agent=os.getppid())
    name = f"{world}-{restart}-{rank}.json"
    (out / f".{name}").write_text(json.dumps(record))
    (out / f".{name}").rename(out / name)  # whole files only
    if os.environ.get("FAIL_LOCAL_RANK") == os.environ["LOCAL_RANK"]:
        if not wait_for(lambda: len(list(out.glob(f"{world}-{restart}-*.json"))) == world, hold):
            return 4
        (out / ".failed").write_text(repr(time.time()))
        (out / ".failed").rename(out / "failed")
        return 7
    return 0 if wait_for((out / "release").exists, hold) else 4


if __name__ == "__main__":
    sys.exit(main())
