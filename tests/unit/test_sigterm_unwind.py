"""A killed program stops what it started: ``unwind_on_sigterm`` turns SIGTERM into
``SystemExit(143)`` so ``with`` blocks (embedded servers, the stack) unwind. Each case runs
in a child process: the test process keeps SIGTERM's default."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

import pytest

from allot.adapters.embedded import unwind_on_sigterm

# A program that starts a StartStop (its stop() leaves a mark), says so, then waits to be
# killed. The first argument says whether it asks for unwinding.
_PROGRAM = """
import sys, time
from allot.adapters.embedded import StartStop, unwind_on_sigterm

class Probe(StartStop):
    def start(self):
        return self

    def stop(self):
        print("stopping", flush=True)
        time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)  # a slow stop
        with open(sys.argv[2], "w") as f:
            f.write("stopped")

if sys.argv[1] == "unwind":
    unwind_on_sigterm()
with Probe():
    print("up", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize(
    ("mode", "exit_code", "stopped"),
    [
        ("unwind", 128 + signal.SIGTERM, True),
        # Without it SIGTERM ends the process at once and stop() never runs.
        ("default", -signal.SIGTERM, False),
    ],
)
def test_sigterm_runs_stop_only_when_asked(
    tmp_path: Path, mode: str, exit_code: int, stopped: bool
) -> None:
    mark = tmp_path / "mark"
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROGRAM, mode, str(mark)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == exit_code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert mark.exists() is stopped


def test_a_handler_already_set_is_kept() -> None:
    def mine(_signum: int, _frame: FrameType | None) -> None:
        return None

    before = signal.signal(signal.SIGTERM, mine)
    try:
        unwind_on_sigterm()
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_allot_program_unwinds_and_main_does_not() -> None:
    """The console script (``run``) asks for it; ``main``, which tests call in-process,
    leaves SIGTERM alone."""
    check = (
        "import signal, allot.cli.main as c\n"
        "c.main = lambda argv=None: 0\n"
        "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, end=' ')\n"
        "c.run()\n"
        "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["True", "False"]


def test_a_second_sigterm_does_not_cut_the_unwinding_short(tmp_path: Path) -> None:
    """``kill`` twice, or ``timeout`` forwarding its TERM to a program that got one: the
    stop already under way still finishes."""
    mark = tmp_path / "mark"
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROGRAM, "unwind", str(mark), "1.0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().strip() == "stopping"
        proc.send_signal(signal.SIGTERM)  # during the slow stop
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert mark.read_text() == "stopped"
