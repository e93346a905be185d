"""``allot.eventlog.host_work``: each host's work list and what an agent's report becomes."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from allot.core.errors import ValidationError
from allot.eventlog.host_work import CLOCK_SKEW_S, DispatchBook, check_report_times
from allot.proto import codec
from allot.proto import messages as m
from allot.proto.subjects import Kind

T0 = 1_000_000.0
NOW = T0 + 20  # dispatch's clock when the reports (at T0 + 10) are judged


def _book(*hosts: str) -> DispatchBook:
    book = DispatchBook()
    for host in hosts:
        book.apply(m.HostRegistered(host=host, gpus=4, at=T0))
    book.apply(m.LeaderElected(epoch=1, leader="p1", at=T0))
    return book


def _submit(book: DispatchBook, wid: str, gpus: int = 1, **kw: object) -> set[str]:
    return book.apply(
        m.WorkloadSubmitted(
            workload_id=wid,
            client_id=wid,
            user="u",
            gpus=gpus,
            allocation="nlp",
            min_runtime_s=60,
            at=T0,
            **kw,  # type: ignore[arg-type]
        )
    )


def _place(
    book: DispatchBook, wid: str, parts: dict[str, tuple[int, ...]], *, epoch: int = 1
) -> set[str]:
    return book.apply(
        m.WorkloadPlaced(
            workload_id=wid,
            allocation="nlp",
            at=T0 + 1,
            gpus=sum(len(g) for g in parts.values()),
            assignment=tuple(m.HostGpus(host=h, gpus=g) for h, g in parts.items()),
            epoch=epoch,
        )
    )


def _report(host: str, wid: str, event: m.PartEvent, **kw: object) -> m.PartReport:
    kw.setdefault("at", T0 + 10)
    return m.PartReport(host=host, workload_id=wid, attempt=1, event=event, **kw)  # type: ignore[arg-type]


def test_a_placement_lists_each_part_on_its_own_host_and_the_primary_reports() -> None:
    book = _book("h01", "h02", "h03")
    assert _submit(book, "g", gpus=4, command=("train",)) == set()
    assert _place(book, "g", {"h02": (0, 1), "h01": (2, 3)}) == {"h01", "h02"}

    [on_h01] = book.tasks("h01")
    [on_h02] = book.tasks("h02")
    assert (on_h01.gpus, on_h01.primary, on_h01.command) == ((2, 3), True, ("train",))
    assert (on_h02.gpus, on_h02.primary) == ((0, 1), False)
    assert book.tasks("h03") == ()
    assert book.work("h01", 7, T0).seq == 7


def test_an_end_is_listed_to_a_gangs_other_hosts_not_to_the_primary_that_reported_it() -> None:
    book = _book("h01", "h02", "h03")
    _submit(book, "g", gpus=4, command=("train",))
    _place(book, "g", {"h02": (0, 1), "h01": (2, 3)})
    end = book.record_for("h01", _report("h01", "g", "exited", exit_code=0), now=NOW)
    assert isinstance(end, m.WorkloadCompleted)
    assert book.apply(end) == {"h02"}  # h02 still runs its part until told
    assert book.tasks("h01") == book.tasks("h02") == ()


def test_a_stale_epoch_placement_lists_nothing() -> None:
    book = _book("h01")
    _submit(book, "w")
    assert _place(book, "w", {"h01": (0,)}, epoch=0) == set()
    assert book.tasks("h01") == ()


def test_notice_cancel_start_and_end_change_the_list() -> None:
    book = _book("h01")
    _submit(book, "w")
    _place(book, "w", {"h01": (0,)})
    started = m.WorkloadStarted(workload_id="w", allocation="nlp", at=T0 + 2, host="h01", gpus=1)
    assert book.apply(started) == set()  # the agent that reported it has nothing to do
    assert book.tasks("h01")[0].started  # but a restarted agent asking for its list learns it
    notice = m.PreemptionNotice(
        workload_id="w",
        allocation="nlp",
        at=T0 + 3,
        reason="better-ranked",
        grace_deadline=T0 + 33,
        requeue=True,
        gpus=1,
        epoch=1,
    )
    assert book.apply(notice) == {"h01"}
    [task] = book.tasks("h01")
    assert (task.stop, task.kill_at) == ("notice", T0 + 33)
    end = book.record_for("h01", _report("h01", "w", "exited", exit_code=-15), now=NOW)
    assert isinstance(end, m.WorkloadPreempted)
    assert end.reason == "better-ranked" and end.started_at == T0 + 2
    # h01's agent reported the end itself: its list changes nothing it runs.
    assert book.apply(end) == set()
    assert book.tasks("h01") == ()
    # A retry of the same report after the log ended the attempt records nothing more.
    assert book.record_for("h01", _report("h01", "w", "exited", exit_code=-15), now=NOW) is None


@pytest.mark.parametrize(
    ("event", "exit_code", "stopping", "cancel", "expected", "reason"),
    [
        ("exited", 0, False, False, m.WorkloadCompleted, None),
        ("exited", 3, False, False, m.WorkloadFailed, "exited with code 3"),
        # Ended by its agent's stop (a planned host shutdown): a drain's preemption.
        ("exited", 0, True, False, m.WorkloadPreempted, "host-drain"),
        ("exited", -15, True, False, m.WorkloadPreempted, "host-drain"),
        # Lost in an agent restart (a node failure): preempted as a drain, so requeued.
        ("lost", None, False, False, m.WorkloadPreempted, "host-drain"),
        ("not-started", None, False, False, m.WorkloadFailed, "no command"),
        ("exited", 0, False, True, m.WorkloadCancelled, "wrong config"),
    ],
)
def test_the_terminal_record_follows_the_logs_view(  # noqa: PLR0917 (one table row)
    event: m.PartEvent,
    exit_code: int | None,
    stopping: bool,
    cancel: bool,
    expected: type[msgspec.Struct],
    reason: str | None,
) -> None:
    book = _book("h01")
    _submit(book, "w", gpus=2)
    _place(book, "w", {"h01": (0, 1)})
    if cancel:
        book.apply(
            m.CancelRequested(
                workload_id="w", allocation="nlp", by="bob", reason="wrong config", at=T0 + 5
            )
        )
        assert book.tasks("h01")[0].stop == "cancel"
    detail = "no command" if event == "not-started" else f"exited with code {exit_code}"
    report = _report(
        "h01",
        "w",
        event,
        exit_code=exit_code,
        stopping=stopping,
        detail=detail,
        started_at=T0 + 4,
    )
    record = book.record_for("h01", report, now=NOW)
    assert type(record) is expected
    assert record.gpu_seconds == pytest.approx(2 * 6)  # type: ignore[attr-defined]
    if reason is not None:
        assert reason in record.reason  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("stopping", "exit_code", "expected", "requeued"),
    [
        (True, -15, m.WorkloadPreempted, True),  # the agent's stop ended it: run it again
        (False, 3, m.WorkloadFailed, False),  # it had failed on its own: that stands
        (False, 0, m.WorkloadCompleted, False),  # it had finished on its own: that stands
    ],
    ids=["stopped-by-agent", "failed-on-its-own", "completed-on-its-own"],
)
def test_a_host_shutdown_requeues_what_it_stopped_and_keeps_what_ended_on_its_own(
    stopping: bool, exit_code: int, expected: type[msgspec.Struct], requeued: bool
) -> None:
    book = _book("h01")
    _submit(book, "w", gpus=1)  # resumable (the default)
    _place(book, "w", {"h01": (0,)})
    record = book.record_for(
        "h01", _report("h01", "w", "exited", exit_code=exit_code, stopping=stopping), now=NOW
    )
    assert type(record) is expected
    assert record is not None
    book.apply(record)
    rec = book.fold.records["w"]
    assert (rec.status == "pending") is requeued
    assert ("w" in book.fold.queue) is requeued
    assert book.tasks("h01") == ()


@pytest.mark.parametrize(
    ("subject_host", "report", "field"),
    [
        ("h02", _report("h02", "g", "started"), "host"),  # a secondary reports no start
        # A secondary's clean exit completes nothing (found by the hostile-input suite: any
        # one part could complete the gang).
        ("h02", _report("h02", "g", "exited", exit_code=0), "host"),
        ("h03", _report("h03", "g", "exited"), "host"),  # not in the assignment at all
        ("h03", _report("h03", "g", "lost"), "host"),  # no part of it: cannot end it
        ("h02", _report("h01", "g", "lost"), "host"),  # a secondary speaking for the primary
        ("h01", _report("h02", "g", "exited"), "host"),  # the payload names another host
        ("h01", _report("h01", "ghost", "exited"), "workload_id"),
        (
            "h01",
            m.PartReport(host="h01", workload_id="g", attempt=2, event="started", at=T0),
            "attempt",
        ),
    ],
)
def test_reports_not_this_hosts_to_make_are_refused(
    subject_host: str, report: m.PartReport, field: str
) -> None:
    book = _book("h01", "h02", "h03")
    _submit(book, "g", gpus=2)
    _place(book, "g", {"h01": (0,), "h02": (0,)})
    with pytest.raises(ValidationError) as err:
        book.record_for(subject_host, report, now=NOW)
    assert err.value.field == field


PLACED = T0 + 1  # ``_place``'s time
AN_HOUR_ON = PLACED + 3600  # dispatch's clock in the table below: an hour since placement
DAYS_30 = 30 * 86_400
SKEW = CLOCK_SKEW_S


def _times(event: m.PartEvent, at: float, started_at: float | None = None) -> m.PartReport:
    return m.PartReport(
        host="h01", workload_id="w", attempt=1, event=event, at=at, started_at=started_at
    )


@pytest.mark.parametrize(
    ("report", "logged_start", "field"),
    [
        pytest.param(_times("started", PLACED), None, None, id="a-start-at-its-placement"),
        pytest.param(
            _times("started", PLACED - SKEW / 2), None, None, id="a-start-skewed-before-placement"
        ),
        pytest.param(
            _times("started", PLACED - SKEW - 1), None, "at", id="a-start-before-placement"
        ),
        pytest.param(
            _times("started", AN_HOUR_ON + SKEW / 2), None, None, id="a-start-skewed-ahead"
        ),
        pytest.param(_times("started", AN_HOUR_ON + SKEW + 1), None, "at", id="a-start-to-come"),
        pytest.param(
            _times("exited", AN_HOUR_ON, PLACED + 5), PLACED + 5, None, id="an-end-now-of-its-run"
        ),
        pytest.param(
            _times("exited", AN_HOUR_ON + DAYS_30, PLACED + 5),
            PLACED + 5,
            "at",
            id="an-end-30-days-ahead",
        ),
        pytest.param(
            _times("exited", m.MAX_TIME, PLACED + 5), PLACED + 5, "at", id="an-end-at-1e11"
        ),
        pytest.param(
            _times("exited", AN_HOUR_ON, PLACED - DAYS_30),
            PLACED + 5,
            "started_at",
            id="a-start-30-days-before-placement",
        ),
        pytest.param(
            _times("exited", AN_HOUR_ON, AN_HOUR_ON + SKEW + 1),
            None,
            "started_at",
            id="a-start-to-come-named-before-the-end-before-it",
        ),
        pytest.param(
            _times("exited", PLACED + 100, PLACED + 101),
            None,
            "at",
            id="an-end-before-its-own-start-no-skew-on-one-clock",
        ),
        pytest.param(_times("lost", PLACED - SKEW - 1), None, "at", id="an-end-before-placement"),
        pytest.param(
            _times("exited", PLACED + 100 - SKEW - 1),
            PLACED + 100,
            "at",
            id="an-end-before-the-logged-start",
        ),
        pytest.param(
            _times("not-started", PLACED + 100 - SKEW / 2),
            PLACED + 100,
            None,
            id="an-end-skewed-before-the-logged-start",
        ),
        pytest.param(
            _times("exited", AN_HOUR_ON + SKEW * 2 / 3, PLACED - SKEW * 2 / 3),
            None,
            "started_at",
            id="each-time-within-the-skew-but-the-run-longer-than-since-placement",
        ),
        pytest.param(
            _times("exited", AN_HOUR_ON + SKEW * 2 / 3),
            PLACED - SKEW * 2 / 3,
            "at",
            id="a-run-from-its-logged-start-longer-than-since-placement",
        ),
        pytest.param(
            _times("exited", AN_HOUR_ON + SKEW * 2 / 3), None, None, id="a-run-from-its-placement"
        ),
    ],
)
def test_report_times_the_log_and_the_clock_contradict_are_refused_naming_the_field(
    report: m.PartReport, logged_start: float | None, field: str | None
) -> None:
    def judge() -> None:
        check_report_times(report, placed_at=PLACED, logged_start=logged_start, now=AN_HOUR_ON)

    if field is None:
        judge()
        return
    with pytest.raises(ValidationError) as err:
        judge()
    assert err.value.field == field


@pytest.mark.parametrize(
    ("report", "field"),
    [
        # The attack of issue 34: charged 2,592,003 GPU-seconds before the check.
        (_report("h01", "w", "exited", exit_code=0, at=NOW + DAYS_30), "at"),
        (_report("h01", "w", "exited", exit_code=0, started_at=T0 - DAYS_30), "started_at"),
        (_report("h01", "w", "started", at=NOW + DAYS_30), "at"),
    ],
    ids=["end-30-days-ahead", "start-30-days-back", "start-30-days-ahead"],
)
def test_a_report_with_impossible_times_causes_no_record(report: m.PartReport, field: str) -> None:
    book = _book("h01")
    _submit(book, "w")
    _place(book, "w", {"h01": (0,)})
    with pytest.raises(ValidationError) as err:
        book.record_for("h01", report, now=NOW)
    assert err.value.field == field
    assert book.started == {} and book.fold.records["w"].status == "running"


def test_a_report_of_an_ended_run_from_a_host_that_never_ran_it_is_refused() -> None:
    """Not answered "already in the log": that would tell any host the attempt is over,
    and its report was never its to make."""
    book = _book("h01", "h02")
    _submit(book, "w")
    _place(book, "w", {"h01": (0,)})
    end = book.record_for("h01", _report("h01", "w", "exited", exit_code=0), now=NOW)
    assert end is not None
    book.apply(end)
    with pytest.raises(ValidationError) as err:
        book.record_for("h02", _report("h02", "w", "exited", exit_code=0), now=NOW)
    assert err.value.field == "host"
    # Its own host's retry is still answered from the log.
    assert book.record_for("h01", _report("h01", "w", "exited", exit_code=0), now=NOW) is None


@given(
    st.lists(
        st.tuples(st.sampled_from(["h01", "h02", "h03"]), st.integers(min_value=0, max_value=3)),
        min_size=1,
        max_size=12,
    )
)
def test_every_running_part_is_listed_on_exactly_its_hosts(picks: list[tuple[str, int]]) -> None:
    """Whatever gets placed, each host's list is exactly the parts the fold runs there."""
    book = _book("h01", "h02", "h03")
    for i, (host, gpu) in enumerate(picks):
        wid = f"w{i}"
        _submit(book, wid)
        _place(book, wid, {host: (gpu,)})  # a double booking is refused by the fold
    for host in ("h01", "h02", "h03"):
        listed = {(t.workload_id, t.gpus) for t in book.tasks(host)}
        running = {
            (wid, tuple(g))
            for wid in book.fold.workload_on(host)
            for h, g in book.fold.records[wid].assignment
            if h == host
        }
        assert listed == running
        gpus = [g for _, gs in listed for g in gs]
        assert len(gpus) == len(set(gpus))  # no GPU listed twice


