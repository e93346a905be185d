"""Dispatch's judgement of agents' reports with no server: the nats-py handlers called
directly, the log a ``MemoryLog`` holding a 16-GPU gang placed on h1 (its primary host) and
h2 at ``PLACED``; h3 has no part of it."""

from __future__ import annotations

import msgspec
import pytest
from handler_harness import NOW, Clock, broker, running

from allot.proto import messages as m
from allot.proto import subjects
from allot.services.dispatch import DispatchService
from memory_log import MemoryLog

Reply = m.CommandAccepted | m.CommandRejected
G = "wgang"
PLACED = NOW - 100
SUBMITTED = m.WorkloadSubmitted(
    workload_id=G, client_id="c1", user="ann", gpus=16, allocation="nlp", at=PLACED - 10
)
PLACEMENT = m.WorkloadPlaced(
    workload_id=G,
    allocation="nlp",
    at=PLACED,
    gpus=16,
    assignment=(
        m.HostGpus(host="h1", gpus=tuple(range(8))),
        m.HostGpus(host="h2", gpus=tuple(range(8))),
    ),
)
STARTED_AT = PLACED + 5
STARTED = m.WorkloadStarted(workload_id=G, allocation="nlp", at=STARTED_AT, host="h1", gpus=16)


async def seeded_log(*events: msgspec.Struct) -> MemoryLog:
    log = MemoryLog()
    for host in ("h1", "h2", "h3"):
        await log.seed(subjects.host_state(host), m.HostRegistered(host=host, gpus=8, at=0.0))
    await log.seed_events("nlp", SUBMITTED, PLACEMENT, *events)
    return log


def service(log: MemoryLog, clock: Clock | None = None) -> DispatchService:
    return DispatchService(broker=broker("dispatch"), record_log=log, clock=clock or Clock())


def report(event: str = "started", host: str = "h1", **kw: object) -> m.PartReport:
    fields: dict[str, object] = {"workload_id": G, "attempt": 1, "at": STARTED_AT, **kw}
    return m.PartReport(host=host, event=event, **fields)  # type: ignore[arg-type]


async def send(svc: DispatchService, subject_host: str, body: m.PartReport) -> Reply:
    data = await svc._report_handler(subjects.host_report(subject_host), msgspec.json.encode(body))
    return msgspec.json.decode(data, type=Reply)


def appended(log: MemoryLog, seeded: int) -> list[object]:
    return log.records("WORKLOADS")[seeded:]


REPORTS = [
    # (the gang already started?, the subject's host, report, refused field or record logged)
    pytest.param(False, "h1", report(), m.WorkloadStarted, id="the primary host reports a start"),
    pytest.param(
        True,
        "h1",
        report("exited", at=NOW - 10, started_at=STARTED_AT, exit_code=0),
        m.WorkloadCompleted,
        id="the primary host reports a clean exit",
    ),
    pytest.param(
        True,
        "h2",
        report("exited", host="h2", at=NOW - 10, started_at=STARTED_AT, exit_code=3),
        m.WorkloadFailed,
        id="the other host of the gang reports its part failed",
    ),
    pytest.param(
        False, "h2", report(host="h2"), "host", id="the gang's other host may not report a start"
    ),
    pytest.param(
        True,
        "h2",
        report("exited", host="h2", at=NOW - 10, started_at=STARTED_AT, exit_code=0),
        "host",
        id="the gang's other host may not complete it",
    ),
    pytest.param(False, "h3", report(host="h3"), "host", id="a host with no part of it"),
    pytest.param(False, "h2", report(host="h1"), "host", id="a payload naming another host"),
    pytest.param(False, "h1", report(workload_id="wnone"), "workload_id", id="an unknown workload"),
    pytest.param(False, "h1", report(attempt=2), "attempt", id="an attempt not placed yet"),
    pytest.param(False, "h1", report(at=NOW + 60), "at", id="a start ahead of dispatch's clock"),
    pytest.param(False, "h1", report(at=PLACED - 60), "at", id="a start before the placement"),
    pytest.param(
        True,
        "h1",
        report("exited", at=NOW - 10, started_at=PLACED - 60, exit_code=0),
        "started_at",
        id="an end whose start is before the placement",
    ),
    pytest.param(
        True,
        "h1",
        report("exited", at=NOW + 20, started_at=PLACED - 20, exit_code=0),
        "started_at",
        id="a run longer than the time since its placement",
    ),
    pytest.param(
        True,
        "h1",
        report("exited", at=STARTED_AT - 1, started_at=STARTED_AT, exit_code=0),
        "at",
        id="an end before its start",
    ),
]


