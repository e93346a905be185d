"""Every process of the stack stops on SIGTERM by itself, well before the SIGKILL that
``allot up``'s Ctrl-C (and ``docker stop``) sends 10 s later.

Found on 2026-12-03: accounting waited on nats-py's drain of its pull subscription (whose
queue its fetches leave without ``task_done``) for the drain's 30 s timeout, so it was
always SIGKILLed."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from allot.ops.stack import AgentSpec, Stack, StackConfig

pytestmark = pytest.mark.integration


async def test_every_process_exits_zero_on_sigterm(
    fresh_log: str, redis_url: str, tmp_path: Path
) -> None:
    config = StackConfig(
        run_dir=tmp_path,
        nats_url=fresh_log,
        redis_url=redis_url,
        redis_prefix=f"stop{uuid.uuid4().hex[:8]}",
        agents=(AgentSpec("fake-a", hosts=2, gpus=8),),
        fake_duration_s=0.5,
        accrue_s=1.0,
        slot_s=1.0,
    )
    with Stack(config) as stack:
        # Idle for a few of accounting's 1 s pulls: each one that times out leaves the
        # server's late "no messages" status in the queue for the next fetch to take.
        await asyncio.sleep(3.0)
        names = set(stack.procs)
    assert set(stack.exit_codes) == names
    assert stack.exit_codes == dict.fromkeys(names, 0)
