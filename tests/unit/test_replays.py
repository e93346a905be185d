"""``allot.bus.replays``: which record is a copy stored again (decision 0085), read from
what a JetStream delivery says of itself."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest
from nats.aio.msg import Msg

from allot.bus import replays
from allot.eventlog import idle_watch
from allot.proto import messages as m

AT = 1_800_000_000.0
TREE = m.BudgetTreeSet(at=AT, by="ops", tree=m.BudgetNodeSpec(name="root"))
HEALTHY = m.HostHealthy(host="h1", at=AT)
PLACED = m.WorkloadPlaced(
    workload_id="w",
    allocation="nlp",
    at=AT,
    gpus=1,
    assignment=(m.HostGpus(host="h1", gpus=(0,)),),
    epoch=1,
)
OLD_FLAG = m.WorkloadFlaggedIdle(
    workload_id="w",
    allocation="nlp",
    gpus=1,
    at=AT,
    idle_since=AT - 600,
    threshold_pct=5.0,
    window_s=600.0,
)
"""A flag written before flags said when they were written: ``at`` is its report's time."""
FLAG = msgspec.structs.replace(OLD_FLAG, at=AT - 300, recorded_at=AT)
"""Raised by a report 300 s old, written at ``AT``."""
WINDOW = replays.REPLAY_AFTER_S


def test_an_idle_flags_allowance_is_the_age_of_a_report_health_takes() -> None:
    assert replays.EARLIER_AT_S[m.WorkloadFlaggedIdle] == idle_watch.MAX_REPORT_AGE_S


@pytest.mark.parametrize(
    ("record", "stored", "copy"),
    [
        pytest.param(TREE, AT + 0.01, False, id="a tree stored as written"),
        pytest.param(TREE, AT + WINDOW, False, id="a tree stored within the window"),
        pytest.param(TREE, AT + WINDOW + 1, True, id="a tree stored past the window"),
        pytest.param(HEALTHY, AT + 3600, True, id="a host's earlier health"),
        pytest.param(HEALTHY, AT - 30, False, id="a writer's clock ahead of the server's"),
        pytest.param(PLACED, AT + 3600, False, id="WORKLOADS is not judged so"),
        pytest.param(TREE, None, False, id="nothing says when it was stored"),
        pytest.param(OLD_FLAG, AT + 300 + WINDOW, False, id="an older flag: a report's time"),
        pytest.param(OLD_FLAG, AT + 300 + WINDOW + 1, True, id="an older flag past both"),
        pytest.param(FLAG, AT + WINDOW, False, id="a flag stored within its writing's window"),
        pytest.param(FLAG, AT + WINDOW + 1, True, id="no allowance once it says when written"),
        pytest.param(
            TREE, datetime.fromtimestamp(AT + 600, UTC), True, id="a stored time as a datetime"
        ),
    ],
)
def test_a_stamped_record_stored_long_after_its_time_is_a_copy(
    record: msgspec.Struct, stored: float | datetime | None, copy: bool
) -> None:
    why = replays.replayed(record, stored)
    assert (why is not None) is copy
    if why is not None:
        assert "copy" in why and "clock" in why


def _msg(reply: str = "", headers: dict[str, str] | None = None) -> Msg:
    return Msg(_client=None, subject="allot.v1.budget.tree", reply=reply, headers=headers)  # type: ignore[arg-type]


def test_the_stored_time_is_read_from_the_deliverys_ack_subject() -> None:
    ns = 1_800_000_123_456_789_000
    delivery = _msg(f"$JS.ACK.USAGE.c1.1.42.7.{ns}.0")
    assert replays.stored_at(delivery) == pytest.approx(ns / 1e9)
    assert replays.stored_at(_msg("_INBOX.abc")) is None
    assert replays.stored_at(_msg()) is None


def test_a_copy_the_log_delivered_onto_a_subject_is_told_from_a_writers_publication() -> None:
    assert replays.jetstream_delivery(_msg("$JS.ACK.USAGE.c1.1.42.7.1.0"))
    assert replays.jetstream_delivery(_msg(headers={"Nats-Stream": "USAGE"}))  # a direct get
    assert not replays.jetstream_delivery(_msg("_INBOX.abc", {"Nats-Msg-Id": "x"}))
    assert not replays.jetstream_delivery(_msg())


@pytest.mark.parametrize(
    ("stream", "subject", "copy"),
    [
        ("USAGE", "allot.v1.budget.tree", False),
        ("HOSTS", "allot.v1.host.h1.state", False),
        ("HOSTS", "allot.v1.budget.tree", True),  # a tree delivered into HOSTS
        ("USAGE", "allot.v1.events.nlp.w.started", True),
        ("WORKLOADS", "allot.v1.host.h1.state", True),
    ],
)
def test_a_record_read_from_a_stream_that_does_not_capture_its_subject_is_a_copy(
    stream: str, subject: str, copy: bool
) -> None:
    """Each stream dedupes only its own records: a copy delivered into another one is
    refused whatever its time."""
    why = replays.replayed(TREE, AT, stream, subject)
    assert (why is not None) is copy
