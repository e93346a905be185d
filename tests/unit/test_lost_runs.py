"""Runs lost with their host (``allot.live.host_work.lost_run`` and ``DispatchBook.lost``):
a dead agent's runs are ended in its place once its host is drained for missed heartbeats
and their notices' deadlines are well past, as Slurm requeues the jobs of a DOWN node."""

from __future__ import annotations

import msgspec
import pytest

from allot.live.host_work import LOST_AFTER_S, MISSED_HEARTBEATS, DispatchBook, lost_run
from allot.proto import messages as m

T0 = 1_000_000.0
DEADLINE = T0 + 100.0
M = LOST_AFTER_S


@pytest.mark.parametrize(
    ("silent_since", "deadline", "now", "last_heard", "lost"),
    [
        (T0 + 50, DEADLINE, DEADLINE + M, None, True),
        (T0 + 50, DEADLINE, DEADLINE + M + 3600, T0, True),
        (T0 + 50, DEADLINE, DEADLINE + M - 0.1, None, False),  # the margin is not over
        (T0 + 50, DEADLINE, DEADLINE + 1, None, False),  # just past the deadline
        (T0 + 50, DEADLINE, DEADLINE - 10, None, False),  # still in its grace period
        (None, DEADLINE, DEADLINE + 10 * M, None, False),  # host answers heartbeats
        (T0 + 50, None, DEADLINE + 10 * M, None, False),  # no notice: nothing to wait for
        # Dispatch heard the host lately (a slow agent still syncing): not yet.
        (T0 + 50, DEADLINE, DEADLINE + 2 * M, DEADLINE + M + 1, False),
        (T0 + 50, DEADLINE, DEADLINE + 2 * M, DEADLINE + M, True),  # heard, but long ago
    ],
    ids=[
        "silent-host-deadline-plus-margin",
        "silent-host-long-after-last-word",
        "margin-not-over",
        "just-past-deadline",
        "within-grace",
        "host-not-silent",
        "not-under-notice",
        "heard-within-margin",
        "heard-exactly-margin-ago",
    ],
)
def test_lost_run_table(
    silent_since: float | None,
    deadline: float | None,
    now: float,
    last_heard: float | None,
    lost: bool,
) -> None:
    assert (
        lost_run(silent_since=silent_since, deadline=deadline, now=now, last_heard=last_heard)
        is lost
    )


def _book(*hosts: str) -> DispatchBook:
    book = DispatchBook()
    for host in hosts:
        book.apply(m.HostRegistered(host=host, gpus=4, at=T0))
    book.apply(m.LeaderElected(epoch=1, leader="p1", at=T0))
    return book


def _run(
    book: DispatchBook, wid: str, parts: dict[str, tuple[int, ...]], *, resumable: bool = True
) -> None:
    gpus = sum(len(g) for g in parts.values())
    book.apply(
        m.WorkloadSubmitted(
            workload_id=wid,
            client_id=wid,
            user="u",
            gpus=gpus,
            allocation="nlp",
            min_runtime_s=60,
            at=T0,
            resumable=resumable,
        )
    )
    book.apply(
        m.WorkloadPlaced(
            workload_id=wid,
            allocation="nlp",
            at=T0 + 1,
            gpus=gpus,
            assignment=tuple(m.HostGpus(host=h, gpus=g) for h, g in parts.items()),
            epoch=1,
        )
    )
    book.apply(
        m.WorkloadStarted(
            workload_id=wid, allocation="nlp", at=T0 + 2, host=min(parts), pid=7, gpus=gpus
        )
    )


def _notice(book: DispatchBook, wid: str, gpus: int = 1) -> None:
    book.apply(
        m.PreemptionNotice(
            workload_id=wid,
            allocation="nlp",
            at=T0 + 60,
            reason="host-drain",
            grace_deadline=DEADLINE,
            requeue=True,
            gpus=gpus,
            epoch=1,
        )
    )


def _missed(host: str, at: float = T0 + 50) -> m.HostDraining:
    return m.HostDraining(host=host, at=at, reason=f"{MISSED_HEARTBEATS} for 10.3 s")


