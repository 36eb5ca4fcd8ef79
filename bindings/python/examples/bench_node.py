"""One rendezvous node in Python, for the multi-process benchmark (benches/processes/main.rs
with --python): connects, prints ``ready``, waits for a line on stdin, calls
``next_rendezvous`` and prints the CLOCK_MONOTONIC times of the call and the return in
nanoseconds, then shuts down."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rdzv import EtcdV3RendezvousHandler  # noqa: E402


def main() -> None:
    with EtcdV3RendezvousHandler.from_url(sys.argv[1]) as handler:
        print("ready", flush=True)
        sys.stdin.readline()
        called = time.monotonic_ns()
        info = handler.next_rendezvous()
        returned = time.monotonic_ns()
        print(json.dumps({"called": called, "returned": returned, "rank": info.rank}), flush=True)
        info.store.close()


if __name__ == "__main__":
    main()
