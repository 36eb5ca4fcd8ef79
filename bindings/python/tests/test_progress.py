"""Progress (heartbeats, sections, stack dumps) and the NVRx-compatible RankMonitorClient.

The library maps the progress page on a process's first progress call, from
RDZV_PROGRESS_FILE as it is then, so the monitored cases run in a child Python with the page
in its environment; the test reads the page at the offsets core/src/progress/layout.rs documents.
Stack dumps are checked with a real signal sent to a real child."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import PKG_ROOT, dies_with_this_process
import rdzv
from rdzv import progress
from rdzv.errors import RendezvousInvalidArgumentError
from rdzv.fault_tolerance import RankMonitorClient, RankMonitorClientError

MAGIC_AT, VERSION_PID_AT, BEATS_AT, LAST_BEAT_AT, STEP_AT = 0, 8, 16, 24, 32
STACK_SIGNAL_AT, OPEN_DEPTH_AT, OPEN_NAME_AT, PAUSED_AT = 56, 72, 88, 136
SECTIONS_AT, SECTION_BYTES, SECTION_COUNT_OFF = 192, 64, 40

outside_rdzv_run = pytest.mark.skipif(
    "RDZV_PROGRESS_FILE" in os.environ, reason="RDZV_PROGRESS_FILE is set: under rdzv run"
)


class Page:
    """A zeroed progress page, as the launcher makes one, and its words."""

    def __init__(self, path: Path):
        self.path = path
        path.write_bytes(bytes(4096))

    def word(self, offset: int) -> int:
        return struct.unpack_from("=Q", self.path.read_bytes(), offset)[0]

    def name(self, offset: int, size: int) -> str:
        return self.path.read_bytes()[offset:offset + size].split(b"\0", 1)[0].decode()

    def sections(self) -> dict[str, int]:
        """Ended sections: name -> count."""
        out = {}
        for slot in range(16):
            at = SECTIONS_AT + slot * SECTION_BYTES
            count = self.word(at + SECTION_COUNT_OFF)
            if count:
                out[self.name(at, 40)] = count
        return out


@pytest.fixture
def page(tmp_path: Path) -> Page:
    return Page(tmp_path / "progress")


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RDZV_PROGRESS_FILE", "RDZV_STACKS_FILE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PKG_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def run_child(code: str, **extra: str) -> str:
    """Runs ``code`` in a child Python with ``extra`` in its environment; its stdout."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=child_env(**extra),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"child failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


# --------------------------------------------------------------------------------------------
# Outside rdzv run (this process)
# --------------------------------------------------------------------------------------------


def test_public_names():
    for name in ("heartbeat", "section", "section_begin", "section_end", "is_monitored"):
        assert name in rdzv.__all__ and getattr(rdzv, name) is getattr(progress, name)


@outside_rdzv_run
def test_outside_rdzv_run_every_call_is_a_no_op():
    assert rdzv.is_monitored() is False
    rdzv.heartbeat()
    rdzv.heartbeat(step=0)
    rdzv.heartbeat(step=2**63 - 1)
    for _ in range(2):  # the first call with a name asks the library, later ones do not
        rdzv.section_begin("step")
        rdzv.section_end("step")
    rdzv.section_end("never-open")  # only checked under rdzv run
    with rdzv.section("forward") as s:
        assert s.name == "forward"

    @rdzv.section("decorated")
    def decorated(x: int) -> int:
        return x + 1

    assert decorated(1) == 2