def test_a_gangs_parts_are_listed_with_the_assignments_hosts_primary_first() -> None:
    """``ALLOT_HOSTS`` / ``ALLOT_HOST_RANK``: every part gets the same hosts, the primary
    (the first sorted) at rank 0, then the others in assignment order."""
    book = _book("h01", "h02", "h03")
    _submit(book, "g", gpus=3)
    _place(book, "g", {"h03": (0,), "h01": (1,), "h02": (2,)})
    lists = {host: book.tasks(host)[0] for host in ("h01", "h02", "h03")}
    assert {t.hosts for t in lists.values()} == {("h01", "h03", "h02")}
    assert [h for h, t in lists.items() if t.primary] == ["h01"]
    _submit(book, "solo")
    _place(book, "solo", {"h02": (3,)})
    assert next(t for t in book.tasks("h02") if t.workload_id == "solo").hosts == ("h02",)


@pytest.mark.parametrize(
    ("event", "exit_code", "resumable", "expected", "status"),
    [
        ("lost", None, True, m.WorkloadPreempted, "pending"),  # lost in a restart: requeued
        ("lost", None, False, m.WorkloadPreempted, "preempted"),
        ("exited", 3, True, m.WorkloadFailed, "failed"),  # failed on its own: all of it fails
        ("not-started", None, True, m.WorkloadFailed, "failed"),
    ],
    ids=["lost-resumable", "lost-not-resumable", "failed", "not-started"],
)
def test_a_gangs_secondary_part_ending_ends_the_attempt_and_the_primary_is_told(
    event: m.PartEvent,
    exit_code: int | None,
    resumable: bool,
    expected: type[msgspec.Struct],
    status: str,
) -> None:
    book = _book("h01", "h02", "h03")
    _submit(book, "g", gpus=4, command=("train",), resumable=resumable)
    _place(book, "g", {"h02": (0, 1), "h01": (2, 3)})  # primary h01
    started = m.WorkloadStarted(workload_id="g", allocation="nlp", at=T0 + 2, host="h01", gpus=4)
    book.apply(started)
    end = book.record_for("h02", _report("h02", "g", event, exit_code=exit_code), now=NOW)
    assert type(end) is expected
    assert end is not None
    if isinstance(end, m.WorkloadPreempted):
        assert end.reason == "host-drain"
    if isinstance(end, m.WorkloadFailed) and exit_code is not None:
        assert end.exit_code == exit_code
    assert isinstance(end, (m.WorkloadPreempted, m.WorkloadFailed))
    assert end.gpu_seconds == pytest.approx(4 * (T0 + 10 - (T0 + 2)))
    # The primary (h01) still runs its part: it is the host told, not the reporter.
    assert book.apply(end) == {"h01"}
    assert book.tasks("h01") == book.tasks("h02") == ()
    rec = book.fold.records["g"]
    assert rec.status == status
    assert book.fold.workload_on("h01") == book.fold.workload_on("h02") == set()
    assert book.reported_by == {}
    # The primary's own report, late, adds nothing.
    assert book.record_for("h01", _report("h01", "g", "exited", exit_code=-15), now=NOW) is None