@pytest.mark.parametrize(("started", "subject_host", "body", "outcome"), REPORTS)
async def test_a_report_is_judged_against_the_log_and_the_clock(
    started: bool, subject_host: str, body: m.PartReport, outcome: type | str
) -> None:
    log = await seeded_log(*([STARTED] if started else []))
    seeded = len(log.streams["WORKLOADS"])
    svc = service(log)
    async with running(svc):
        reply = await send(svc, subject_host, body)
    if isinstance(outcome, str):
        assert isinstance(reply, m.CommandRejected), reply
        assert reply.field == outcome
        assert svc.rejected == {outcome: 1}
        assert appended(log, seeded) == []
    else:
        assert reply == m.CommandAccepted(at=NOW, detail=outcome.__name__)
        (record,) = appended(log, seeded)
        assert isinstance(record, outcome)
        kind = "started" if outcome is m.WorkloadStarted else "ended"
        assert log.streams["WORKLOADS"][-1].headers["Nats-Msg-Id"] == f"{kind}:{G}:1"


async def test_a_start_then_its_retry_then_the_end_log_one_record_each() -> None:
    log = await seeded_log()
    seeded = len(log.streams["WORKLOADS"])
    svc = service(log)
    async with running(svc):
        first = await send(svc, "h1", report(pid=42))
        await log.settled()  # the start folded back
        retry = await send(svc, "h1", report(pid=42))
        end = await send(svc, "h1", report("exited", at=NOW - 10, exit_code=0))
    assert first == m.CommandAccepted(at=NOW, detail="WorkloadStarted")
    assert retry == m.CommandAccepted(at=NOW, detail="already in the log")
    assert end == m.CommandAccepted(at=NOW, detail="WorkloadCompleted")
    started, completed = appended(log, seeded)
    assert started == msgspec.structs.replace(STARTED, pid=42)
    assert isinstance(completed, m.WorkloadCompleted)
    # Charged from the logged start: 16 GPUs x (at - started_at).
    assert completed.started_at == STARTED_AT
    assert completed.gpu_seconds == 16 * (NOW - 10 - STARTED_AT)


async def test_a_batch_judges_each_item_as_if_alone_on_its_hosts_subject() -> None:
    log = await seeded_log()
    svc = service(log)
    batch = m.PartReports(reports=(report(), report(host="h3"), report(host="h2", at=NOW + 60)))
    async with running(svc):
        data = await svc._batch_handler(subjects.HOSTS_REPORT, msgspec.json.encode(batch))
    answer = msgspec.json.decode(data, type=m.PartReportsAnswered)
    ok, no_part, ahead = answer.answers
    assert ok == m.CommandAccepted(at=NOW, detail="WorkloadStarted")
    assert isinstance(no_part, m.CommandRejected) and no_part.field == "reports[1].host"
    # h2 may not report a start: the host is judged before the times.
    assert isinstance(ahead, m.CommandRejected) and ahead.field == "reports[2].host"
    assert len(log.records("WORKLOADS", m.WorkloadStarted)) == 1


async def test_runs_of_a_host_silent_since_its_drain_are_recorded_lost_once() -> None:
    log = await seeded_log(STARTED)
    drained = m.HostDraining(host="h1", at=NOW - 40, reason="missed heartbeats for 10.0 s")
    await log.seed(subjects.host_state("h1"), drained)
    seeded = len(log.streams["WORKLOADS"])
    clock = Clock()
    svc = service(log, clock)
    async with running(svc):
        assert await svc.record_lost() == 1
        assert await svc.record_lost() == 0  # appended, whether folded back yet or not
        await log.settled()
        assert await svc.record_lost() == 0
    (lost,) = appended(log, seeded)
    assert isinstance(lost, m.WorkloadPreempted)
    assert (lost.reason, lost.at) == ("host-drain", NOW - 40)
    assert log.streams["WORKLOADS"][-1].headers["Nats-Msg-Id"] == f"ended:{G}:1"
