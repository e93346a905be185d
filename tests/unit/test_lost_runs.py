"""Runs lost with their host (``allot.eventlog.host_work.lost_run`` and ``DispatchBook.lost``):
a dead agent's runs are ended in its place once its host has been drained for missed
heartbeats for the margin, noticed or not (a silent host's runs are not protected), as
Slurm requeues the jobs of a DOWN node."""

from __future__ import annotations

import msgspec
import pytest

from allot.eventlog.host_work import (
    AGENT_STOPPING,
    LOST_AFTER_S,
    MISSED_HEARTBEATS,
    DispatchBook,
    lost_run,
)
from allot.proto import messages as m

T0 = 1_000_000.0
SILENT = T0 + 50
DEADLINE = T0 + 100.0
M = LOST_AFTER_S


@pytest.mark.parametrize(
    ("silent_since", "now", "last_heard", "lost"),
    [
        (SILENT, SILENT + M, None, True),
        (SILENT, SILENT + M + 3600, T0, True),
        (SILENT, SILENT + M - 0.1, None, False),  # the margin is not over
        (SILENT, SILENT + 1, None, False),  # just drained
        (None, SILENT + 10 * M, None, False),  # host answers heartbeats
        # Dispatch heard the host lately (a slow agent still syncing): not yet.
        (SILENT, SILENT + 2 * M, SILENT + M + 1, False),
        (SILENT, SILENT + 2 * M, SILENT + M, True),  # heard, but long ago
    ],
    ids=[
        "silent-host-margin-over",
        "silent-host-long-after-last-word",
        "margin-not-over",
        "just-drained",
        "host-not-silent",
        "heard-within-margin",
        "heard-exactly-margin-ago",
    ],
)
def test_lost_run_table(
    silent_since: float | None, now: float, last_heard: float | None, lost: bool
) -> None:
    assert lost_run(silent_since=silent_since, now=now, last_heard=last_heard) is lost


def _book(*hosts: str) -> DispatchBook:
    book = DispatchBook()
    for host in hosts:
        book.apply(m.HostRegistered(host=host, gpus=4, at=T0))
    book.apply(m.LeaderElected(epoch=1, leader="p1", at=T0))
    return book


def _run(
    book: DispatchBook,
    wid: str,
    parts: dict[str, tuple[int, ...]],
    *,
    resumable: bool = True,
    min_runtime_s: int = 60,
) -> None:
    gpus = sum(len(g) for g in parts.values())
    book.apply(
        m.WorkloadSubmitted(
            workload_id=wid,
            client_id=wid,
            user="u",
            gpus=gpus,
            allocation="nlp",
            min_runtime_s=min_runtime_s,
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
SOON = SILENT + LOST_AFTER_S + 1
"""The margin after the drain is over, the notice's grace deadline is not."""


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
    assert book.lost(SILENT + LOST_AFTER_S - 1, {}) == []
    [record] = book.lost(LATE, {})
    assert isinstance(record, m.WorkloadPreempted)
    assert (record.reason, record.attempt, record.at) == ("host-drain", 1, SILENT)
    assert record.gpu_seconds == pytest.approx(2 * (SILENT - (T0 + 2)))  # to the drain
    book.apply(record)
    rec = book.fold.records["w"]
    assert (rec.status, "w" in book.fold.queue) == (status, in_queue)
    assert book.fold.workload_on("h01") == set()  # its GPUs are free in the log
    assert book.lost(LATE + 100, {}) == []  # once only
    # The agent was only slow: its report now records nothing (the attempt has ended).
    late = m.PartReport(
        host="h01", workload_id="w", attempt=1, event="exited", exit_code=-9, at=LATE + 5
    )
    assert book.record_for("h01", late, now=LATE + 5) is None
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


@pytest.mark.parametrize(
    ("notice", "now", "at"),
    [
        (None, SOON, SILENT),  # never noticed (its protection has hours to run)
        (None, SILENT + LOST_AFTER_S - 0.1, None),  # the margin is not over
        (DEADLINE, SOON, SILENT),  # noticed on the drain: its deadline not reached yet
        (SILENT - 20, SOON, SILENT - 20),  # noticed before the drain: to its deadline
    ],
    ids=["running-unprotected", "running-margin-not-over", "noticed-in-grace", "noticed-early"],
)
def test_a_silent_hosts_run_is_lost_after_the_margin_noticed_or_not(
    notice: float | None, now: float, at: float | None
) -> None:
    book = _book("h01", "h02")
    _run(book, "w", {"h01": (0, 1)}, min_runtime_s=8 * 3600)
    if notice is not None:
        book.apply(
            m.PreemptionNotice(
                workload_id="w",
                allocation="nlp",
                at=T0 + 10,
                reason="better-ranked",
                grace_deadline=notice,
                requeue=True,
                gpus=2,
                epoch=1,
            )
        )
    book.apply(_missed("h01"))
    records = book.lost(now, {})
    if at is None:
        assert records == []
        return
    [record] = records
    assert isinstance(record, m.WorkloadPreempted)
    reason = "host-drain" if notice is None else "better-ranked"
    assert (record.reason, record.attempt, record.at) == (reason, 1, at)
    # The fold of placement (and of every reader) takes the end of a running run: the
    # GPUs are free and the resumable run is pending again.
    assert book.fold.apply(record).requeued
    assert book.fold.records["w"].status == "pending"
    assert "w" in book.fold.queue
    assert book.fold.workload_on("h01") == set()


def test_a_run_a_stopped_agent_left_unreported_is_lost_after_the_margin() -> None:
    """A stopping agent drains its host (``agent stopping``) and reports what it stopped;
    a report it could not deliver leaves a run that nobody will end but dispatch."""
    book = _book("h01")
    _run(book, "w", {"h01": (0,)})
    book.apply(m.HostDraining(host="h01", at=SILENT, reason=AGENT_STOPPING))
    assert book.lost(SILENT + LOST_AFTER_S - 1, {}) == []
    assert book.lost(SOON, {"h01": SILENT + 5}) == []  # its last report came later
    [record] = book.lost(SOON, {})
    assert isinstance(record, m.WorkloadPreempted) and record.reason == "host-drain"
    book.apply(m.HostHealthy(host="h01", at=SILENT + 2))  # the agent came back
    assert book.lost(SOON + 100, {}) == []
