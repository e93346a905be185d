"""One host's part of a workload, as the agent runs it: a real process group or a fake timer.

Both kinds answer the same three calls, so the agent's supervision code is one path:

* ``wait()`` returns the exit code (``asyncio``'s convention: ``-N`` when signal ``N``
  ended it);
* ``terminate(kill_at)`` asks the part to stop now (SIGTERM) and makes sure it is gone at
  wall-clock time ``kill_at`` (SIGKILL); a second call can only bring the deadline forward;
* ``kill()`` ends it at once (SIGKILL).

Real parts are started with ``start_new_session=True``: the workload's launcher and every
process it forks share one process group, and signals go to the whole group, so a training
script's data-loader workers do not outlive it. No shell is involved: ``command`` is the
argument vector itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Protocol

Clock = Callable[[], float]


class Part(Protocol):
    @property
    def pid(self) -> int | None: ...

    async def wait(self) -> int: ...

    def terminate(self, kill_at: float) -> None: ...

    def kill(self) -> None: ...


def workload_env(
    base: Mapping[str, str],
    *,
    gpus: Sequence[int],
    workload_id: str,
    allocation: str | None,
    attempt: int,
    nats_url: str,
    host: str,
) -> dict[str, str]:
    """The environment of one part: the agent's own plus what the workload needs to know.
    ``ALLOT_ALLOCATION`` is empty for unallocated work."""
    env = dict(base)
    env.update(
        CUDA_VISIBLE_DEVICES=",".join(str(g) for g in gpus),
        ALLOT_WORKLOAD_ID=workload_id,
        ALLOT_ALLOCATION=allocation or "",
        ALLOT_ATTEMPT=str(attempt),
        ALLOT_NATS_URL=nats_url,
        ALLOT_HOST=host,
    )
    return env


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"


class ProcessPart:
    """A subprocess in its own session (process group id = its pid)."""

    def __init__(self, proc: asyncio.subprocess.Process, clock: Clock) -> None:
        self._proc = proc
        self._clock = clock
        self._kill_at: float | None = None
        self._kill_timer: asyncio.TimerHandle | None = None

    @classmethod
    async def spawn(
        cls,
        command: Sequence[str],
        env: Mapping[str, str],
        clock: Clock,
        output: IO[bytes] | None = None,
    ) -> ProcessPart:
        """Raises ``OSError`` (e.g. ``FileNotFoundError``) when the program cannot start.
        ``output``: where its stdout and stderr go (None: the agent's own)."""
        proc = await asyncio.create_subprocess_exec(
            *command,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=None if output is None else asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        return cls(proc, clock)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    async def wait(self) -> int:
        code = await self._proc.wait()
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        # The launcher is gone; whatever it forked into its group goes with it.
        self._signal(signal.SIGKILL)
        return code

    def terminate(self, kill_at: float) -> None:
        if self._proc.returncode is not None:
            return
        if self._kill_at is not None and self._kill_at <= kill_at:
            self._signal(signal.SIGTERM)  # a repeated request: the earlier deadline stands
            return
        self._signal(signal.SIGTERM)
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        self._kill_at = kill_at
        delay = max(0.0, kill_at - self._clock())
        self._kill_timer = asyncio.get_running_loop().call_later(delay, self.kill)

    def kill(self) -> None:
        if self._proc.returncode is None:
            self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        # The group may already be empty (ProcessLookupError) or, in theory, not ours any
        # more (PermissionError): either way there is nothing left to stop.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)


class FakePart:
    """Pretends to run for ``duration_s``; a stop request ends it at once (the fake
    checkpoint is instant), reported as SIGTERM's exit code."""

    def __init__(self, duration_s: float) -> None:
        self._duration_s = duration_s
        self._stopped = asyncio.Event()
        self._code = -int(signal.SIGTERM)

    @property
    def pid(self) -> int | None:
        return None

    async def wait(self) -> int:
        try:
            await asyncio.wait_for(self._stopped.wait(), self._duration_s)
        except TimeoutError:
            return 0
        return self._code

    def terminate(self, kill_at: float) -> None:
        self._stopped.set()

    def kill(self) -> None:
        if not self._stopped.is_set():
            self._code = -int(signal.SIGKILL)
        self._stopped.set()
