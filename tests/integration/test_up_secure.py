"""``allot up --secure``: the stack runs with users, per-role permissions and TLS on
loopback; a team submits to its own allocation and is refused another's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from allot.live.stack import AgentSpec, Stack, StackConfig
from allot.sdk import Client
from allot.sdk.errors import SdkError

pytestmark = pytest.mark.integration


async def test_secure_stack_serves_a_team_only_its_own_allocation(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StackConfig(
        run_dir=tmp_path,
        redis_url=redis_url,
        redis_prefix="secure-test",
        secure=True,
        agents=(AgentSpec("fake-a", hosts=2, gpus=8),),
        placements=1,
        grace_s=2,
        rank_every_s=1.0,
    )
    with Stack(config) as stack:
        assert stack.auth is not None and stack.ca_file is not None
        url = stack.url_for("nlp")
        assert url.startswith("tls://nlp:")
        monkeypatch.setenv("ALLOT_NATS_CA", str(stack.ca_file))
        async with Client(url, timeout=2.0, retries=0) as c:
            ok = await c.submit(
                client_id="s1",
                user="ann",
                allocation="nlp",
                gpus=1,
                min_runtime_s=60,
                duration_s=5,
            )
            assert ok.workload_id
            with pytest.raises(SdkError):  # not granted: the request never reaches intake
                await c.submit(client_id="s2", user="ann", allocation="vision", gpus=1)
        # Without the CA the server's certificate is not trusted.
        monkeypatch.delenv("ALLOT_NATS_CA")
        with pytest.raises(Exception):  # noqa: B017 - any TLS/connect failure
            async with Client(url, timeout=1.0, retries=0) as c:
                await asyncio.wait_for(c.queue(), 3)
