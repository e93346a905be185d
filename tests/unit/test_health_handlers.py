"""The health service's rules with no server: operators' drain and undrain (FastStream
subscribers, under ``TestNatsBroker``), heartbeats (nats-py, called directly), health
reports, missed heartbeats; the HOSTS stream is a ``MemoryLog``."""

from __future__ import annotations

import asyncio
import time

import msgspec
import nats.errors
import pytest
from handler_harness import NOW, Clock, ask, broker, raw_msg, running
from nats.js.api import RawStreamMsg

from allot.core.idle import IdlePolicy
from allot.proto import messages as m
from allot.proto import subjects
from allot.services.health import HealthService
from memory_log import MemoryFollower, MemoryLog

Reply = m.CommandAccepted | m.CommandRejected
REGISTERED = m.HostRegistered(host="h1", gpus=8, at=NOW - 60)
H2 = m.HostRegistered(host="h2", gpus=8, at=NOW - 60)


def service(log: MemoryLog, **kw: float) -> HealthService:
    kw = {"timeout_s": 3600.0, "check_s": 3600.0, **kw}  # no check runs unless called
    return HealthService(broker=broker("health"), record_log=log, clock=Clock(), **kw)


async def seeded(*records: msgspec.Struct, log: MemoryLog | None = None) -> MemoryLog:
    log = MemoryLog() if log is None else log
    for record in records:
        await log.seed(subjects.host_state(getattr(record, "host")), record)  # noqa: B009
    return log


def beat(host: str, gpus: int = 8) -> m.Heartbeat:
    return m.Heartbeat(host=host, sent_at=NOW, seq=1, gpus=gpus)


def new_records(log: MemoryLog, seeded: int) -> list[object]:
    return log.records("HOSTS")[seeded:]


# -- heartbeats (nats-py handler) -----------------------------------------------------------


async def test_a_hosts_first_heartbeat_registers_it_and_later_ones_add_nothing() -> None:
    log = MemoryLog()
    svc = service(log)
    async with running(svc):
        for _ in range(3):
            await svc._on_heartbeat(raw_msg(subjects.heartbeat("h1"), beat("h1", gpus=4)))
    assert log.records("HOSTS") == [m.HostRegistered(host="h1", gpus=4, at=NOW)]
    assert svc.heartbeats == 3
    assert svc.book.hosts["h1"].state == "healthy"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        pytest.param(beat("h2"), "host mismatch", id="a payload naming another host"),
        pytest.param(b'{"type": "Heartbeat", "host": "h1"}', "bad heartbeat", id="a bad body"),
    ],
)
async def test_a_heartbeat_that_is_not_the_subjects_hosts_is_ignored(
    body: msgspec.Struct | bytes, why: str
) -> None:
    log = MemoryLog()
    svc = service(log)
    async with running(svc):
        await svc._on_heartbeat(raw_msg(subjects.heartbeat("h1"), body))
    assert log.records("HOSTS") == []
    assert svc.ignored == {why: 1}
    assert svc.heartbeats == 1


async def test_a_heartbeat_ends_a_drain_for_missed_heartbeats_but_not_an_operators() -> None:
    missed = m.HostDraining(host="h1", at=NOW - 30, reason="missed heartbeats for 12.0 s")
    by_operator = m.HostDraining(host="h2", at=NOW - 30, reason="disk swap", by="ops")
    log = await seeded(REGISTERED, H2, missed, by_operator)
    svc = service(log)
    async with running(svc):
        for host in ("h1", "h2"):
            await svc._on_heartbeat(raw_msg(subjects.heartbeat(host), beat(host)))
        await log.settled()
    assert new_records(log, 4) == [m.HostHealthy(host="h1", at=NOW)]
    assert svc.book.hosts["h2"].state == "draining"


async def test_a_host_silent_past_the_timeout_is_drained_for_missed_heartbeats() -> None:
    log = await seeded(REGISTERED)
    svc = service(log, timeout_s=10.0)
    async with running(svc):
        svc.last_seen["h1"] = time.monotonic() - 11.0
        await svc.check_missing()
        await svc.check_missing()  # drained once
    (draining,) = new_records(log, 1)
    assert isinstance(draining, m.HostDraining)
    assert draining.reason.startswith("missed heartbeats for 11.")
    assert draining.by is None


