"""``allot.bus.tasks.stop_tasks``: a stopping service never hangs on its own tasks."""

from __future__ import annotations

import asyncio

from allot.bus.tasks import every, stop_tasks


async def _swallows_one_cancellation(seen: list[str]) -> None:
    """What a loop looks like when a library ate the cancellation (nats-py's flush does)."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        seen.append("swallowed")
    await asyncio.sleep(60)  # runs on, as the loop would
    seen.append("never")


async def _never_stops(released: asyncio.Event) -> None:
    """Swallows every cancellation; only ``released`` ends it (the test's own cleanup)."""
    while not released.is_set():
        try:
            await asyncio.wait_for(released.wait(), 60)
        except (asyncio.CancelledError, TimeoutError):
            continue


async def test_a_swallowed_cancellation_is_repeated_until_the_task_ends() -> None:
    seen: list[str] = []
    task = asyncio.create_task(_swallows_one_cancellation(seen))
    await asyncio.sleep(0)
    await stop_tasks([task, None], timeout=2.0)
    assert task.done() and task.cancelled()
    assert seen == ["swallowed"]


async def test_a_task_that_never_stops_is_given_up_after_the_timeout() -> None:
    released = asyncio.Event()
    task = asyncio.create_task(_never_stops(released))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await stop_tasks([task], timeout=0.3)
    assert 0.3 <= loop.time() - started < 2.0
    assert not task.done()
    released.set()
    await asyncio.wait_for(task, 2.0)


async def test_failed_and_finished_tasks_are_collected_quietly() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    failing, finished = asyncio.create_task(fails()), asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    await stop_tasks([failing, finished])
    assert failing.done() and finished.done()


async def test_every_survives_a_failing_tick_and_stops_when_closing() -> None:
    closing = asyncio.Event()
    ticks: list[int] = []

    async def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) == 1:
            raise RuntimeError("a failed publish")
        if len(ticks) == 3:
            closing.set()

    await asyncio.wait_for(every(0.01, closing, tick, "tick failed"), 5)
    assert ticks == [0, 1, 2]  # the failure did not end the loop; closing did
