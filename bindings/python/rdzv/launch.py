"""A programmatic launch on rdzv's agent: torch's ``elastic_launch``, with rdzv's hang monitor,
health check and job-wide restart budget.

torchx, Lightning and Ray launch through ``torch.distributed.launcher.api``::

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    results = elastic_launch(LaunchConfig(...), train)(*args)

The same call from this module runs the workers under ``rdzv run`` (``docs/LAUNCHER.md``)::

    from rdzv.launch import LaunchConfig, elastic_launch
    results = elastic_launch(LaunchConfig(min_nodes=1, max_nodes=2, nproc_per_node=4,
                                          rdzv_backend="etcd-v3", rdzv_endpoint="etcd:2379",
                                          run_id="job42"), train)(lr)

It takes torch's ``LaunchConfig`` as well as this module's (the same fields and defaults, no
torch needed), returns this node's workers' return values by global rank, and raises torch's
``ChildFailedError`` (this module's stand-in without torch) naming each failed rank with its
exit code and error file when the job fails. rdzv's own flags (``--hang-timeout 5m``,
``--health-check CMD``, ...) go in ``rdzv_args``.

How a function runs: its worker is ``python -m rdzv._launched DIR``, started by ``rdzv run``.
As with torch's ``spawn`` start method, the function and its arguments are pickled, and the
worker first prepares itself as ``multiprocessing`` does (this process's ``sys.path``,
working directory and main module, run as ``__mp_main__``): the function must be importable
by name, and a script that launches must do so under ``if __name__ == "__main__":``. A
function's return value is pickled into DIR, and read here once ``rdzv run`` has succeeded.
An exception is written to the worker's ``TORCHELASTIC_ERROR_FILE`` in torch's form (as its
``@record`` does), which is what ``ChildFailedError`` then shows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

__all__ = [
    "LaunchConfig",
    "LaunchError",
    "elastic_launch",
    "launch_agent",
    "ChildFailedError",
    "ProcessFailure",
]

# torch's placeholder for a failure without an error file.
_NOT_AVAILABLE = "<N/A>"


@dataclasses.dataclass
class LaunchConfig:
    """torch's ``LaunchConfig``: the same fields and defaults, without torch. ``logs_specs``
    may be torch's ``DefaultLogsSpecs`` (its log directory, redirects, tee and rank filter are
    used); ``metrics_cfg`` and ``numa_options`` have no effect under rdzv (``rdzv_args`` takes
    ``--numa-binding``)."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    logs_specs: Any = None
    run_id: str = ""
    role: str = "default_role"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "etcd"
    rdzv_configs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    rdzv_timeout: int = -1
    max_restarts: int = 3
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    log_line_prefix_template: Optional[str] = None
    metrics_cfg: Dict[str, str] = dataclasses.field(default_factory=dict)
    local_addr: Optional[str] = None
    event_log_handler: str = "null"
    numa_options: Any = None
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    duplicate_stdout_filters: Optional[List[str]] = None
    duplicate_stderr_filters: Optional[List[str]] = None
    virtual_local_rank: bool = False
    shutdown_timeout: Optional[int] = None

    def __post_init__(self) -> None:
        # As torch's: an explicit rdzv_timeout wins, else 900 s unless the configs name one.
        if self.rdzv_timeout != -1:
            self.rdzv_configs["timeout"] = self.rdzv_timeout
        elif "timeout" not in self.rdzv_configs:
            self.rdzv_configs["timeout"] = 900


class LaunchError(RuntimeError):
    """``rdzv run`` ended without success and without a failure of this node's workers to
    report (the job failed on another node, the rendezvous timed out or was closed, a
    signal): ``exit_code`` is its status; what happened is on its stderr."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclasses.dataclass
class _StandInFailure:
    """torch's ``ProcessFailure``, when torch is not installed."""

    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    message: str = ""
    timestamp: int = 0

    def signal_name(self) -> str:
        if self.exitcode >= 0:
            return _NOT_AVAILABLE
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return _NOT_AVAILABLE