LATE = DEADLINE + LOST_AFTER_S + 1


@pytest.mark.parametrize(
    ("resumable", "status", "in_queue"),
    [(True, "pending", True), (False, "preempted", False)],
    ids=["resumable-is-requeued", "not-resumable-ends-preempted"],
)
def test_a_silent_hosts_noticed_run_is_ended_as_its_agents_lost_report_would(
    resumable: bool, status: str, in_queue: bool
) -> None:
    book = _book("h01", "h02")
    _run(book, "w", {"h01": (0, 1)}, resumable=resumable)
    book.apply(_missed("h01"))
    _notice(book, "w", gpus=2)
    assert book.lost(DEADLINE + 1, {}) == []
    [record] = book.lost(LATE, {})
    assert isinstance(record, m.WorkloadPreempted)
    assert (record.reason, record.attempt, record.at) == ("host-drain", 1, DEADLINE)
    assert record.gpu_seconds == pytest.approx(2 * (DEADLINE - (T0 + 2)))  # to the deadline
    book.apply(record)
    rec = book.fold.records["w"]
    assert (rec.status, "w" in book.fold.queue) == (status, in_queue)
    assert book.fold.workload_on("h01") == set()  # its GPUs are free in the log
    assert book.lost(LATE + 100, {}) == []  # once only
    # The agent was only slow: its report now records nothing (the attempt has ended).
    late = m.PartReport(
        host="h01", workload_id="w", attempt=1, event="exited", exit_code=-9, at=LATE + 5
    )
    assert book.record_for("h01", late) is None
    # And had it landed in the log anyway, the fold ignores a second end of the attempt.
    second = m.WorkloadFailed(
        workload_id="w", allocation="nlp", at=LATE + 5, reason="x", attempt=1, gpus=2
    )
    assert not book.fold.apply(second).changed


def _ids(records: list[msgspec.Struct]) -> list[str]:
    return [getattr(r, "workload_id", "") for r in records]


def test_only_runs_of_hosts_silent_since_their_last_healthy_are_lost() -> None:
    book = _book("h01", "h02", "h03")
    _run(book, "dead", {"h01": (0,)})
    _run(book, "alive", {"h02": (0,)})
    _run(book, "back", {"h03": (0,)})
    book.apply(_missed("h01"))
    # An operator's drain (or any other reason) on top changes nothing: still silent.
    book.apply(m.HostDraining(host="h01", at=T0 + 55, reason="rma", by="ops"))
    book.apply(m.HostDraining(host="h02", at=T0 + 50, reason="bad fan", by="ops"))
    book.apply(_missed("h03"))
    book.apply(m.HostHealthy(host="h03", at=T0 + 58))  # its heartbeats came back
    for wid in ("dead", "alive", "back"):
        _notice(book, wid)
    assert _ids(book.lost(LATE, {})) == ["dead"]
    # Dispatch heard from h01 lately (a sync): not lost yet.
    assert book.lost(LATE, {"h01": LATE - 1}) == []


def test_a_gang_is_lost_only_with_its_primary_the_host_that_reports() -> None:
    book = _book("h01", "h02")
    _run(book, "g", {"h02": (0,), "h01": (0,)})  # primary h01
    book.apply(_missed("h02"))
    _notice(book, "g", gpus=2)
    assert book.lost(LATE, {}) == []  # h01's live agent ends it and reports
    book.apply(_missed("h01"))
    assert _ids(book.lost(LATE, {})) == ["g"]


def test_a_cancelled_run_lost_with_its_host_ends_cancelled() -> None:
    book = _book("h01")
    _run(book, "w", {"h01": (0,)})
    book.apply(m.CancelRequested(workload_id="w", allocation="nlp", by="bob", at=T0 + 40))
    book.apply(_missed("h01"))
    _notice(book, "w")
    [record] = book.lost(LATE, {})
    assert isinstance(record, m.WorkloadCancelled) and record.by == "bob"