@outside_rdzv_run
def test_bad_steps_and_names_raise_everywhere():
    for step in (-1, -(2**63)):
        with pytest.raises(RendezvousInvalidArgumentError, match="step"):
            rdzv.heartbeat(step=step)
    for bad in ("", "x" * 40):
        with pytest.raises(RendezvousInvalidArgumentError, match="section name"):
            rdzv.section_begin(bad)
        with pytest.raises(RendezvousInvalidArgumentError, match="section name"):
            rdzv.section_end(bad)
        with pytest.raises(RendezvousInvalidArgumentError):
            with rdzv.section(bad):
                pass
    rdzv.section_begin("x" * 39)
    rdzv.section_begin("é" * 19)  # 38 bytes of UTF-8
    with pytest.raises(RendezvousInvalidArgumentError, match="NUL"):
        rdzv.section_begin("a\0b")
    with pytest.raises(TypeError):
        rdzv.section_begin(b"step")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rdzv.section(3)  # type: ignore[arg-type]
    for step in (2**63, 2**64, -(2**64) + 5):  # ctypes would wrap them into range
        with pytest.raises(RendezvousInvalidArgumentError, match="step"):
            rdzv.heartbeat(step=step)
    with pytest.raises(TypeError, match="step"):
        rdzv.heartbeat(step=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="step"):
        rdzv.heartbeat(step="3")  # type: ignore[arg-type]

    class Index:  # an integer of another type (numpy's, say)
        def __index__(self) -> int:
            return 5

    rdzv.heartbeat(step=Index())  # type: ignore[arg-type]
    rdzv.heartbeat(step=True)


@outside_rdzv_run
def test_rank_monitor_client_outside_rdzv_run():
    client = RankMonitorClient()
    with pytest.raises(RankMonitorClientError, match="not initialized"):
        client.send_heartbeat()
    with pytest.raises(RankMonitorClientError, match="not initialized"):
        client.start_section("step")
    client.init_workload_monitoring(num_warmup_iters=3)
    with pytest.raises(RankMonitorClientError, match="already initialized"):
        client.init_workload_monitoring()
    client.send_heartbeat()
    client.start_section("step")
    client.end_section("step")
    client.end_all_sections()
    with pytest.raises(RuntimeError, match="rdzv run takes no workload control requests"):
        from rdzv.fault_tolerance import WorkloadAction, WorkloadControlRequest

        request = WorkloadControlRequest(WorkloadAction.ExcludeThisNode)
        client.send_workload_control_request(request)
    client.shutdown_workload_monitoring()
    assert client.is_initialized is False


# NVRx 0.7.0's RankMonitorClient: its public methods and attributes
# (nvidia_resiliency_ext/fault_tolerance/rank_monitor_client.py).
NVRX_METHODS = {
    "calculate_and_set_hb_timeouts", "calculate_and_set_section_timeouts", "end_all_sections",
    "end_section", "init_workload_monitoring", "load_state_dict", "send_heartbeat",
    "send_workload_control_request", "shutdown_workload_monitoring", "start_section",
    "state_dict",
}
NVRX_ATTRIBUTES = {
    "CURRENT_TIMEOUTS_STATE_KEY", "cfg", "chkpt_manager", "hb_timeouts", "is_initialized",
    "iter_idx", "launcher_connector", "loaded_hb_timeouts", "loaded_section_timeouts", "logger",
    "rank_info", "rank_monitor_socket", "section_timeouts", "timeouts_calc",
}


def test_rank_monitor_client_has_nvrx_public_names():
    client = RankMonitorClient()
    public = {n for n in dir(client) if not n.startswith("_")}
    assert not (NVRX_METHODS | NVRX_ATTRIBUTES) - public
    assert RankMonitorClient.CURRENT_TIMEOUTS_STATE_KEY == "current_timeouts"
    assert issubclass(RankMonitorClientError, Exception)


# --------------------------------------------------------------------------------------------
# Under rdzv run (a child with the page)
# --------------------------------------------------------------------------------------------