# -- operators' commands (FastStream subscribers) ----------------------------------------------

COMMANDS = [
    # (subject, body, the field refused or None, what was logged)
    pytest.param(
        subjects.drain_as("h1", "ops"),
        m.DrainHost(host="h1", operator="ops", reason="swap"),
        None,
        [m.HostDraining(host="h1", at=NOW, reason="swap", by="ops")],
        id="an operator drains on its own login's subject",
    ),
    pytest.param(
        subjects.drain("h1"),
        m.DrainHost(host="h1", operator="anyone"),
        None,
        [m.HostDraining(host="h1", at=NOW, by="anyone")],
        id="the bare subject carries no login and checks none",
    ),
    pytest.param(
        subjects.drain_as("h1", "ops"),
        m.DrainHost(host="h1", operator="mallory"),
        "operator",
        [],
        id="an operator other than the subject's login is refused",
    ),
    pytest.param(
        subjects.undrain_as("h1", "ops"),
        m.UndrainHost(host="h1", operator="mallory"),
        "operator",
        [],
        id="an undrain names the subject's login too",
    ),
    pytest.param(
        subjects.drain_as("h1", "ops"),
        m.DrainHost(host="h2", operator="ops"),
        "host",
        [],
        id="a payload naming another (known) host than the subject's is refused",
    ),
    pytest.param(
        subjects.drain_as("h9", "ops"),
        m.DrainHost(host="h9", operator="ops"),
        "host",
        [],
        id="an unknown host is refused",
    ),
    pytest.param(
        subjects.undrain_as("h1", "ops"),
        m.UndrainHost(host="h1", operator="ops"),
        None,
        [],
        id="undraining a healthy host logs nothing",
    ),
]


@pytest.mark.parametrize(("subject", "body", "refused", "logged"), COMMANDS)
async def test_a_command_is_judged_by_its_subject(
    subject: str, body: msgspec.Struct, refused: str | None, logged: list[object]
) -> None:
    log = await seeded(REGISTERED, H2)
    svc = service(log)
    async with running(svc) as br:
        reply = await ask(br, subject, body, Reply)
    if refused is None:
        assert isinstance(reply, m.CommandAccepted), reply
    else:
        assert isinstance(reply, m.CommandRejected)
        assert reply.field == refused
    assert new_records(log, 2) == logged


async def test_a_drain_and_undrain_cycle_logs_draining_then_healthy() -> None:
    log = await seeded(REGISTERED)
    svc = service(log)
    async with running(svc) as br:
        drained = await ask(
            br, subjects.drain_as("h1", "ops"), m.DrainHost(host="h1", operator="ops"), Reply
        )
        assert svc.book.hosts["h1"].state == "draining"
        # The agent's heartbeats go on: they do not end an operator's drain.
        await svc._on_heartbeat(raw_msg(subjects.heartbeat("h1"), beat("h1")))
        assert svc.book.hosts["h1"].state == "draining"
        undrained = await ask(
            br, subjects.undrain_as("h1", "ops"), m.UndrainHost(host="h1", operator="ops"), Reply
        )
        assert svc.book.hosts["h1"].state == "healthy"
    assert drained == m.CommandAccepted(at=NOW, detail="h1 draining (by ops)")
    assert undrained == m.CommandAccepted(at=NOW, detail="h1 healthy again (by ops)")
    assert new_records(log, 1) == [
        m.HostDraining(host="h1", at=NOW, by="ops"),
        m.HostHealthy(host="h1", at=NOW),
    ]


# -- health reports (FastStream subscriber, no reply) ------------------------------------------


async def test_a_failed_report_drains_the_host_and_a_healthy_one_ends_it() -> None:
    log = await seeded(REGISTERED)
    svc = service(log)
    async with running(svc) as br:
        sick = m.HealthReport(host="h1", sent_at=NOW, healthy=False, failed_gpus=(3,))
        await br.publish(msgspec.json.encode(sick), subjects.health("h1"))
        await br.publish(msgspec.json.encode(sick), subjects.health("h1"))  # already draining
        well = m.HealthReport(host="h1", sent_at=NOW, healthy=True)
        await br.publish(msgspec.json.encode(well), subjects.health("h1"))
    assert new_records(log, 1) == [
        m.HostDraining(host="h1", at=NOW, reason="failed GPUs 3"),
        m.HostHealthy(host="h1", at=NOW),
    ]


