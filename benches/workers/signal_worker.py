"""The launcher benchmark's worker for a signalled launcher: it notes when a signal reaches it.

SIGNAL_WORKER_DIR is a directory of the worker's node. Once its handlers are in place the
worker writes SIGNAL_WORKER_DIR/ready-LOCAL_RANK. On the first SIGTERM or SIGINT it writes the
wall-clock time (time.time(), the first thing its handler does) and the signal's name to
SIGNAL_WORKER_DIR/got-LOCAL_RANK, then dies of that signal as a worker with the default
handlers would (Python's SIGINT ends in KeyboardInterrupt, which a training script rarely
catches).

Without a signal it exits 0 once the file named by PEER_WORKER_DONE exists (checked every
50 ms), or after PEER_WORKER_LIFETIME seconds (default 600).
"""

import os
import signal
import time

rank = os.environ["LOCAL_RANK"]
out = os.environ["SIGNAL_WORKER_DIR"]
done = os.environ.get("PEER_WORKER_DONE")
ends = time.monotonic() + float(os.environ.get("PEER_WORKER_LIFETIME", "600"))


def write(name, text):
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)  # whole files only


def got(signum, _frame):
    at = time.time()
    write(f"got-{rank}", f"{at!r} {signal.Signals(signum).name}\n")
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


signal.signal(signal.SIGTERM, got)
signal.signal(signal.SIGINT, got)
write(f"ready-{rank}", "")

# A sleep is cut short by a signal (its handler runs at once); the loop only bounds the life.
while not (done is not None and os.path.exists(done)) and time.monotonic() < ends:
    time.sleep(0.05)
