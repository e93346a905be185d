"""The dashboard's ``allot owed`` answers: one question asked again within
``OWED_FRESH_S`` gets the same answer without a new fold (a flood of it costs one answer a
second), another question or a later one its own."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from allot.proto import messages as m
from allot.services.dashboard import service as dash
from allot.services.dashboard.service import OWED_FRESH_S, DashboardService

WEEK = b'{"type": "OwedQuery"}'
DAY = b'{"type": "OwedQuery", "window_s": 86400}'


def test_a_question_asked_again_within_a_second_is_answered_from_the_last_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1_000_000.0]
    monkeypatch.setattr(dash, "wall_clock", lambda: now[0])
    service = DashboardService("nats://127.0.0.1:1", http_port=0, tracing=False)
    folds: list[float] = []
    real = dash.owed_snapshot

    def counted(*args: object) -> m.OwedSnapshot:
        folds.append(now[0])
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(dash, "owed_snapshot", counted)

    async def ask(body: bytes) -> m.OwedSnapshot:
        return msgspec.json.decode(await service._answer_owed("q", body), type=m.OwedSnapshot)

    first = asyncio.run(ask(WEEK))
    now[0] += OWED_FRESH_S / 2
    assert asyncio.run(ask(WEEK)) == first and len(folds) == 1  # reused
    assert asyncio.run(ask(DAY)).window_s == 86400 and len(folds) == 2  # its own
    now[0] += OWED_FRESH_S
    later = asyncio.run(ask(WEEK))
    assert later.at == now[0] and len(folds) == 3  # a second on: answered anew
    bad = asyncio.run(service._answer_owed("q", b'{"type": "OwedQuery", "window_s": -1}'))
    assert msgspec.json.decode(bad, type=m.CommandRejected).field == "window_s"
