"""The health service's idle detection without a server (``allot.eventlog.idle_watch``):
reports checked against the clock and the log, attributed to the allocated runs holding
the GPUs, flags and clears; rebuilt after a restart from what it logged."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allot.core.errors import ValidationError
from allot.core.idle import IdlePolicy
from allot.eventlog.idle_watch import IdleWatch, msg_id
from allot.proto import messages as m
from allot.proto.messages import LIVE_STATES

T = 1_800_000_000.0
POLICY = IdlePolicy(threshold_pct=5.0, window_s=600.0, max_gap_s=120.0)


def log_records() -> list[msgspec.Struct]:
    """h1 (8 GPUs): nlp's w1 on GPUs 0-1 (allocated), free work u1 on GPU 2."""
    out: list[msgspec.Struct] = [
        m.HostRegistered(host="h1", gpus=8, at=T - 100),
        m.LeaderElected(epoch=1, leader="p", at=T - 100),
    ]
    for wid, alloc, gpus, mrt in (("w1", "nlp", (0, 1), 600), ("u1", None, (2,), 0)):
        out.append(
            m.WorkloadSubmitted(
                workload_id=wid,
                client_id=wid,
                user="alice",
                gpus=len(gpus),
                allocation=alloc,
                min_runtime_s=mrt,
                at=T - 50,
            )
        )
        out.append(
            m.WorkloadPlaced(
                workload_id=wid,
                allocation=alloc,
                at=T,
                gpus=len(gpus),
                assignment=(m.HostGpus(host="h1", gpus=gpus),),
                min_runtime_s=mrt,
                epoch=1,
            )
        )
    return out


def watch(records: list[msgspec.Struct] | None = None) -> IdleWatch:
    w = IdleWatch(POLICY)
    for r in records if records is not None else log_records():
        w.apply(r)
    return w


def report(since: float, until: float, util: tuple[float | None, ...]) -> m.HostUtilization:
    return m.HostUtilization(host="h1", since=since, sent_at=until, util=util)


IDLE = (1.0, 2.0, 90.0, 0.0, 0.0, 0.0, 0.0, 0.0)
"""w1's GPUs idle (highest 2%), the free run's busy."""


@pytest.mark.parametrize(
    ("host", "body", "field", "words"),
    [
        ("h9", report(T, T + 60, IDLE), "host", "not a registered host"),
        ("h1", report(T, T + 500, IDLE), "sent_at", "ahead of the clock"),
        ("h1", report(T - 700, T - 400, IDLE), "sent_at", "s old"),
        ("h1", report(T + 60, T + 60, IDLE), "since", "must be before sent_at"),
        ("h1", report(T - 4000, T + 60, IDLE), "since", "at most 3600 s"),
        ("h1", report(T, T + 60, (0.0,) * 9), "util", "reports 9 GPUs; h1 registered 8"),
    ],
    ids=[
        "an-unregistered-host",
        "a-time-ahead-of-the-clock",
        "a-stale-report",
        "an-empty-interval",
        "an-interval-over-an-hour",
        "more-gpus-than-registered",
    ],
)
def test_absurd_reports_are_refused_naming_the_field(
    host: str, body: m.HostUtilization, field: str, words: str
) -> None:
    w = watch()
    with pytest.raises(ValidationError) as e:
        w.judge(host, body, now=T + 60)
    assert e.value.field == field
    assert words in e.value.reason
    assert w.tracks == {}


def test_a_report_is_attributed_to_the_allocated_run_holding_the_gpus() -> None:
    w = watch()
    judged = w.judge("h1", report(T - 30, T + 60, IDLE), now=T + 60)
    assert judged.flags == ()
    assert judged.recorded is not None
    (part,) = judged.recorded.parts  # the free run is never judged
    assert (part.workload_id, part.gpus, part.util_pct) == ("w1", (0, 1), 2.0)
    # the interval is cut at the placement: the GPUs were someone else's before
    assert part.idle_since == T
    assert w.judge("h1", report(T + 60, T + 120, (None, 1.0)), now=T + 120).recorded is not None


