"""When the stack says it is ready (``allot.ops.stack._wait_ready``), on real NATS with
stand-ins for placement, ranking and intake.

Ranking answers its query before it has put the budget tree in the log, so a stack could
say ready while intake still refused allocated submissions ("no budget tree has been set
yet"): ready takes a ranking, which follows the tree. Intake could still be starting when
the rest was up (a submission then met no responder): ready takes intake's answer to
``QUERY_INTAKE``, which it serves after its submissions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from allot.bus import confirm_subscriptions
from allot.ops.stack import StackError, _wait_ready
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s

pytestmark = pytest.mark.integration


@pytest.fixture
async def nc(fresh_log: str) -> AsyncIterator[NatsClient]:
    client = await nats.connect(fresh_log)
    yield client
    await client.close()


async def _answer(nc: NatsClient, subject: str, reply: object) -> None:
    async def cb(msg: Msg) -> None:
        await msg.respond(codec.encode(reply() if callable(reply) else reply))

    await nc.subscribe(subject, cb=cb)
    await confirm_subscriptions(nc)


def _no_death() -> str | None:
    return None


async def _hosts(nc: NatsClient, total: int) -> None:
    await _answer(nc, s.QUERY_HOSTS, m.HostsSnapshot(at=time.time(), total=total))


async def _intake(nc: NatsClient) -> None:
    await _answer(nc, s.QUERY_INTAKE, m.CommandAccepted(at=time.time(), detail="serving"))


def _ranking() -> m.RankingUpdated:
    return m.RankingUpdated(at=time.time(), window_s=60.0, nodes=())


async def test_a_ranking_service_without_a_ranking_is_not_ready(
    fresh_log: str, nc: NatsClient
) -> None:
    await _hosts(nc, 1)
    await _intake(nc)
    rejected = m.CommandRejected(at=time.time(), field="ranking", reason="no ranking yet")
    await _answer(nc, s.QUERY_SHARE, rejected)
    with pytest.raises(StackError, match="ranking: no ranking yet"):
        await _wait_ready(fresh_log, 1, 1.5, _no_death)


async def test_ready_once_ranking_has_ranked(fresh_log: str, nc: NatsClient) -> None:
    await _hosts(nc, 1)
    await _intake(nc)
    asked: list[float] = []

    def share() -> m.RankingUpdated | m.CommandRejected:
        asked.append(time.monotonic())
        if len(asked) < 3:  # the first two answers come before the first ranking
            return m.CommandRejected(at=time.time(), field="ranking", reason="no ranking yet")
        return _ranking()

    await _answer(nc, s.QUERY_SHARE, share)
    await _wait_ready(fresh_log, 1, 10.0, _no_death)
    assert len(asked) == 3


async def test_hosts_not_all_registered_is_not_ready(fresh_log: str, nc: NatsClient) -> None:
    await _hosts(nc, 1)
    await _intake(nc)
    await _answer(nc, s.QUERY_SHARE, _ranking())
    with pytest.raises(StackError, match="1 of 2 hosts registered"):
        await _wait_ready(fresh_log, 2, 1.5, _no_death)


async def test_intake_not_serving_is_not_ready(
    fresh_log: str, nc: NatsClient, tmp_path: Path
) -> None:
    await _hosts(nc, 1)
    await _answer(nc, s.QUERY_SHARE, _ranking())
    with pytest.raises(StackError, match="intake: not serving yet") as err:
        await _wait_ready(fresh_log, 1, 1.5, _no_death, logs=tmp_path)
    assert str(err.value).endswith(f"(the services' logs: {tmp_path})")
    await _intake(nc)
    await _wait_ready(fresh_log, 1, 5.0, _no_death)