def test_heartbeats_steps_and_sections_reach_the_page(page: Page):
    out = run_child("""
        import pytest, rdzv
        from rdzv.errors import RendezvousInvalidArgumentError
        assert rdzv.is_monitored()
        rdzv.heartbeat()
        rdzv.heartbeat()
        rdzv.heartbeat(step=41)  # the page holds step + 1
        with pytest.raises(RendezvousInvalidArgumentError):
            rdzv.heartbeat(step=-1)  # refused: not counted
        with pytest.raises(RendezvousInvalidArgumentError, match="no section .*never-open"):
            rdzv.section_end("never-open")
        for _ in range(2):
            rdzv.section_begin("step")
            rdzv.section_end("step")
        with rdzv.section("ckpt"):
            pass
        @rdzv.section("forward")
        def forward():
            return 7
        assert forward() == 7
        with pytest.raises(ValueError):
            with rdzv.section("boom"):
                raise ValueError("the block's exception is the one seen")
        rdzv.section_begin("outer")
        rdzv.section_begin("inner")  # left open: depth 2, innermost "inner"
        print("ok")
    """, RDZV_PROGRESS_FILE=str(page.path))
    assert out.strip() == "ok"
    assert page.name(MAGIC_AT, 8) == "RDZVPRG1"
    assert page.word(VERSION_PID_AT) & 0xFFFFFFFF == 1
    assert page.word(BEATS_AT) == 3
    assert page.word(LAST_BEAT_AT) > 0
    assert page.word(STEP_AT) == 42
    assert page.word(OPEN_DEPTH_AT) == 2
    assert page.name(OPEN_NAME_AT, 48) == "inner"
    assert page.sections() == {"step": 2, "ckpt": 1, "forward": 1, "boom": 1}
    assert page.word(STACK_SIGNAL_AT) == 0  # no RDZV_STACKS_FILE: no stack dumps


def test_pause_lasts_until_the_next_heartbeat_and_the_exit_pauses_by_itself(page: Page):
    out = run_child("""
        import os, struct, rdzv
        def paused():
            with open(os.environ["RDZV_PROGRESS_FILE"], "rb") as f:
                return struct.unpack_from("=Q", f.read(), 136)[0] != 0
        rdzv.heartbeat()
        assert not paused()
        rdzv.progress.pause()
        assert paused()
        rdzv.heartbeat()
        assert not paused(), "a heartbeat resumes"
        # A forked child that exits leaves its parent watched.
        pid = os.fork()
        if pid == 0:
            import sys
            sys.exit(0)
        os.waitpid(pid, 0)
        assert not paused(), "a child's exit paused its parent"
        print("ok")
    """, RDZV_PROGRESS_FILE=str(page.path))
    assert out.strip() == "ok"
    # The interpreter's exit paused it, after the last heartbeat.
    assert page.word(PAUSED_AT) >= page.word(LAST_BEAT_AT) > 0


def test_a_page_that_cannot_be_mapped_is_not_monitored(tmp_path: Path):
    out = run_child("""
        import rdzv
        rdzv.heartbeat(); rdzv.heartbeat(step=1)
        with rdzv.section("step"):
            pass
        print(rdzv.is_monitored())
    """, RDZV_PROGRESS_FILE=str(tmp_path / "absent"), RDZV_STACKS_FILE=str(tmp_path / "stacks"))
    assert out.strip() == "False"
    assert not (tmp_path / "stacks").exists()


