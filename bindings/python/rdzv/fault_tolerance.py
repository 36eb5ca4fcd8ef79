"""NVRx's ``RankMonitorClient`` on rdzv's progress page: a worker written for
nvidia-resiliency-ext's fault tolerance (``ft_launcher``) runs under ``rdzv run`` by changing
one import::

    # from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    from rdzv.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.load_state_dict(checkpoint.get("ft_state", {}))
    for step in ...:
        client.start_section("step")
        ...
        client.end_section("step")
        client.send_heartbeat()
    client.calculate_and_set_hb_timeouts()
    checkpoint["ft_state"] = client.state_dict()

It has the public methods and attributes of NVRx 0.7.0's ``RankMonitorClient``. Where NVRx
sends a message over a socket to a rank monitor process (about 20 us a heartbeat), this makes
the few stores of ``rdzv.heartbeat()`` and ``rdzv.section_begin()``/``section_end()`` (well
under a microsecond), and ``rdzv run`` watches the page.

What differs from NVRx:

- Timeouts are the launcher's: ``rdzv run --hang-timeout`` and ``--section-timeout
  name=SECONDS``, or ``auto``, with which the launcher learns them job-wide from the intervals
  it sees on every worker's page. So ``calculate_and_set_hb_timeouts`` and
  ``calculate_and_set_section_timeouts`` are accepted and return ``True`` as NVRx's do once
  they have set timeouts, ``hb_timeouts`` and ``section_timeouts`` stay ``None``, and
  ``state_dict()`` holds no timeouts (``load_state_dict`` accepts NVRx's state and keeps it
  unused).
- Every section is seen (NVRx skips names its configuration gives no timeout). Names are 1 to
  39 bytes of UTF-8; sections nest, and the same name may be open twice.
- ``init_workload_monitoring()`` works outside ``rdzv run`` too (no rank monitor is needed):
  the calls then do nothing, as ``rdzv.heartbeat()`` does.
- ``send_workload_control_request`` raises ``RuntimeError``, as NVRx does without
  ``ft_launcher``: ``rdzv run`` takes no requests from its workers (``rdzv drain`` removes a
  node, ``rdzv close`` ends the run).
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any, Collection, Dict, List, Mapping, Optional

from . import progress
from .errors import RendezvousError

__all__ = [
    "RankMonitorClient",
    "RankMonitorClientError",
    "WorkloadAction",
    "WorkloadControlRequest",
]

_heartbeat = progress.heartbeat
_pause = progress.pause
_section_begin = progress.section_begin
_section_end = progress.section_end


class RankMonitorClientError(Exception):
    """A call made before ``init_workload_monitoring()``, or a section the library refused
    (its ``__cause__`` is the ``rdzv`` error)."""


class WorkloadAction(Enum):
    """NVRx's actions a rank may request from its launcher (``rdzv run`` takes none)."""

    Continue = 0
    ExcludeThisNode = 1
    ShutdownWorkload = 2


class WorkloadControlRequest:
    """NVRx's request of a rank to its launcher: an action and a description."""

    def __init__(self, action: WorkloadAction, description: str = "<not set>") -> None:
        self.action = action
        self.description = description

    def __str__(self) -> str:
        return f"WorkloadControlRequest(action={self.action}, description={self.description})"


