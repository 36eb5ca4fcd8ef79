"""heartbeat.c's measurement through the Python binding (``rdzv.heartbeat()``,
``rdzv.heartbeat(step=i)``, ``rdzv.section_begin`` and ``rdzv.section_end``); same arguments and
output. The time of the Python loop around the calls is included, as in a program."""

from __future__ import annotations

import sys
import time
from typing import Callable

import rdzv


def timed(reps: int, calls: int, body: Callable[[int], None]) -> list[float]:
    out = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        body(calls)
        out.append((time.perf_counter_ns() - start) / calls)
    return out


def main() -> None:
    reps, calls, section_calls = (int(a) for a in sys.argv[1:4])
    heartbeat, begin, end = rdzv.heartbeat, rdzv.section_begin, rdzv.section_end

    def beats(n: int) -> None:
        for _ in range(n):
            heartbeat()

    def steps(n: int) -> None:
        for i in range(n):
            heartbeat(step=i)

    def sections(n: int) -> None:
        for _ in range(n):
            begin("step")
            end("step")

    heartbeat()
    print(f"monitored {int(rdzv.is_monitored())}")
    for what, body, n in (("heartbeat", beats, calls), ("step", steps, calls),
                          ("section", sections, section_calls)):
        print(what, " ".join(f"{ns:.3f}" for ns in timed(reps, n, body)))


if __name__ == "__main__":
    main()
