"""Runs the heartbeat cost programs of this directory, each not monitored (no
RDZV_PROGRESS_FILE) and monitored (a fresh zeroed page, as ``rdzv run`` makes), and prints one
table: the median ns per call over the repetitions, with the fastest and slowest repetition.
A monitored run's page must then hold every heartbeat and section the program made.
Called by ``scripts/bench.sh --heartbeat``, which builds the programs.

    run.py --reps R --calls N --section-calls M --program NAME=COMMAND... [--nvrx COMMAND]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

BEATS_AT, SECTIONS_AT, SECTION_BYTES, SECTION_COUNT_OFF = 16, 192, 64, 40
KINDS = ("heartbeat", "step", "section")
HEADERS = {"heartbeat": "heartbeat()", "step": "heartbeat(step)", "section": "section begin+end"}


def run(command: list[str], page: Path | None) -> dict[str, list[float]]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RDZV_PROGRESS_FILE", "RDZV_STACKS_FILE")}
    if page is not None:
        page.write_bytes(bytes(4096))
        env["RDZV_PROGRESS_FILE"] = str(page)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    out: dict[str, list[float]] = {}
    for line in done.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "unavailable":
            raise Unavailable(rest)
        if word in ("monitored",) + KINDS:
            out[word] = [float(v) for v in rest.split()]
    return out


class Unavailable(Exception):
    pass


def page_counts(page: Path) -> tuple[int, int]:
    """Beats on the page, and ends of the section "step"."""
    data = page.read_bytes()
    beats = struct.unpack_from("=Q", data, BEATS_AT)[0]
    for slot in range(16):
        at = SECTIONS_AT + slot * SECTION_BYTES
        if data[at:at + 40].split(b"\0", 1)[0] == b"step":
            return beats, struct.unpack_from("=Q", data, at + SECTION_COUNT_OFF)[0]
    return beats, 0


def cell(values: list[float] | None) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--section-calls", type=int, default=200_000)
    ap.add_argument("--program", action="append", default=[], metavar="NAME=COMMAND")
    ap.add_argument("--nvrx", metavar="COMMAND", help="NVRx's client (nvrx.py in its environment)")
    ap.add_argument("--nvrx-unavailable", metavar="REASON")
    args = ap.parse_args()
    counts = [str(args.reps), str(args.calls), str(args.section_calls)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rdzv-heartbeat-") as tmp:
        page = Path(tmp) / "progress"
        for spec in args.program:
            name, _, command = spec.partition("=")
            for monitored in (False, True):
                result = run(shlex.split(command) + counts, page if monitored else None)
                said = result.get("monitored")
                if said != [float(monitored)]:
                    sys.exit(f"{name}: expected monitored {int(monitored)}, it says {said}")
                if monitored:
                    want = (1 + 2 * args.reps * args.calls, args.reps * args.section_calls)
                    got = page_counts(page)
                    if got != want:
                        sys.exit(f"{name}: the page holds (beats, step ends) {got}, not {want}")
                rows.append((name, "monitored" if monitored else "not monitored", result))
    nvrx_note = None
    if args.nvrx:
        # About 20 us a heartbeat: a fiftieth of the calls takes about as long.
        nvrx_counts = [str(args.reps), str(max(1, args.calls // 50)),
                       str(max(1, args.section_calls // 50))]
        try:
            result = run(shlex.split(args.nvrx) + nvrx_counts, None)
            rows.append(("NVRx 0.7.0 RankMonitorClient", "monitored", result))
        except Unavailable as e:
            nvrx_note = f"NVRx 0.7.0 RankMonitorClient: not measured: {e}"
    elif args.nvrx_unavailable:
        nvrx_note = f"NVRx 0.7.0 RankMonitorClient: not measured: {args.nvrx_unavailable}"

    width = max(len(r[0]) for r in rows) if rows else 10
    print(f"median ns per call over {args.reps} repetitions (fastest-slowest repetition); "
          f"{args.calls} heartbeats and {args.section_calls} section pairs a repetition "
          f"({args.calls // 50} and {args.section_calls // 50} for NVRx)")
    print(f"{'':{width}}  {'mode':13}  " + "  ".join(f"{HEADERS[k]:22}" for k in KINDS))
    for name, mode, result in rows:
        cells = "  ".join(f"{cell(result.get(k)):22}" for k in KINDS)
        print(f"{name:{width}}  {mode:13}  {cells}")
    if nvrx_note:
        print(nvrx_note)


if __name__ == "__main__":
    main()
