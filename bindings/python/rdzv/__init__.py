"""rdzv: elastic-training rendezvous on etcd v3 (Python binding of the rdzv C ABI).

    from rdzv import EtcdV3RendezvousHandler

    with EtcdV3RendezvousHandler.from_url("etcd://127.0.0.1:2379/job1?min_nodes=2&max_nodes=4") as h:
        info = h.next_rendezvous()
        with info.store as store:
            store.set(f"node/{info.rank}", "hello")

The API mirrors ``torch.distributed.elastic.rendezvous``; torch is not needed
(``rdzv.torch_backend`` plugs this into torchrun when it is installed). ``rdzv.Admin`` is an
operator's or scheduler's handle on a run, which never joins it (status, watch, close, purge,
drain).

A worker under ``rdzv run`` reports progress for its hang monitor with ``rdzv.heartbeat()``
and ``rdzv.section(name)`` (``rdzv.progress``; no-ops elsewhere); ``rdzv.fault_tolerance`` has
NVRx's ``RankMonitorClient`` on top of them.
"""

from . import admin
from ._native import Timeout
from .admin import Admin, Joiner, Member, PurgeResult, RunStatus
from .errors import (
    Status,
    RendezvousCancelledError,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousInternalError,
    RendezvousInvalidArgumentError,
    RendezvousShutdownError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from .handler import EtcdV3RendezvousHandler, RendezvousInfo, RendezvousStoreInfo
from .params import ParametersLike, RendezvousParameters

# Under rdzv run, importing progress registers faulthandler for the launcher's stack dumps.
from .progress import heartbeat, is_monitored, section, section_begin, section_end
from .store import Store

__version__ = "0.1.0"


def version() -> str:
    """The version of the loaded C library (``__version__`` is the Python package's)."""
    from ._ffi import lib

    return lib().rdzv_version().decode()


__all__ = [
    "Admin",
    "EtcdV3RendezvousHandler",
    "Joiner",
    "Member",
    "ParametersLike",
    "PurgeResult",
    "RendezvousCancelledError",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousInfo",
    "RendezvousInternalError",
    "RendezvousInvalidArgumentError",
    "RendezvousParameters",
    "RendezvousShutdownError",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "RunStatus",
    "Status",
    "Store",
    "Timeout",
    "heartbeat",
    "is_monitored",
    "section",
    "section_begin",
    "section_end",
    "version",
]