@pytest.mark.parametrize(
    ("subject_host", "report_host", "why"),
    [
        pytest.param("h1", "h2", "host mismatch", id="a payload naming another host"),
        pytest.param("h9", "h9", "unregistered host", id="a host never registered"),
    ],
)
async def test_a_report_from_the_wrong_host_is_ignored(
    subject_host: str, report_host: str, why: str
) -> None:
    log = await seeded(REGISTERED)
    svc = service(log)
    async with running(svc) as br:
        sick = m.HealthReport(host=report_host, sent_at=NOW, healthy=False)
        await br.publish(msgspec.json.encode(sick), subjects.health(subject_host))
    assert new_records(log, 1) == []
    assert svc.ignored == {why: 1}


# -- GPU utilization and idle flags ---------------------------------------------------------


async def _placed_log(log: MemoryLog | None = None) -> MemoryLog:
    """h1 registered; nlp's w1 placed on GPUs 0-1 at NOW (in ``log``, else a new one)."""
    log = await seeded(REGISTERED, log=log)
    await log.seed(subjects.LEADER, m.LeaderElected(epoch=1, leader="p", at=NOW - 10))
    await log.seed_events(
        "nlp",
        m.WorkloadSubmitted(
            workload_id="w1",
            client_id="w1",
            user="alice",
            gpus=2,
            allocation="nlp",
            min_runtime_s=600,
            at=NOW - 5,
        ),
        m.WorkloadPlaced(
            workload_id="w1",
            allocation="nlp",
            at=NOW,
            gpus=2,
            assignment=(m.HostGpus(host="h1", gpus=(0, 1)),),
            min_runtime_s=600,
            epoch=1,
        ),
    )
    return log


async def _report(svc: HealthService, clock: Clock, util: float) -> Reply:
    since = clock.now
    clock.advance(60.0)
    body = m.HostUtilization(host="h1", since=since, sent_at=clock.now, util=(util,) * 8)
    return await svc.utilization(subjects.host_util("h1"), msgspec.json.encode(body))


def idle_service(log: MemoryLog, clock: Clock, *, preempt: bool = False) -> HealthService:
    policy = IdlePolicy(window_s=300.0, max_gap_s=120.0, preempt=preempt)
    return HealthService(
        broker=broker("health"),
        record_log=log,
        clock=clock,
        timeout_s=3600.0,
        check_s=3600.0,
        idle_policy=policy,
    )


async def test_a_new_hosts_first_report_waits_for_the_idle_watch_to_read_its_registration() -> None:
    """A host is registered on its first heartbeat; its first utilization report may come
    before the idle watch (which takes the log every ``IDLE_READ_EVERY_S``) has read that:
    the report waits for it instead of being refused as "not a registered host"."""
    log, clock = await _placed_log(), Clock()
    svc = idle_service(log, clock)
    async with running(svc):
        await svc.idle_ready.wait()
        follower = svc._idle_follower
        assert isinstance(follower, MemoryFollower)
        apply = follower.on_record

        async def lagging(subject: str, record: msgspec.Struct) -> None:
            await asyncio.sleep(0.2)
            apply(subject, record)

        follower.on_record = lagging
        await svc._on_heartbeat(raw_msg(subjects.heartbeat("h2"), beat("h2")))
        assert "h2" in svc.book.hosts and "h2" not in svc.idle.fold.state
        body = m.HostUtilization(host="h2", since=clock.now - 1, sent_at=clock.now, util=(0.0,))
        answer = await svc.utilization(subjects.host_util("h2"), msgspec.json.encode(body))
        # A host nobody registered is still refused at once.
        body = m.HostUtilization(host="h9", since=clock.now - 1, sent_at=clock.now, util=(0.0,))
        unknown = await svc.utilization(subjects.host_util("h9"), msgspec.json.encode(body))
    assert isinstance(answer, m.CommandAccepted), answer
    assert isinstance(unknown, m.CommandRejected) and unknown.field == "host"
    assert svc.util_rejected == {"host": 1}


