"""``Stack.supervise``'s schedule, on stand-in processes and a given clock: a process that
exits is restarted after a backoff that doubles while its restarts stay in the window, and
one exit past the budget is the stack's end, named with the process and why."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from allot.ops.stack import Stack, StackConfig


class Proc:
    """What ``supervise`` reads of a ``Popen``."""

    pids = itertools.count(1000)

    def __init__(self) -> None:
        self.pid = next(self.pids)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class Supervised:
    def __init__(self, tmp_path: Path, limit: int, window_s: float = 60.0) -> None:
        config = StackConfig(
            run_dir=tmp_path,
            restart_limit=limit,
            restart_window_s=window_s,
            restart_backoff_s=0.5,
            dashboard=False,
        )
        self.stack = Stack(config)  # not started: no servers, no processes
        (tmp_path / "logs").mkdir()
        (tmp_path / "logs" / "intake.log").write_text('{"event": "intake ready"}\n')
        self.proc = Proc()
        self.stack.procs["intake"] = self.proc  # type: ignore[assignment]
        self.stack.spawn = self._spawn  # type: ignore[method-assign]
        self.said: list[str] = []
        self.spawned: list[int] = []

    def _spawn(self, name: str) -> Proc:
        self.proc = Proc()
        self.stack.procs[name] = self.proc  # type: ignore[assignment]
        self.spawned.append(self.proc.pid)
        return self.proc

    def at(self, now: float) -> str | None:
        return self.stack.supervise(self.said.append, now=now)

    def crash_and_restart(self, at: float, backoff: float) -> None:
        """The process dies at ``at``; it is back ``backoff`` seconds later, not sooner."""
        old = self.proc
        old.returncode = -9
        assert self.at(at) is None
        assert self.at(at + backoff - 0.01) is None and self.proc is old
        assert self.at(at + backoff) is None and self.proc is not old


def test_the_backoff_doubles_and_one_exit_past_the_budget_stops_the_stack(
    tmp_path: Path,
) -> None:
    s = Supervised(tmp_path, limit=3)
    s.crash_and_restart(at=0.0, backoff=0.5)
    s.crash_and_restart(at=10.0, backoff=1.0)
    s.crash_and_restart(at=20.0, backoff=2.0)
    assert s.said[:2] == [
        "intake exited with -9 (SIGKILL); restarting it in 0.5 s (restart 1 of 3 within 60 s)",
        f"restarted intake: pid {s.spawned[0]}",
    ]
    assert s.stack.restarts == {"intake": 3}
    s.proc.returncode = 3
    stop = s.at(30.0)
    assert stop is not None
    assert stop.startswith(
        "service intake exited with 3 after 3 restarts within 60 s; the end of "
        f"{tmp_path / 'logs' / 'intake.log'}:\n"
    )
    assert stop.endswith('\n  {"event": "intake ready"}')


def test_restarts_older_than_the_window_no_longer_count(tmp_path: Path) -> None:
    s = Supervised(tmp_path, limit=2, window_s=60.0)
    s.crash_and_restart(at=0.0, backoff=0.5)
    s.crash_and_restart(at=30.0, backoff=1.0)
    # The first restart has left the window: one is left in it, so 1 s, not 2 s.
    s.crash_and_restart(at=60.5, backoff=1.0)
    assert s.said[-2].endswith("restarting it in 1 s (restart 2 of 2 within 60 s)")
    s.proc.returncode = -15
    stop = s.at(70.0)
    assert stop is not None and stop.startswith(
        "service intake exited with -15 (SIGTERM) after 2 restarts within 60 s; "
    )


@pytest.mark.parametrize("code", [0, 1, -9])
def test_no_budget_stops_the_stack_at_the_first_exit(tmp_path: Path, code: int) -> None:
    s = Supervised(tmp_path, limit=0)
    assert s.at(0.0) is None  # running
    s.proc.returncode = code
    stop = s.at(1.0)
    assert stop is not None and stop.startswith(f"service intake exited with {code}")
    assert "restart" not in stop and s.said == []


def test_an_embedded_server_that_exited_stops_the_stack(tmp_path: Path) -> None:
    """Not restarted (see ``allot.ops.stack``): every service needs it."""
    s = Supervised(tmp_path, limit=5)
    s.stack.servers.redis = Gone()  # type: ignore[assignment]
    assert s.at(0.0) == "the embedded Redis server exited: every service needs it"


class Gone:
    def running(self) -> bool:
        return False