def _started(wid: str, host: str = "h01") -> m.WorkloadStarted:
    return m.WorkloadStarted(workload_id=wid, allocation="nlp", at=T0 + 2, host=host, gpus=1)


def test_only_parts_still_to_start_carry_their_command_env_hosts_and_user() -> None:
    """The agent reads them only to start a part: a started or stopping one goes bare."""
    book = _book("h01", "h02")
    for wid in ("a", "b", "c"):
        gpus = 2 if wid == "b" else 1
        _submit(book, wid, gpus, command=("python", "train.py"), env={"SEED": "1"})
    _place(book, "a", {"h01": (0,)})
    _place(book, "b", {"h01": (1,), "h02": (0,)})
    _place(book, "c", {"h01": (2,)})
    book.apply(_started("a"))
    book.apply(m.CancelRequested(workload_id="c", allocation="nlp", by="u", at=T0 + 3))
    a, b, c = book.tasks("h01")
    assert (a.started, a.command, a.env, a.hosts, a.user) == (True, (), {}, (), None)
    assert (c.stop, c.command, c.env, c.hosts, c.user) == ("cancel", (), {}, (), None)
    assert (b.command, b.env, b.hosts) == (("python", "train.py"), {"SEED": "1"}, ("h01", "h02"))
    assert b.user == "u"  # the submission's: an agent with --run-as-user runs it as that account
    (b2,) = book.tasks("h02")
    assert b2.user == "u" and not b2.primary  # a gang's other part runs as the same account