class _StandInChildFailedError(Exception):
    """torch's ``ChildFailedError``, when torch is not installed: ``name`` (the entry point)
    and ``failures`` (global rank to failure, the root cause first)."""

    def __init__(self, name: str, failures: Dict[int, _StandInFailure]):
        if not failures:
            raise AssertionError("a ChildFailedError needs at least one failure")
        self.name = name
        self.failures = failures
        super().__init__(self.format_msg())

    def get_first_failure(self) -> tuple:
        rank = min(self.failures, key=lambda r: self.failures[r].timestamp)
        return rank, self.failures[rank]

    def format_msg(self) -> str:
        lines = [f"{self.name} FAILED"]
        for rank, f in self.failures.items():
            how = f"exitcode {f.exitcode}"
            if f.exitcode < 0:
                how += f" ({f.signal_name()})"
            lines.append(f"  rank {rank} (local rank {f.local_rank}, pid {f.pid}): {how}: "
                         f"{f.message or 'no error file'}")
        return "\n".join(lines)


def _torch_errors() -> Optional[Any]:
    try:
        from torch.distributed.elastic.multiprocessing import errors
    except ImportError:
        return None
    return errors


def __getattr__(name: str) -> Any:
    # torch's classes when torch is there (so that `except ChildFailedError` catches both),
    # else the stand-ins; resolved on first use, so importing this module imports no torch.
    if name in ("ChildFailedError", "ProcessFailure"):
        errors = _torch_errors()
        if errors is not None:
            return getattr(errors, name)
        return {"ChildFailedError": _StandInChildFailedError,
                "ProcessFailure": _StandInFailure}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _failure(record: Dict[str, Any]) -> Any:
    error_file = record.get("error_file") or _NOT_AVAILABLE
    errors = _torch_errors()
    if errors is not None:
        # torch's reads the error file (message, timestamp) itself.
        return errors.ProcessFailure(local_rank=record["local_rank"], pid=record["pid"],
                                     exitcode=record["exitcode"], error_file=error_file)
    return _StandInFailure(local_rank=record["local_rank"], pid=record["pid"],
                           exitcode=record["exitcode"], error_file=error_file,
                           message=record.get("message") or "",
                           timestamp=record.get("timestamp") or 0)


def _child_failed(name: str, failures: Dict[int, Any]) -> BaseException:
    errors = _torch_errors()
    if errors is not None:
        return errors.ChildFailedError(name=name, failures=failures)
    return _StandInChildFailedError(name, failures)


def _entrypoint_name(entrypoint: Union[Callable[..., Any], str], args: Sequence[Any]) -> str:
    # torch's rule: a function's name; for the interpreter, the first argument not a flag.
    if callable(entrypoint):
        return getattr(entrypoint, "__name__", repr(entrypoint))
    if entrypoint == sys.executable:
        return next((str(a) for a in args if not str(a).startswith("-")), "")
    return entrypoint


def _seconds(value: float) -> str:
    return f"{value:g}"


def _std(value: Any, flag: str) -> List[str]:
    """torch's ``Std`` (or a dict of local rank to ``Std``) as ``--redirects``/``--tee``."""
    if isinstance(value, dict):
        if not value:
            return []
        text = ",".join(f"{rank}:{int(std)}" for rank, std in sorted(value.items()))
    else:
        if int(value) == 0:
            return []
        text = str(int(value))
    return [flag, text]


def _logs_flags(logs_specs: Any) -> List[str]:
    """What torch's ``DefaultLogsSpecs`` asks for, from its attributes."""
    if logs_specs is None:
        return []
    flags: List[str] = []
    root = getattr(logs_specs, "_root_log_dir", None)
    if root:
        flags += ["--log-dir", str(root)]
    flags += _std(getattr(logs_specs, "_redirects", 0) or 0, "--redirects")
    flags += _std(getattr(logs_specs, "_tee", 0) or 0, "--tee")
    ranks = getattr(logs_specs, "_local_ranks_filter", None)
    if ranks:
        flags += ["--local-ranks-filter", ",".join(str(r) for r in sorted(ranks))]
    return flags