def test_a_host_without_allocated_work_records_nothing() -> None:
    records = [r for r in log_records() if getattr(r, "workload_id", "u1") == "u1"]
    assert watch(records).judge("h1", report(T, T + 60, IDLE), now=T + 60).recorded is None


def feed(w: IdleWatch, start: float, n: int, util: tuple[float | None, ...] = IDLE) -> list:
    out: list[msgspec.Struct] = []
    for i in range(n):
        judged = w.judge(
            "h1", report(start + 60 * i, start + 60 * (i + 1), util), start + 60 * (i + 1)
        )
        out += ([judged.recorded] if judged.recorded else []) + list(judged.flags)
    return out


def test_idle_past_the_window_is_flagged_once_then_cleared_when_busy() -> None:
    w = watch()
    logged = feed(w, T, 11)
    flags = [r for r in logged if isinstance(r, m.WorkloadFlaggedIdle)]
    assert len(flags) == 1
    flag = flags[0]
    assert (flag.workload_id, flag.allocation, flag.user, flag.gpus) == ("w1", "nlp", "alice", 2)
    assert (flag.idle_since, flag.at) == (T, T + 600)
    assert flag.reason.startswith("every GPU below 5% for 10.0m")
    assert msg_id(flag) == f"idle:w1:1:{T!r}"
    logged = feed(w, T + 660, 1, util=(50.0,) * 8)
    (cleared,) = [r for r in logged if isinstance(r, m.WorkloadIdleCleared)]
    assert (cleared.why, cleared.idle_since, cleared.until) == ("busy", T, T + 660)
    assert cleared.idle_gpu_seconds == 2 * 660


def test_a_flagged_run_that_ends_is_cleared_and_forgotten() -> None:
    w = watch()
    feed(w, T, 11)
    assert w.ended(T + 700) == []  # still running
    w.apply(m.WorkloadCompleted(workload_id="w1", allocation="nlp", at=T + 700))
    (cleared,) = w.ended(T + 701)
    assert (cleared.why, cleared.until) == ("ended", T + 660)
    assert w.tracks == {}


def test_a_restart_rebuilt_from_the_log_goes_on_as_if_none_happened() -> None:
    """The last recorded report and the open flag give back the track: no second flag,
    and a busy sample clears the stretch the log holds open."""
    before = watch()
    logged = feed(before, T, 11)
    again = watch(
        [*log_records(), *[r for r in logged if not isinstance(r, m.HostUtilizationRecorded)]]
    )
    last = [r for r in logged if isinstance(r, m.HostUtilizationRecorded)][-1]
    again.seed(last)
    again.adopt_open_flags()
    assert again.tracks == before.tracks
    assert [
        r for r in feed(again, T + 660, 3) if not isinstance(r, m.HostUtilizationRecorded)
    ] == []
    (cleared,) = [
        r for r in feed(again, T + 840, 1, util=(50.0,) * 8) if isinstance(r, m.WorkloadIdleCleared)
    ]
    assert (cleared.idle_since, cleared.why) == (T, "busy")
    assert [s.workload_id for s in again.book.open_stretches()] == ["w1"]  # until it is read back


def test_the_snapshot_lists_open_flags_of_the_asked_allocation() -> None:
    w = watch()
    for r in feed(w, T, 11):
        w.apply(r)
    assert [r.workload_id for r in w.snapshot(None, T + 700).rows] == ["w1"]
    assert w.snapshot("vision", T + 700).rows == ()
    snap = w.snapshot("nlp", T + 700)
    assert (snap.threshold_pct, snap.window_s) == (5.0, 600.0)


# -- fed from the placements on (``subjects.RUNS_FROM_PLACEMENTS``) ----------------------

WIDS = ("w1", "w2", "w3", "w4")


