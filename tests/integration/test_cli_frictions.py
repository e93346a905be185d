"""The CLI frictions a newcomer hit (issue 36 item 8), against a whole stack: a cancel
without ``--alloc`` finds the workload (ids are unique, as ``status`` already found it);
``allot status`` of pending work says why it waits; a submission missing its command also
says what the stack would refuse."""

from __future__ import annotations

import asyncio
import contextlib
import io
import uuid
from pathlib import Path

import pytest
from live_harness import eventually

from allot.cli import live_cmds
from allot.core.errors import ValidationError
from allot.ops.stack import AgentSpec, Stack, StackConfig
from allot.sdk import Client
from allot.sdk.errors import NoResponderError, SubmitRejectedError

pytestmark = pytest.mark.integration
BUDGETS = """
name: root
children:
  - {name: nlp, shares: 1}
  - {name: vision, shares: 1}
"""


async def cli(url: str, *argv: str) -> tuple[int, str]:
    """``allot ARGV`` in this process (stdout captured); a refused option is (2, its text)."""
    out = io.StringIO()

    def call() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            return live_cmds.main([argv[0], "--nats-url", url, *argv[1:]])

    try:
        code = await asyncio.to_thread(call)
    except ValidationError as e:
        return 2, f"{e.field}: {e.reason}"
    return code, out.getvalue()


async def test_cancel_status_and_submit_say_what_a_newcomer_needs(
    fresh_log: str, redis_url: str, tmp_path: Path
) -> None:
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(BUDGETS)
    config = StackConfig(
        run_dir=tmp_path,
        budgets=budgets,
        nats_url=fresh_log,
        redis_url=redis_url,
        redis_prefix=f"cli{uuid.uuid4().hex[:8]}",
        agents=(AgentSpec("fk", hosts=1, gpus=4),),
        placements=1,
        rank_every_s=1.0,
        dashboard=False,
    )
    with Stack(config):
        async with Client(fresh_log) as c:
            await eventually(c.hosts, lambda h: len(h.hosts) == 1, 30)
            for _ in range(100):  # intake may come up last: a refusal says it is up
                with contextlib.suppress(NoResponderError):
                    with contextlib.suppress(SubmitRejectedError):
                        await c.submit(client_id="probe", user="ann", gpus=64, duration_s=1)
                    break
                await asyncio.sleep(0.2)
            held = await c.submit(
                client_id="held", user="ann", allocation="nlp", gpus=4, min_runtime_s=3600,
                duration_s=600,
            )  # fmt: skip
            await eventually(lambda: c.status(held.workload_id), lambda s: s.state == "running")
            waiting = await c.submit(
                client_id="waits", user="ann", allocation="vision", gpus=4, min_runtime_s=60
            )
            await eventually(
                lambda: c.queue(scope="vision"), lambda q: any(r.reason for r in q.rows), 20
            )
        # status of pending work: why it waits, as the queue says
        code, text = await cli(fresh_log, "status", waiting.workload_id)
        assert code == 0
        assert "waiting for:" in text and "waiting code:" in text, text
        # cancel without --alloc: the leader says where it is
        code, text = await cli(fresh_log, "cancel", waiting.workload_id, "--user", "ann")
        assert code == 0, text
        async with Client(fresh_log) as c:
            done = await eventually(
                lambda: c.status(waiting.workload_id), lambda s: s.state == "cancelled"
            )
            assert done.cancelled_by == "ann"
        # no command, and more GPUs than the cluster has: both said at once
        code, text = await cli(
            fresh_log, "submit", "--alloc", "nlp", "--user", "ann", "--gpus", "100"
        )
        assert code == 2
        assert "CMD: give the command" in text, text
        assert "also --gpus: asks for 100 GPUs; the cluster has 4 registered" in text