def command_line(config: Any, rdzv_args: Sequence[str] = ()) -> List[str]:
    """The ``rdzv run`` flags (everything before the program) for a ``LaunchConfig``, torch's
    or this module's. Raises ``ValueError`` naming a field that cannot be given."""
    min_nodes, max_nodes = int(config.min_nodes), int(config.max_nodes)
    if not 1 <= min_nodes <= max_nodes:
        raise ValueError(f"LaunchConfig.min_nodes/max_nodes: expected 1 <= min_nodes <= "
                         f"max_nodes, got {min_nodes} and {max_nodes}")
    nnodes = str(min_nodes) if min_nodes == max_nodes else f"{min_nodes}:{max_nodes}"
    flags = ["--nnodes", nnodes, "--nproc-per-node", str(int(config.nproc_per_node)),
             "--rdzv-backend", str(config.rdzv_backend), "--role", str(config.role),
             "--max-restarts", str(int(config.max_restarts)),
             "--monitor-interval", _seconds(float(config.monitor_interval))]
    # Given only when not the default, which rdzv run takes without a note.
    for flag, value, default in (("--start-method", config.start_method, "spawn"),
                                 ("--event-log-handler", config.event_log_handler, "null"),
                                 ("--signals-to-handle", config.signals_to_handle,
                                  "SIGTERM,SIGINT,SIGHUP,SIGQUIT")):
        if value and str(value) != default:
            flags += [flag, str(value)]
    if config.rdzv_endpoint:
        flags += ["--rdzv-endpoint", str(config.rdzv_endpoint)]
    if config.run_id:
        flags += ["--rdzv-id", str(config.run_id)]
    # Both LaunchConfigs put rdzv_timeout into rdzv_configs["timeout"] when made.
    configs = dict(config.rdzv_configs or {})
    if configs:
        flags += ["--rdzv-conf", ",".join(f"{k}={_conf_value(k, v)}" for k, v in configs.items())]
    if config.local_addr:
        flags += ["--local-addr", str(config.local_addr)]
    if config.log_line_prefix_template:
        flags += ["--log-line-prefix-template", str(config.log_line_prefix_template)]
    if config.duplicate_stdout_filters:
        flags += ["--duplicate-stdout-filters", ",".join(config.duplicate_stdout_filters)]
    if config.duplicate_stderr_filters:
        flags += ["--duplicate-stderr-filters", ",".join(config.duplicate_stderr_filters)]
    if getattr(config, "virtual_local_rank", False):
        flags.append("--virtual-local-rank")
    if getattr(config, "shutdown_timeout", None) is not None:
        flags += ["--shutdown-timeout", _seconds(float(config.shutdown_timeout))]
    flags += _logs_flags(getattr(config, "logs_specs", None))
    return flags + [str(a) for a in rdzv_args]


def _conf_value(key: str, value: Any) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if "," in text:
        raise ValueError(f"LaunchConfig.rdzv_configs[{key!r}]: a value cannot hold a comma, "
                         f"got {text!r}")
    return text