def test_a_list_too_large_for_one_message_holds_back_parts_still_to_start() -> None:
    """A host with many runs of large commands: its list stays within the limit (NATS's
    1 MiB in service), holding back only primary parts not started yet, the last first;
    a start makes room, and the host's list is sent again with more of them."""
    book = DispatchBook()
    book.apply(m.HostRegistered(host="big", gpus=34, at=T0))
    book.apply(m.HostRegistered(host="a01", gpus=4, at=T0))
    book.apply(m.LeaderElected(epoch=1, leader="p1", at=T0))
    arg = "x" * 3000
    wids = [f"w{i:02d}" for i in range(32)]
    for i, wid in enumerate(wids):
        gang = wid == "w31"  # its primary is a01 (the first host, sorted)
        _submit(book, wid, 2 if gang else 1, command=("python", arg))
        _place(book, wid, {"big": (i,), "a01": (0,)} if gang else {"big": (i,)})
    limit = 41_500  # twelve of these parts and a half (slack both ways for small fields)
    assert len(codec.encode(book.work("big", 1, T0))) > limit  # as a whole, too large
    data = book.encoded_work("big", 1, T0, limit=limit)
    sent = codec.decode(Kind.HOST_WORK, data, own=True)
    assert isinstance(sent, m.HostWork) and len(data) <= limit
    listed = [t.workload_id for t in sent.tasks]
    assert "w31" in listed  # a gang's other part is never held back
    assert listed[:-1] == wids[: len(listed) - 1]  # the first ones, in order
    assert len(listed) < 32 and book.held_back == {"big"}
    # More arrive before any start is read: the agent may have started every part it was
    # sent, so those stay listed whole; only parts never sent are held back, even those
    # that sort first.
    for gpu, wid in enumerate(("a1", "a2"), start=32):
        _submit(book, wid, command=("python", arg))
        _place(book, wid, {"big": (gpu,)})
    later = codec.decode(Kind.HOST_WORK, book.encoded_work("big", 2, T0, limit=limit), own=True)
    assert isinstance(later, m.HostWork)
    assert [t.workload_id for t in later.tasks] == listed
    # The first listed part starts: its command is no longer sent, and the host is named.
    assert book.apply(_started("w00", host="big")) == {"big"}
    again = codec.decode(Kind.HOST_WORK, book.encoded_work("big", 2, T0, limit=limit), own=True)
    assert isinstance(again, m.HostWork) and len(again.tasks) > len(sent.tasks)
    for wid in wids[:-1]:  # every part starts in turn: all of them end up listed
        book.apply(_started(wid, host="big"))
    done = codec.decode(Kind.HOST_WORK, book.encoded_work("big", 3, T0, limit=limit), own=True)
    assert isinstance(done, m.HostWork) and len(done.tasks) == 34 and book.held_back == set()
