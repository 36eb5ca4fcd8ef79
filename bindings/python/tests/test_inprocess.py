"""rdzv.inprocess's side of the control file, driven as the launcher drives it: a leave ends
the function (``check()`` raises ``Restart``), the wrapper answers and runs it again with the
next round's environment; an exception the launcher does not follow with a leave is the
function's own; outside ``rdzv run --in-process-restart`` the function runs once. The launcher
itself is tested with it in cli/tests/launcher/inprocess.rs and cli/tests/launcher_torch.rs."""

import json
import os
import threading
from pathlib import Path

import pytest

import rdzv.inprocess as ip


@pytest.fixture
def control(tmp_path, monkeypatch):
    path = tmp_path / "inprocess.json"
    monkeypatch.setenv(ip.CONTROL_FILE_ENV, str(path))
    monkeypatch.setattr(ip, "_control", None)
    monkeypatch.setattr(ip, "_running", -1)
    monkeypatch.setattr(ip, "_restarts", 0)
    monkeypatch.setattr(ip, "_answered", -1)
    return path


def write(path: Path, **control) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(control))
    os.replace(tmp, path)


def answered(path: Path) -> str:
    left = path.with_name(path.name + ".left")
    return left.read_text() if left.exists() else ""


def test_a_leave_ends_the_function_which_runs_again_with_the_next_rounds_environment(control, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    write(control, generation=0, state="run", env={"RANK": "0", "WORLD_SIZE": "1"})
    seen = []
    first_running = threading.Event()

    def train():
        seen.append((os.environ["RANK"], os.environ["WORLD_SIZE"], ip.restarts()))
        if len(seen) == 1:
            first_running.set()
            while True:
                ip.check()
        return "done"

    result = []
    worker = threading.Thread(target=lambda: result.append(ip.run(train)))
    worker.start()
    assert first_running.wait(10)
    write(control, generation=1, state="leave")
    for _ in range(1000):
        if answered(control) == "1":
            break
        threading.Event().wait(0.01)
    assert answered(control) == "1", "the wrapper answers the leave"
    write(control, generation=2, state="run", env={"RANK": "3", "WORLD_SIZE": "4"})
    worker.join(10)
    assert result == ["done"]
    assert seen == [("0", "1", 0), ("3", "4", 1)]


def test_a_leave_asked_before_the_function_started_in_its_round_is_answered(control):
    # A spare waits for its first round; the round handed to it ends before it looked.
    calls = []
    result = []
    worker = threading.Thread(target=lambda: result.append(ip.run(lambda: calls.append(1) or "done")))
    worker.start()
    write(control, generation=4, state="leave")
    for _ in range(1000):
        if answered(control) == "4":
            break
        threading.Event().wait(0.01)
    assert answered(control) == "4", "the waiting wrapper answers the leave"
    assert calls == []
    write(control, generation=5, state="run", env={})
    worker.join(10)
    assert result == ["done"] and calls == [1]


def test_an_exception_without_a_leave_is_the_functions_own(control, monkeypatch):
    monkeypatch.setenv("RDZV_INPROCESS_GRACE", "0.1")
    write(control, generation=0, state="run", env={})

    def train():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        ip.run(train)
    assert answered(control) == ""


def test_an_exception_that_a_leave_follows_runs_the_function_again(control, monkeypatch):
    # A collective fails a moment before the launcher learns that its peer is gone.
    monkeypatch.setenv("RDZV_INPROCESS_GRACE", "10")
    write(control, generation=0, state="run", env={})
    calls = []

    def train():
        calls.append(1)
        if len(calls) == 1:
            threading.Timer(0.2, lambda: write(control, generation=1, state="leave")).start()
            threading.Timer(
                0.5, lambda: write(control, generation=2, state="run", env={})
            ).start()
            raise RuntimeError("Connection reset by peer")
        return len(calls)

    assert ip.run(train) == 2
    assert answered(control) == "1"


def test_outside_rdzv_run_the_function_runs_once(monkeypatch):
    monkeypatch.delenv(ip.CONTROL_FILE_ENV, raising=False)
    monkeypatch.setattr(ip, "_control", None)
    assert not ip.enabled()
    ip.check()  # nothing to do
    assert ip.run(lambda x: x + 1, 1) == 2