def _write(path: Path, data: bytes) -> None:
    """Writes `data` whole: a temporary file beside `path`, renamed onto it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _stop(proc: "subprocess.Popen[bytes]", grace: float) -> None:
    """Ends the launcher as a scheduler would: SIGTERM (it stops its workers), then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def launch_agent(config: Any, entrypoint: Union[Callable[..., Any], str], args: Sequence[Any],
                 rdzv_args: Sequence[str] = ()) -> Dict[int, Any]:
    """Runs ``entrypoint(*args)`` (or the command ``entrypoint args...``) in every worker of
    this node under ``rdzv run`` and returns each one's return value by global rank (``None``
    for a command). Raises ``ChildFailedError`` when this node's workers failed the job,
    ``LaunchError`` when ``rdzv run`` failed otherwise."""
    from .__main__ import find_command

    name = _entrypoint_name(entrypoint, args)
    flags = command_line(config, rdzv_args)
    work = Path(tempfile.mkdtemp(prefix="rdzv-launch-"))
    try:
        if callable(entrypoint):
            import multiprocessing.spawn

            # Plain data the worker needs before it can unpickle the function.
            prep = multiprocessing.spawn.get_preparation_data("rdzv-launch")
            prep.pop("authkey", None)
            _write(work / "prepare.pkl", pickle.dumps(prep))
            _write(work / "call.pkl", pickle.dumps((entrypoint, tuple(args))))
            program = [sys.executable, "-u", "-m", "rdzv._launched", str(work)]
        else:
            program = [str(entrypoint), *(str(a) for a in args)]
        outcome = work / "outcome.json"
        events, metrics = work / "events.jsonl", work / "metrics.jsonl"
        command = [str(find_command()), "run", *flags, "--outcome-file", str(outcome),
                   "--events-file", str(events), "--metrics-file", str(metrics),
                   "--no-python", *program]
        env = dict(os.environ)
        # The worker imports this very package before it can prepare the rest of sys.path.
        here = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        from . import events as _events

        proc = subprocess.Popen(command, env=env)
        # The job's events reach rdzv.events' handlers, and torch's when torch is loaded.
        stop_following = _events._follow(events, metrics)
        grace = float(getattr(config, "shutdown_timeout", None) or 30) + 10
        try:
            status = proc.wait()
        except BaseException:
            # Ctrl-C reaches the launcher too (same process group); anything else stops it.
            _stop(proc, grace)
            raise
        finally:
            if stop_following is not None:
                stop_following()
        return _result(work, outcome, status, name, callable(entrypoint))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _result(work: Path, outcome_file: Path, status: int, name: str,
            function: bool) -> Dict[int, Any]:
    try:
        outcome = json.loads(outcome_file.read_text())
    except (OSError, ValueError):
        outcome = None
    if outcome is None:
        raise LaunchError(f"rdzv run ended with status {status} before its agent ran "
                          "(its error is above, on stderr)", status)
    if status == 0:
        values: Dict[int, Any] = {}
        for rank in outcome["ranks"]:
            g = int(rank["global_rank"])
            result = work / f"result-{g}.pkl"
            values[g] = pickle.loads(result.read_bytes()) if function and result.exists() else None
        return values
    failures = [f for f in outcome["failures"] if not f.get("stopped")]
    if failures:
        raise _child_failed(name, {int(f["global_rank"]): _failure(f) for f in failures})
    signum = -status if status < 0 else status - 128
    if signum > 0:
        raise LaunchError(f"rdzv run was stopped by {_signal_name(signum)}", status)
    raise LaunchError(f"rdzv run ended with status {status} without a failure of this node's "
                      "workers (the job failed elsewhere, or the rendezvous did; see its "
                      "stderr)", status)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class elastic_launch:  # noqa: N801 - torch's name, so that a call site changes only its import
    """``elastic_launch(config, entrypoint)(*args)``: torch's call, on rdzv's agent. Returns
    this node's workers' return values by global rank."""

    def __init__(self, config: Any, entrypoint: Union[Callable[..., Any], str, None] = None,
                 rdzv_args: Sequence[str] = ()):
        if entrypoint is None:
            raise ValueError("elastic_launch: entrypoint: expected a function or a command, "
                             "got None")
        self._config = config
        self._entrypoint = entrypoint
        self._rdzv_args = tuple(rdzv_args)

    def __call__(self, *args: Any) -> Dict[int, Any]:
        return launch_agent(self._config, self._entrypoint, list(args), self._rdzv_args)
