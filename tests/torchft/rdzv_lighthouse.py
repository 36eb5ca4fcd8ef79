"""A pytest plugin that runs torchft's own tests with `rdzv lighthouse` in place of torchft's
in-process Lighthouse: `torchft._torchft.LighthouseServer` becomes a class that starts
lighthouse processes (two by default) serving one job on etcd, and hands out the address of
the last one started, a follower, so every call goes through forwarding to the leader.

Loaded with `-p rdzv_lighthouse` by scripts/torchft-test.sh, which sets:
  RDZV_LIGHTHOUSE_BIN   the rdzv command
  RDZV_LIGHTHOUSE_ETCD  the etcd endpoint (HOST:PORT)
  RDZV_LIGHTHOUSES      how many lighthouse processes per LighthouseServer (default 2)
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from typing import List, Optional

import torchft._torchft as _torchft

RDZV = os.environ["RDZV_LIGHTHOUSE_BIN"]
ETCD = os.environ["RDZV_LIGHTHOUSE_ETCD"]
COUNT = int(os.environ.get("RDZV_LIGHTHOUSES", "2"))
STARTUP_S = 30.0


def _die_with_parent() -> None:
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class _Process:
    """One `rdzv lighthouse` process; its stderr is copied to ours, and watched for the lines
    that say where it serves and that it leads."""

    def __init__(self, argv: List[str]) -> None:
        # Dies with the test process (some tests never shut their server down; torchft's,
        # in-process, ends with it).
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, preexec_fn=_die_with_parent)
        self.address: Optional[str] = None
        self.serving = threading.Event()
        self.leading = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            sys.stderr.write(line)
            m = re.search(r"serving on (\S+)", line)
            if m and self.address is None:
                self.address = m.group(1)
                self.serving.set()
            if "lighthouse: leading" in line:
                self.leading.set()
        self.serving.set()  # ended: whoever waits sees no address

    def wait(self, event: threading.Event, what: str) -> None:
        if not event.wait(STARTUP_S) or self.proc.poll() is not None:
            raise RuntimeError(f"rdzv lighthouse did not say it is {what} within {STARTUP_S} s "
                               f"(exit status {self.proc.poll()})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LighthouseServer:
    """`rdzv lighthouse` processes serving one job on etcd, in place of torchft's Lighthouse.

    Args:
        bind: the address the first lighthouse binds (the others take any free port)
        min_replicas: the minimum number of replica groups of a quorum
        join_timeout_ms: how long to wait for heartbeating stragglers
        quorum_tick_ms: how often to look for a quorum while waiting
        heartbeat_timeout_ms: how long without a heartbeat before a replica group is dead
    """

    def __init__(self, bind: str, min_replicas: int, join_timeout_ms: Optional[int] = None,
                 quorum_tick_ms: Optional[int] = None,
                 heartbeat_timeout_ms: Optional[int] = None) -> None:
        flags = [f"--min_replicas={min_replicas}"]
        for name, value in (("join_timeout_ms", join_timeout_ms),
                            ("quorum_tick_ms", quorum_tick_ms),
                            ("heartbeat_timeout_ms", heartbeat_timeout_ms)):
            if value is not None:
                flags.append(f"--{name}={value}")
        job = f"torchft-{uuid.uuid4().hex[:12]}"
        self._processes: List[_Process] = []
        try:
            for i in range(COUNT):
                where = bind if i == 0 else re.sub(r":\d+$", ":0", bind)
                p = _Process([RDZV, "lighthouse", f"--bind={where}", *flags,
                              f"--rdzv-endpoint={ETCD}", f"--rdzv-id={job}",
                              "--rdzv-conf=lease_ttl=2"])
                self._processes.append(p)
                p.wait(p.serving, "serving")
                if i == 0:
                    # The first leads: the address handed out is then a follower's.
                    p.wait(p.leading, "leading")
        except BaseException:
            self.shutdown()
            raise

    def address(self) -> str:
        """The address of the last lighthouse started (a follower).

        Args:
            (none)
        """
        address = self._processes[-1].address
        assert address is not None
        return address

    def shutdown(self) -> None:
        """Stops every lighthouse process of this server.

        Args:
            (none)
        """
        for p in self._processes:
            p.stop()


_torchft.LighthouseServer = LighthouseServer  # type: ignore[misc]