class RankMonitorClient:
    """NVRx's ``RankMonitorClient``, reporting to ``rdzv run`` through the progress page."""

    CURRENT_TIMEOUTS_STATE_KEY = "current_timeouts"

    def __init__(self) -> None:
        self.is_initialized = False
        # NVRx's attributes. The timeouts are the launcher's, so they stay None here.
        self.rank_info: Any = None
        self.rank_monitor_socket: Any = None
        self.timeouts_calc: Any = None
        self.hb_timeouts: Any = None
        self.section_timeouts: Any = None
        self.loaded_hb_timeouts: Any = None
        self.loaded_section_timeouts: Any = None
        self.chkpt_manager: Any = None
        self.iter_idx = 0
        self.cfg: Any = None
        self.launcher_connector: Any = None
        self.logger = logging.getLogger(__name__)
        self._open: List[str] = []  # sections this client opened, for end_all_sections

    def _ensure_is_ready(self) -> None:
        if not self.is_initialized:
            raise RankMonitorClientError("RankMonitorClient is not initialized")

    def init_workload_monitoring(self, num_warmup_iters: Optional[int] = None) -> None:
        """Starts reporting. ``num_warmup_iters`` is accepted: ``rdzv run`` leaves the first
        heartbeats of every attempt out of what it learns."""
        if self.is_initialized:
            raise RankMonitorClientError("RankMonitorClient is already initialized")
        self.is_initialized = True

    def shutdown_workload_monitoring(self) -> None:
        """Stops reporting: hang monitoring pauses (``rdzv.progress.pause()``) until the next
        heartbeat or section, so what the program does after it is never called a hang."""
        self.is_initialized = False
        _pause()

    def send_heartbeat(self) -> None:
        """One heartbeat (``rdzv.heartbeat()``)."""
        if not self.is_initialized:
            raise RankMonitorClientError("RankMonitorClient is not initialized")
        _heartbeat()

    def start_section(self, section: str) -> None:
        """Opens the section ``section`` (``rdzv.section_begin``)."""
        self._ensure_is_ready()
        try:
            _section_begin(section)
        except (RendezvousError, TypeError) as e:
            raise RankMonitorClientError(
                f"RankMonitorClient could not open section {section!r}: {e}"
            ) from e
        self._open.append(section)

    def end_section(self, section: str) -> None:
        """Closes the section ``section``, which must be open (``rdzv.section_end``)."""
        self._ensure_is_ready()
        try:
            _section_end(section)
        except (RendezvousError, TypeError) as e:
            raise RankMonitorClientError(
                f"RankMonitorClient could not close section {section!r}: {e}"
            ) from e
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i] == section:
                del self._open[i]
                break

    def end_all_sections(self) -> None:
        """Closes every section this client opened; nothing if none is open."""
        self._ensure_is_ready()
        while self._open:
            name = self._open.pop()
            try:
                _section_end(name)
            except RendezvousError:
                pass  # closed already through rdzv.section_end

    def calculate_and_set_hb_timeouts(self, skip_if_not_ready: bool = False) -> bool:
        """Accepted, returns ``True``: ``rdzv run --hang-timeout auto`` learns the heartbeat
        timeout job-wide from every worker's page."""
        self._ensure_is_ready()
        return True

    def calculate_and_set_section_timeouts(
        self,
        selected_sections: Optional[Collection[str]] = None,
        calc_out_of_section: bool = True,
        skip_if_not_ready: bool = False,
    ) -> bool:
        """Accepted, returns ``True``: ``rdzv run --section-timeout NAME=auto`` learns section
        timeouts job-wide from every worker's page."""
        self._ensure_is_ready()
        return True

    def state_dict(self) -> Mapping[str, Any]:
        """NVRx's state, with no calculated timeouts in it (the launcher keeps those)."""
        state: Dict[str, Any] = {self.CURRENT_TIMEOUTS_STATE_KEY: {}}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Accepts a state of ``state_dict()`` (NVRx's too); its timeouts are kept, unused."""
        timeouts = state.get(self.CURRENT_TIMEOUTS_STATE_KEY, {})
        self.loaded_hb_timeouts = timeouts.get("heartbeat")
        self.loaded_section_timeouts = timeouts.get("section")

    def send_workload_control_request(self, req: WorkloadControlRequest) -> None:
        """Raises ``RuntimeError``, as NVRx does without ``ft_launcher``: ``rdzv run`` takes no
        requests from its workers (``rdzv drain`` and ``rdzv close`` are the operator's)."""
        raise RuntimeError(
            f"IPC connection with the launcher is not available: rdzv run takes no workload "
            f"control requests ({req})"
        )
