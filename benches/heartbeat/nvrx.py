"""NVRx 0.7.0's ``RankMonitorClient.send_heartbeat()`` and ``start_section``/``end_section``
pair, measured as heartbeat.c measures rdzv's (same arguments and output; "monitored" is the
only mode NVRx has: a client that is not connected to its rank monitor raises). Started as
``ft_launcher`` starts a worker's monitor: ``RankMonitorServer.run_in_subprocess`` with a fork
context, a socket per rank in ``FT_RANK_MONITOR_IPC_SOCKET``, NVRx's default configuration
(heartbeats and section messages sent without waiting for an answer) with a timeout for the
section "step" (NVRx sends nothing for a section its configuration does not name). No GPU is
needed: the monitor's GPU health check turns itself off without NVML.

If NVRx cannot run here, prints ``unavailable REASON`` and exits 0."""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time


def main() -> None:
    reps, calls, section_calls = (int(a) for a in sys.argv[1:4])
    sock = os.path.join(tempfile.mkdtemp(prefix="nvrx-bench-"), "rmon0.socket")
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                       "FT_RANK_MONITOR_IPC_SOCKET": sock})
    try:
        from nvidia_resiliency_ext.fault_tolerance import (
            FaultToleranceConfig,
            RankMonitorClient,
            RankMonitorServer,
        )
    except Exception as e:  # noqa: BLE001: the reason is the output
        print(f"unavailable importing nvidia_resiliency_ext.fault_tolerance failed: {e!r}")
        return
    cfg = FaultToleranceConfig()
    cfg.rank_section_timeouts = {"step": 600.0}
    try:
        server = RankMonitorServer.run_in_subprocess(
            cfg=cfg, ipc_socket_path=sock, mp_ctx=multiprocessing.get_context("fork"),
            env={"LOCAL_RANK": "0", "FT_RANK_MONITOR_IPC_SOCKET": sock})
    except Exception as e:  # noqa: BLE001
        print(f"unavailable its rank monitor did not start: {e!r}")
        return
    try:
        client = RankMonitorClient()
        try:
            client.init_workload_monitoring()
            client.send_heartbeat()
        except Exception as e:  # noqa: BLE001
            print(f"unavailable the client could not connect to its rank monitor: {e!r}")
            return
        print("monitored 1")
        out = []
        for _ in range(reps):
            start = time.perf_counter_ns()
            for _ in range(calls):
                client.send_heartbeat()
            out.append((time.perf_counter_ns() - start) / calls)
        print("heartbeat", " ".join(f"{ns:.3f}" for ns in out))
        out = []
        for _ in range(reps):
            start = time.perf_counter_ns()
            for _ in range(section_calls):
                client.start_section("step")
                client.end_section("step")
            out.append((time.perf_counter_ns() - start) / section_calls)
        print("section", " ".join(f"{ns:.3f}" for ns in out))
        sys.stdout.flush()
        client.shutdown_workload_monitoring()
    finally:
        server.terminate()
        server.join(10)


if __name__ == "__main__":
    main()
