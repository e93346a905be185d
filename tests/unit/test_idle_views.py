"""Where people see idle work: ``allot idle``'s text and the dashboard's owed page (a
team sees its own flagged runs only; idle GPU-hours per window for everyone)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from allot.auth.dashboard import EVERYONE, Viewer
from allot.cli import idle_cmd
from allot.cli import main as cli_main
from allot.eventlog.idle_book import IdleBook
from allot.eventlog.timeline import LogTimeline
from allot.proto import messages as m
from allot.services import health
from allot.services.dashboard.api import DashboardViews

AT = 1_800_000_000.0


def flagged(wid: str, allocation: str, since: float) -> m.WorkloadFlaggedIdle:
    return m.WorkloadFlaggedIdle(
        workload_id=wid,
        allocation=allocation,
        user="ann",
        gpus=2,
        at=since + 1800,
        idle_since=since,
        threshold_pct=5.0,
        window_s=1800.0,
        peak_pct=1.5,
        reason="every GPU below 5% for 30.0m (threshold 30.0m; highest 1.5%)",
    )


def test_allot_idle_prints_the_policy_and_one_row_per_flagged_run() -> None:
    row = m.IdleRow(
        workload_id="w1",
        allocation="nlp",
        user="ann",
        gpus=2,
        idle_since=AT - 3600,
        flagged_at=AT - 1800,
        peak_pct=1.5,
        reason="every GPU below 5% for 30.0m",
    )
    snap = m.IdleSnapshot(at=AT, threshold_pct=5.0, window_s=1800.0, rows=(row,))
    lines = idle_cmd.idle_text(snap).splitlines()
    assert lines[0] == "flagged idle: every GPU below 5% for 30.0m (as of 2027-01-15T08:00:00Z)"
    assert lines[1].split() == [
        "WORKLOAD", "ALLOCATION", "USER", "GPUS", "IDLE", "SINCE", "FLAGGED", "HIGHEST", "%",
        "REASON",
    ]  # fmt: skip
    assert lines[3].split()[:7] == [
        "w1", "nlp", "ann", "2", "2027-01-15T07:00:00Z", "2027-01-15T07:30:00Z", "1.5",
    ]  # fmt: skip
    empty = m.IdleSnapshot(at=AT, threshold_pct=5.0, window_s=1800.0)
    assert idle_cmd.idle_text(empty).splitlines()[1] == "no allocated work is idle"


def test_allot_idle_answers_the_first_rows_that_fit_in_one_message_and_the_total() -> None:
    """Thousands of runs flagged at once are more than one NATS message: the health
    service sends the oldest that fit and how many there are; the text says so."""
    rows = tuple(
        m.IdleRow(
            workload_id=f"w{i:05d}",
            allocation="nlp",
            user="ann",
            gpus=2,
            idle_since=AT - 3600,
            flagged_at=AT - 1800,
            reason="every GPU below 5% for 30.0m (threshold 30.0m; highest 1.5%) " * 3,
        )
        for i in range(6000)
    )
    snap = m.IdleSnapshot(at=AT, threshold_pct=5.0, window_s=1800.0, rows=rows)
    limit = 1024 * 1024
    assert len(msgspec.json.encode(snap)) > limit
    data = health.idle_answer(snap, limit)
    got = msgspec.json.decode(data, type=m.IdleSnapshot)
    assert len(data) <= limit and got.total == 6000 and 1000 < len(got.rows) < 6000
    assert got.rows == rows[: len(got.rows)]
    assert idle_cmd.idle_text(got).splitlines()[-1] == (
        f"6000 flagged idle (first {len(got.rows)} shown)"
    )
    few = msgspec.structs.replace(snap, rows=rows[:3])
    assert msgspec.json.decode(health.idle_answer(few, limit), type=m.IdleSnapshot).total == 3


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["idle", "--follow"], "--follow: needs --alloc"),
        (["idle", "--alloc", "~"], "--alloc: unallocated work is never flagged idle"),
    ],
)
def test_allot_idle_refuses_what_it_cannot_answer_before_connecting(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main.main([*argv, "--nats-url", "nats://127.0.0.1:1"]) == 2
    assert words in capsys.readouterr().err


async def test_the_owed_page_shows_a_team_only_its_own_idle_runs_and_everyone_idle_hours() -> None:
    book = IdleBook()
    book.apply(flagged("w1", "nlp", AT - 3600))
    book.apply(flagged("v1", "vision", AT - 2000))
    client: Any = None  # the owed page asks no service
    views = DashboardViews(client, LogTimeline(), idle=book)
    everyone = await views.owed(AT, EVERYONE)
    assert [x["workload_id"] for x in everyone.data["idle"]] == ["w1", "v1"]
    assert 'data-idle-workload="w1"' in everyone.html and 'data-idle-workload="v1"' in everyone.html
    team = await views.owed(AT, Viewer("ann", "team", frozenset({"nlp"})))
    assert [x["workload_id"] for x in team.data["idle"]] == ["w1"]
    assert "v1" not in team.html
    # idle GPU-hours per allocation are public, as owed and delivered are
    rows = {r["allocation"]: r for r in team.data["windows"]["last day"]["rows"]}
    assert rows["vision"]["idle_gpu_h"] == pytest.approx(2 * 2000 / 3600, abs=1e-5)
    assert rows["nlp"]["idle_gpu_h"] == pytest.approx(2 * 3600 / 3600, abs=1e-5)
    quiet = await views.owed(AT + 1, Viewer("bob", "team", frozenset({"audio"})))
    assert 'id="idle-none"' in quiet.html
