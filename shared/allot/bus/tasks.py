"""Background tasks: stopping them for sure, and running a periodic check.

nats-py swallows a cancellation that lands inside its flush (and some awaits of other
clients do too), so a loop cancelled at that moment never sees it and runs on: awaiting it
would wait forever. ``stop_tasks`` cancels again every ``RETRY_S`` (the next cancellation
lands at the loop's next await) and gives up after ``timeout``, so a stopping service never
hangs on one of its own tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

import structlog

RETRY_S = 0.1
STOP_TIMEOUT_S = 5.0

log = structlog.get_logger("allot.tasks")


async def stop_tasks(
    tasks: Iterable[asyncio.Task[object] | asyncio.Task[None] | None],
    timeout: float = STOP_TIMEOUT_S,
) -> None:
    """Cancel ``tasks`` (None entries are skipped) and wait until they end, at most
    ``timeout`` seconds. Their exceptions are retrieved and dropped (they are stopping)."""
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[object] | asyncio.Task[None]] = {t for t in tasks if t is not None}
    deadline = loop.time() + timeout
    while pending:
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=RETRY_S)
        for task in done:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
        if pending and loop.time() >= deadline:
            log.warning(
                "tasks did not stop",
                tasks=sorted(t.get_name() for t in pending),
                timeout_s=timeout,
            )
            return


async def every(
    period_s: float,
    closing: asyncio.Event,
    action: Callable[[], Awaitable[object]],
    failure: str,
) -> None:
    """Await ``action`` every ``period_s`` until ``closing`` is set (at once when it is).
    An exception is logged as ``failure`` and the next tick tries again: a failed publish
    or append must not end a periodic check for the rest of the service's life."""
    while not closing.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), period_s)
        if closing.is_set():
            return
        try:
            await action()
        except Exception:
            log.exception(failure)
