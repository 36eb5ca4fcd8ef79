"""The job's events and metrics from ``rdzv run --events-file`` and ``--metrics-file``
(docs/EVENTS.md), in Python: read from their files, or handed, as they are written, to the
handlers a program plugs in, as torch's are.

    import rdzv.events

    rdzv.events.add_handler(lambda e: print(e.name, e.metadata["state"]))
    rdzv.launch.elastic_launch(config, train)()   # each event reaches the handler

``rdzv.launch`` follows the files of the ``rdzv run`` it starts: every event goes to the
handlers added here and, when torch is installed, to torch's own ``events.record`` (as an
``Event``), and every metric to torch's ``metrics.put_metric``, so the handlers a program
configured for torch (``torch.distributed.elastic.events``' logging handler,
``torch.distributed.elastic.metrics.configure``) get them as under torch's agent.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

__all__ = ["Event", "Metric", "add_handler", "add_metric_handler", "read_events",
           "read_metrics", "remove_handler", "remove_metric_handler"]


@dataclass
class Event:
    """One event, as torch's ``torch.distributed.elastic.events.Event``: ``source`` is
    ``"AGENT"`` or ``"WORKER"``, ``timestamp`` milliseconds since the epoch."""

    name: str
    source: str
    timestamp: int = 0
    metadata: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Metric:
    """One metric, as torch's ``MetricData``: ``timestamp`` in seconds."""

    timestamp: int
    group: str
    name: str
    value: int


_handlers: List[Callable[[Event], None]] = []
_metric_handlers: List[Callable[[Metric], None]] = []


def add_handler(handler: Callable[[Event], None]) -> None:
    """Calls ``handler(event)`` for each event of the jobs ``rdzv.launch`` starts."""
    _handlers.append(handler)


def remove_handler(handler: Callable[[Event], None]) -> None:
    _handlers.remove(handler)


def add_metric_handler(handler: Callable[[Metric], None]) -> None:
    """Calls ``handler(metric)`` for each metric of the jobs ``rdzv.launch`` starts."""
    _metric_handlers.append(handler)


def remove_metric_handler(handler: Callable[[Metric], None]) -> None:
    _metric_handlers.remove(handler)


def _event(line: Dict[str, Any]) -> Event:
    return Event(str(line["name"]), str(line["source"]), int(line.get("timestamp", 0)),
                 dict(line.get("metadata") or {}))


def _metric(line: Dict[str, Any]) -> Metric:
    return Metric(int(line.get("timestamp", 0)), str(line.get("group", "torchelastic")),
                  str(line["name"]), int(line["value"]))


def _lines(path: Path) -> Iterator[Dict[str, Any]]:
    with open(path) as f:
        for text in f:
            if text.strip():
                yield json.loads(text)


def read_events(path: "str | Path") -> List[Event]:
    """Every event of an ``--events-file``."""
    return [_event(line) for line in _lines(Path(path))]


def read_metrics(path: "str | Path") -> List[Metric]:
    """Every metric of a ``--metrics-file``."""
    return [_metric(line) for line in _lines(Path(path))]


def _to_torch_event(event: Event) -> None:
    torch_events = sys.modules.get("torch.distributed.elastic.events")
    if torch_events is None:
        return
    source = torch_events.EventSource[event.source]
    torch_events.record(torch_events.Event(event.name, source, event.timestamp, event.metadata))


def _to_torch_metric(metric: Metric) -> None:
    torch_metrics = sys.modules.get("torch.distributed.elastic.metrics")
    if torch_metrics is None:
        return
    torch_metrics.put_metric(metric.name, metric.value, metric.group)


def _deliver_event(event: Event) -> None:
    for handler in list(_handlers):
        handler(event)
    _to_torch_event(event)


def _deliver_metric(metric: Metric) -> None:
    for handler in list(_metric_handlers):
        handler(metric)
    _to_torch_metric(metric)


class _Follower:
    """Hands the lines of a file to ``deliver`` as they are appended, on a thread of its own,
    until ``stop()``, which delivers the rest first."""

    def __init__(self, path: Path, deliver: Callable[[Dict[str, Any]], None]) -> None:
        self.path = path
        self.deliver = deliver
        self.offset = 0
        self.partial = ""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                text = f.read()
                self.offset = f.tell()
        except OSError:
            return
        text = self.partial + text
        *lines, self.partial = text.split("\n")
        for line in lines:
            if line.strip():
                try:
                    self.deliver(json.loads(line))
                except Exception as e:  # noqa: BLE001 - a handler's error must not stop the job
                    print(f"rdzv.events: a handler failed: {e!r}", file=sys.stderr)

    def _run(self) -> None:
        while not self.done.wait(0.1):
            self._drain()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self._drain()


def _follow(events: Path, metrics: Path) -> Optional[Callable[[], None]]:
    """Starts following the two files when anyone listens (a handler here, or torch imported);
    returns what stops following, or None."""
    torch_loaded = "torch.distributed.elastic.events" in sys.modules
    if not (_handlers or _metric_handlers or torch_loaded):
        return None
    followers = [_Follower(events, lambda line: _deliver_event(_event(line))),
                 _Follower(metrics, lambda line: _deliver_metric(_metric(line)))]

    def stop() -> None:
        for f in followers:
            f.stop()

    return stop