def test_stack_dumps_land_in_the_stacks_file_on_the_registered_signal(page: Page, tmp_path: Path):
    stacks = tmp_path / "stacks"
    code = textwrap.dedent("""
        import sys, threading
        import rdzv  # registers faulthandler, nothing else needed
        def waiting_in_a_recognizable_frame(event):
            event.wait(120)
        event = threading.Event()
        threading.Thread(target=waiting_in_a_recognizable_frame, args=(event,), daemon=True).start()
        print("ready", flush=True)
        sys.stdin.readline()
        event.set()
        print("still running", flush=True)
    """)
    env = child_env(RDZV_PROGRESS_FILE=str(page.path), RDZV_STACKS_FILE=str(stacks))
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env,
                             preexec_fn=dies_with_this_process(progress.STACK_SIGNAL))
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        assert page.word(STACK_SIGNAL_AT) == progress.STACK_SIGNAL == signal.SIGRTMIN + 4
        os.kill(child.pid, progress.STACK_SIGNAL)
        # Every thread's stack: the waiting one's and the main thread's.
        deadline = time.monotonic() + 20
        while True:
            text = stacks.read_text() if stacks.exists() else ""
            if "in waiting_in_a_recognizable_frame" in text and "in <module>" in text:
                break
            assert time.monotonic() < deadline, f"no stacks in {stacks}: {text!r}"
            time.sleep(0.05)
        assert text.lower().count("thread 0x") == 2 and "most recent call first" in text, text
        child.stdin.write("go on\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "still running"  # the signal did not end it
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.parametrize("handler", ["python", "native"])
def test_a_stack_signal_the_program_handles_is_left_alone(page: Page, tmp_path: Path, handler: str):
    stacks = tmp_path / "stacks"
    install = {
        "python": "signal.signal(signal.SIGRTMIN + 4, lambda *_: None)",
        # faulthandler installs its handler with sigaction: signal.getsignal() cannot see it.
        "native": "faulthandler.register(signal.SIGRTMIN + 4, file=sys.stderr)",
    }[handler]
    out = run_child(f"""
        import faulthandler, signal, sys
        {install}
        import rdzv
        assert rdzv.is_monitored()
        print(rdzv.progress._stacks_file)
    """, RDZV_PROGRESS_FILE=str(page.path), RDZV_STACKS_FILE=str(stacks))
    assert out.strip() == "None"
    assert page.word(STACK_SIGNAL_AT) == 0
    assert not stacks.exists()


def test_no_stack_dumps_outside_rdzv_run(tmp_path: Path):
    stacks = tmp_path / "stacks"
    out = run_child("""
        import signal, rdzv
        print(signal.getsignal(signal.SIGRTMIN + 4) == signal.SIG_DFL, rdzv.progress._stacks_file)
    """, RDZV_STACKS_FILE=str(stacks))
    assert out.split() == ["True", "None"]
    assert not stacks.exists()


def test_rank_monitor_client_drives_the_page(page: Page):
    out = run_child("""
        import pytest
        from rdzv.errors import RendezvousInvalidArgumentError
        from rdzv.fault_tolerance import RankMonitorClient, RankMonitorClientError
        client = RankMonitorClient()
        with pytest.raises(RankMonitorClientError):
            client.send_heartbeat()  # before init_workload_monitoring, as in NVRx
        hb = {"initial": 60.0, "subsequent": 30.0, "were_calculated": True}
        client.load_state_dict({"current_timeouts": {"heartbeat": hb}})  # NVRx's state
        client.init_workload_monitoring()
        for _ in range(3):
            client.send_heartbeat()
        client.start_section("step")
        client.end_section("step")
        client.start_section("a")
        client.start_section("b")
        client.end_all_sections()  # b, then a
        for bad in ("", "x" * 40):
            with pytest.raises(RankMonitorClientError) as raised:
                client.start_section(bad)
            assert isinstance(raised.value.__cause__, RendezvousInvalidArgumentError)
        with pytest.raises(RankMonitorClientError, match="never-open"):
            client.end_section("never-open")
        assert client.calculate_and_set_hb_timeouts() is True
        assert client.calculate_and_set_section_timeouts(["step"], skip_if_not_ready=True) is True
        assert client.state_dict() == {"current_timeouts": {}}
        assert client.hb_timeouts is None and client.section_timeouts is None
        client.start_section("checkpointing")  # left open
        client.shutdown_workload_monitoring()
        print("ok")
    """, RDZV_PROGRESS_FILE=str(page.path))
    assert out.strip() == "ok"
    assert page.word(BEATS_AT) == 3
    assert page.sections() == {"step": 1, "b": 1, "a": 1}
    assert page.word(OPEN_DEPTH_AT) == 1
    assert page.name(OPEN_NAME_AT, 48) == "checkpointing"
