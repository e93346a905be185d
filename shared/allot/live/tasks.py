"""Stopping background tasks for sure.

nats-py swallows a cancellation that lands inside its flush (and some awaits of other
clients do too), so a loop cancelled at that moment never sees it and runs on: awaiting it
would wait forever. ``stop_tasks`` cancels again every ``RETRY_S`` (the next cancellation
lands at the loop's next await) and gives up after ``timeout``, so a stopping service never
hangs on one of its own tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

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
