"""The README's five-minute path works as written (issue 36).

The README marks its fenced shell blocks: ``<!-- five-minute-path: stack -->`` before the
command that starts the stack in a first terminal, ``<!-- five-minute-path -->`` before
each block typed in a second one. This test reads them from the README and runs them in a
fresh folder holding what a clone has at its root for them (the Makefile, pyproject.toml,
and the repository's installed ``.venv``, linked): the stack command in the background,
every other line, in order, in one bash session with no ``ALLOT_*`` variable set and no
``allot`` on the PATH, as a newcomer's shell. Each command must exit 0. A read-only command
(``allot status``, ``queue``, ``prio``, ``share``, ``hosts``) that shows an outcome is run
again, as a person would, until the outcome shows (at most ``SETTLE_S``). At the end the
path must have reached what the README promises: a workload submitted, one preempted and
requeued, a budget changed, a simulation report written; then Ctrl-C (SIGINT to the
stack's process group, as a terminal sends it) stops the stack cleanly.

``MAKEFLAGS=-o .venv/.installed`` keeps make from reinstalling: the linked ``.venv`` is
the repository's, installed already (``make test`` depends on it).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
STACK_MARK = "<!-- five-minute-path: stack -->"
STEP_MARK = "<!-- five-minute-path -->"
READY = "try:"
"""The last line of ``allot up``'s banner: the stack is ready."""
SETTLE_S = 45.0
COMMAND_TIMEOUT_S = 120.0
READ_ONLY = re.compile(r"^allot (status|queue|prio|share|hosts|owed)\b")

OUTCOMES = {
    "allot hosts": r"(?s)(healthy.*){8}",
    "allot status $batch": None,  # its two runs expect different states: see _expected
    "allot status $train": r"(?s)state:\s+running.*protected until:",
    "allot queue": r"unallocated-idle-only",
    "allot prio": r"unallocated",
    "allot share": r"root/research/nlp",
}
"""What a read-only command of the path shows once its outcome is there (a regex over
its output, the command as written without its comment). Commands not listed: exit 0."""


def _blocks(text: str, mark: str) -> list[list[str]]:
    """The command lines of each ```bash block right after ``mark`` (comment-only and
    blank lines dropped; a command keeps its trailing comment, as typed)."""
    out = []
    for match in re.finditer(re.escape(mark) + r"\s*```(?:bash|sh)\n(.*?)```", text, re.S):
        lines = [line for line in match.group(1).splitlines() if line.strip()]
        out.append([line for line in lines if not line.lstrip().startswith("#")])
    return out


def _bare(command: str) -> str:
    """The command without its trailing ``# comment``."""
    return re.sub(r"\s+#.*$", "", command).strip()


def test_the_readme_marks_one_stack_command_and_the_steps_of_the_path() -> None:
    text = README.read_text(encoding="utf-8")
    assert _blocks(text, STACK_MARK) == [["make up"]]
    steps = [c for block in _blocks(text, STEP_MARK) for c in block]
    assert steps[0].startswith("source .venv/bin/activate")
    for needed in ("allot submit", "allot status", "allot queue", "budgets set", "simulate"):
        assert any(needed in c for c in steps), needed


class _Shell:
    """One bash session fed a command at a time; each answer ends with its exit status."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def run(self, command: str) -> tuple[int, str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f'{command}\necho "@@@rc=$?"\n')
        self.proc.stdin.flush()
        out: list[str] = []
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while True:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line.startswith("@@@rc="):
                return int(line.strip().split("=")[1]), "".join(out)
            out.append(line)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _newcomer_env() -> dict[str, str]:
    """This process's environment without ``ALLOT_*``, a virtualenv or its bin on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOT_")}
    env.pop("VIRTUAL_ENV", None)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if not Path(p, "allot").exists()]
    env["PATH"] = os.pathsep.join(path)
    env["MAKEFLAGS"] = "-o .venv/.installed"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A folder with what the path uses from a clone's root."""
    if not (ROOT / ".venv" / "bin" / "allot").exists():
        pytest.fail("no .venv/bin/allot: run make install first (make test does)")
    for name in ("Makefile", "pyproject.toml", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


@pytest.fixture
def stack(clone: Path) -> Iterator[subprocess.Popen[str]]:
    [[command]] = _blocks(README.read_text(encoding="utf-8"), STACK_MARK)
    # As in a terminal, SIGINT must not be ignored in the stack's processes (a test run
    # started in the background of a shell ignores it, and exec keeps that): caught here
    # for the moment of the fork, it is default in the child.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=clone,
        env=_newcomer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a terminal's foreground group: Ctrl-C reaches all of it
    )
    signal.signal(signal.SIGINT, before)
    banner: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    while not any(line.lstrip().startswith(READY) for line in banner):
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, "".join(banner)
        banner.append(line)
    try:
        yield proc
    finally:
        if proc.poll() is None:  # the test failed first: Ctrl-C, which stops every process
            os.killpg(proc.pid, signal.SIGINT)  # of the stack; SIGKILL would orphan them
            try:
                proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _expected(command: str, seen: dict[str, int]) -> str | None:
    bare = _bare(command)
    if bare == "allot status $batch":
        # Running after its submission; pending and requeued once allocated work came.
        return r"state:\s+running" if seen[bare] == 1 else r"(?s)state:\s+pending.*requeued:"
    if bare == "allot share" and seen[bare] > 1:
        return r"root/research/nlp\s+80\b"  # after the budget change
    return OUTCOMES.get(bare)


def test_the_five_minute_path_runs_as_written(clone: Path, stack: subprocess.Popen[str]) -> None:
    steps = [c for block in _blocks(README.read_text(encoding="utf-8"), STEP_MARK) for c in block]
    shell = _Shell(clone, _newcomer_env())
    transcript: list[str] = []
    seen: dict[str, int] = {}
    try:
        for command in steps:
            seen[_bare(command)] = seen.get(_bare(command), 0) + 1
            expected = _expected(command, seen)
            deadline = time.monotonic() + SETTLE_S
            while True:
                code, out = shell.run(command)
                transcript.append(f"$ {command}\n{out}[exit {code}]")
                assert code == 0, "\n".join(transcript)
                if expected is None or re.search(expected, out):
                    break
                retry = READ_ONLY.match(_bare(command)) and time.monotonic() < deadline
                assert retry, f"no {expected!r} in:\n" + "\n".join(transcript)
                time.sleep(1.0)
        code, out = shell.run('echo "batch=$batch train=$train"')
    finally:
        shell.close()
    story = "\n".join(transcript)
    assert re.search(r"batch=w\w+ train=w\w+", out), out  # workloads submitted
    assert re.search(r"requeued:.*after attempt 1 \(displaced-unallocated\)", story), story
    assert list((clone / "out").glob("*/sim/fairshare/report.html")), story
    assert list((clone / "out").glob("*/sim/priority/report.json")), story

    os.killpg(stack.pid, signal.SIGINT)  # Ctrl-C in the first terminal
    rest, _ = stack.communicate(timeout=90)
    assert "stopped." in rest, rest
    assert not (clone / ".allot" / "stacks").exists()  # its record is gone with it