async def test_idle_gpus_are_recorded_flagged_once_and_the_flag_outlives_a_restart() -> None:
    log, clock = await _placed_log(), Clock()
    svc = idle_service(log, clock)
    async with running(svc):
        await svc.idle_ready.wait()
        for _ in range(6):
            assert isinstance(await _report(svc, clock, 1.0), m.CommandAccepted)
        refused = await svc.utilization(
            subjects.host_util("h1"),
            msgspec.json.encode(
                m.HostUtilization(host="h2", since=clock.now - 1, sent_at=clock.now, util=(0.0,))
            ),
        )
        assert isinstance(refused, m.CommandRejected) and refused.field == "host"
        await log.settled()
        tracks = dict(svc.idle.tracks)
    flags = log.records("USAGE", m.WorkloadFlaggedIdle)
    # The watch reads no submissions: the user comes from the log when the flag is raised.
    assert [(f.workload_id, f.user, f.idle_since, f.at) for f in flags] == [
        ("w1", "alice", NOW, NOW + 300)
    ]
    assert len(log.records("USAGE", m.HostUtilizationRecorded)) == 6
    assert svc.util_rejected == {"host": 1}

    # A new process on the same log: the same evidence, the flag still open; more idle
    # reports flag nothing new, a busy one clears the stretch the log holds open.
    again = idle_service(log, clock)
    async with running(again):
        await again.idle_ready.wait()
        assert again.idle.tracks == tracks
        assert [r.workload_id for r in again.idle.snapshot("nlp", clock.now).rows] == ["w1"]
        await _report(again, clock, 1.0)
        await _report(again, clock, 80.0)
        await log.settled()
    assert len(log.records("USAGE", m.WorkloadFlaggedIdle)) == 1
    (cleared,) = log.records("USAGE", m.WorkloadIdleCleared)
    assert isinstance(cleared, m.WorkloadIdleCleared)
    assert (cleared.why, cleared.idle_since, cleared.until) == ("busy", NOW, NOW + 420)


async def test_under_idle_preempt_the_flag_asks_for_preemption() -> None:
    """The switch is the flag's: the placement leader acts on ``preempt`` (decision 0055)."""
    for preempt in (False, True):
        log, clock = await _placed_log(), Clock()
        svc = idle_service(log, clock, preempt=preempt)
        async with running(svc):
            await svc.idle_ready.wait()
            for _ in range(6):
                await _report(svc, clock, 1.0)
            await log.settled()
        (flag,) = log.records("USAGE", m.WorkloadFlaggedIdle)
        assert isinstance(flag, m.WorkloadFlaggedIdle) and flag.preempt is preempt


class UnreadableSubmissions(MemoryLog):
    """A log whose submissions cannot be read (the server gone at that moment)."""

    async def read(self, stream: str, subject: str, *, first: bool = False) -> RawStreamMsg | None:
        if subject.endswith(".submitted"):
            raise nats.errors.TimeoutError
        return await super().read(stream, subject, first=first)


async def test_a_flag_whose_user_cannot_be_read_is_logged_without_one() -> None:
    """The flag is judged already (its track says flagged): losing it for an optional field
    would leave the stretch flagged here and never in the log."""
    log, clock = await _placed_log(UnreadableSubmissions()), Clock()
    svc = idle_service(log, clock)
    async with running(svc):
        await svc.idle_ready.wait()
        for _ in range(6):
            assert isinstance(await _report(svc, clock, 1.0), m.CommandAccepted)
        await log.settled()
    (flag,) = log.records("USAGE", m.WorkloadFlaggedIdle)
    assert isinstance(flag, m.WorkloadFlaggedIdle)
    assert (flag.workload_id, flag.user, flag.idle_since) == ("w1", None, NOW)


def test_idle_preempt_is_off_unless_asked_on_the_command_line() -> None:
    from allot.services import health

    assert health.idle_policy(health.parser().parse_args([])).preempt is False
    args = health.parser().parse_args(["--idle-preempt"])
    assert health.idle_policy(args).preempt is True
    args = health.parser().parse_args(["--idle-threshold-pct", "0"])
    with pytest.raises(SystemExit, match="--idle-threshold-pct"):
        health.idle_policy(args)