@st.composite
def workload_logs(draw: st.DrawFn) -> list[msgspec.Struct]:
    """A log as the services write it: each workload's submission before anything else of
    it, then placements (of the current epoch or a paused old leader's, on GPUs free or
    not), notices, cancels and ends in any order. Every submission is resumable: a leader
    never places again what ended for good, so what the stand-in assumes cannot show."""
    out: list[msgspec.Struct] = [
        m.HostRegistered(host="h1", gpus=4, at=T - 100),
        m.HostRegistered(host="h2", gpus=4, at=T - 100),
        m.LeaderElected(epoch=1, leader="p", at=T - 100),
    ]
    epoch, submitted, attempt = 1, set[str](), dict.fromkeys(WIDS, 0)
    shape = {w: (draw(st.sampled_from((1, 2))), draw(st.sampled_from((0, 600)))) for w in WIDS}
    for i in range(draw(st.integers(1, 30))):
        at = T + i
        wid = draw(st.sampled_from(WIDS))
        gpus, mrt = shape[wid]
        alloc = "nlp" if wid != "w4" else None
        if wid not in submitted:
            submitted.add(wid)
            out.append(
                m.WorkloadSubmitted(
                    workload_id=wid,
                    client_id=wid,
                    user="alice",
                    gpus=gpus,
                    allocation=alloc,
                    min_runtime_s=mrt,
                    at=at,
                )
            )
            continue
        event = draw(st.sampled_from(("placed", "notice", "cancel", "end", "leader")))
        n = attempt[wid] + draw(st.sampled_from((0, 1)))
        if event == "placed":
            first = draw(st.integers(0, 4 - gpus))
            host = draw(st.sampled_from(("h1", "h2")))
            placed_epoch = draw(st.sampled_from((epoch, epoch - 1)))
            out.append(
                m.WorkloadPlaced(
                    workload_id=wid,
                    allocation=alloc,
                    at=at,
                    gpus=gpus,
                    min_runtime_s=mrt,
                    assignment=(m.HostGpus(host=host, gpus=tuple(range(first, first + gpus))),),
                    attempt=attempt[wid] + 1,
                    epoch=placed_epoch,
                )
            )
            attempt[wid] += placed_epoch == epoch
        elif event == "notice":
            out.append(
                m.PreemptionNotice(
                    workload_id=wid,
                    allocation=alloc,
                    at=at,
                    reason="fair-share",
                    grace_deadline=at + 60,
                    gpus=gpus,
                    attempt=max(1, n),
                    epoch=epoch,
                    requeue=draw(st.booleans()),
                )
            )
        elif event == "cancel":
            out.append(m.CancelRequested(workload_id=wid, allocation=alloc, by="alice", at=at))
        elif event == "end":
            kind = draw(st.sampled_from((m.WorkloadCompleted, m.WorkloadPreempted)))
            extra = {"reason": "fair-share"} if kind is m.WorkloadPreempted else {}
            out.append(kind(workload_id=wid, allocation=alloc, at=at, attempt=max(1, n), **extra))
        else:
            epoch += 1
            out.append(m.LeaderElected(epoch=epoch, leader="q", at=at))
    return out


def runs(w: IdleWatch) -> dict[str, tuple[object, ...]]:
    """What the watch judges by: each live run's status, attempt, GPUs, start and whether
    it is allocated, and which runs each host holds."""
    live = {
        wid: (rec.status, rec.attempt, rec.assignment, rec.started_at, rec.workload.allocated)
        for wid, rec in w.fold.records.items()
        if rec.status in LIVE_STATES
    }
    return {**live, "on_host": {h: w.fold.workload_on(h) for h in ("h1", "h2")}}


@given(workload_logs())
@settings(max_examples=300, deadline=None)
def test_without_submissions_the_watch_sees_the_same_runs(log: list[msgspec.Struct]) -> None:
    whole = watch(log)
    placements_on = watch([r for r in log if not isinstance(r, m.WorkloadSubmitted)])
    assert runs(placements_on) == runs(whole)


def test_a_flag_of_a_run_read_from_its_placement_names_no_user_until_the_service_asks() -> None:
    w = watch([r for r in log_records() if not isinstance(r, m.WorkloadSubmitted)])
    (flag,) = [r for r in feed(w, T, 11) if isinstance(r, m.WorkloadFlaggedIdle)]
    assert (flag.workload_id, flag.allocation, flag.gpus, flag.user) == ("w1", "nlp", 2, None)
