"""`allot status` of finished work and `allot hosts` of drained hosts, from the placement
leader's fold: an ended workload shows its last attempt's start and hosts and how it ended
(like sacct), a drained host the drain that put it there (like sinfo -R); the dashboard's
workload JSON holds real JSON objects."""

from __future__ import annotations

import json

import msgspec
import pytest

from allot.core.budgets import parse_tree
from allot.eventlog.budget_wire import spec_from_tree
from allot.eventlog.logfold import LogFold
from allot.eventlog.timeline import TimelineEvent
from allot.proto import messages as m
from allot.render.live_format import status_text
from allot.services.dashboard.workload import workload_page
from allot.services.placement.answers import host_rows, workload_status

T = 1000.0


def fold() -> LogFold:
    f = LogFold()
    tree = parse_tree({"name": "root", "children": [{"name": "nlp", "shares": 1}]})
    for record in (
        m.BudgetTreeSet(at=T, by="t", tree=spec_from_tree(tree)),
        m.HostRegistered(host="h1", gpus=8, at=T),
        m.HostRegistered(host="h2", gpus=8, at=T),
        m.LeaderElected(epoch=1, leader="p1", at=T),
    ):
        assert f.apply(record).changed
    return f


def run(
    f: LogFold,
    wid: str,
    gpus: tuple[int, ...],
    attempt: int = 1,
    host: str = "h1",
    *,
    min_runtime_s: int = 0,
) -> None:
    if attempt == 1:
        f.apply(
            m.WorkloadSubmitted(
                workload_id=wid,
                client_id=wid,
                user="ann",
                gpus=len(gpus),
                allocation="nlp",
                min_runtime_s=min_runtime_s,
                at=T,
            )
        )
    placed = m.WorkloadPlaced(
        workload_id=wid,
        allocation="nlp",
        at=T + 10 * attempt,
        gpus=len(gpus),
        assignment=(m.HostGpus(host=host, gpus=gpus),),
        attempt=attempt,
        epoch=1,
    )
    assert f.apply(placed).changed


END = T + 100


@pytest.mark.parametrize(
    ("end", "state", "exit_code", "reason", "by"),
    [
        (m.WorkloadCompleted(workload_id="w", at=END), "completed", 0, "", None),
        (
            m.WorkloadFailed(workload_id="w", at=END, exit_code=137, reason="killed"),
            "failed",
            137,
            "killed",
            None,
        ),
        (
            m.WorkloadCancelled(workload_id="w", at=END, by="ann", reason="not needed"),
            "cancelled",
            None,
            "not needed",
            "ann",
        ),
    ],
    ids=["completed-exit-0", "failed-with-its-code", "cancelled-by-its-owner"],
)
def test_an_ended_workload_shows_its_run_and_its_end(
    end: msgspec.Struct, state: str, exit_code: int | None, reason: str, by: str | None
) -> None:
    f = fold()
    run(f, "w", (0, 1, 2, 3))
    if isinstance(end, m.WorkloadCancelled):
        f.apply(m.CancelRequested(workload_id="w", allocation="nlp", by="ann", at=END - 1))
    assert f.apply(end).changed
    status = workload_status(f, f.records["w"], None)
    assert status.state == state
    assert status.started_at == T + 10
    assert status.assignment == (m.HostGpus(host="h1", gpus=(0, 1, 2, 3)),)
    assert (status.ended_at, status.exit_code, status.reason, status.cancelled_by) == (
        END,
        exit_code,
        reason,
        by,
    )
    assert status.protected_until is None and status.preempt_at is None
    # It round-trips through the wire contract (what `allot status --json` prints).
    assert msgspec.json.decode(msgspec.json.encode(status), type=m.WorkloadStatus) == status


def test_preempted_and_not_resumable_shows_the_preemption_code() -> None:
    f = fold()
    f.apply(
        m.WorkloadSubmitted(
            workload_id="w", client_id="w", user="ann", gpus=2, resumable=False, at=T
        )
    )
    f.apply(
        m.WorkloadPlaced(
            workload_id="w",
            at=T + 1,
            gpus=2,
            assignment=(m.HostGpus(host="h2", gpus=(6, 7)),),
            epoch=1,
        )
    )
    f.apply(m.WorkloadPreempted(workload_id="w", at=T + 9, reason="displaced-unallocated"))
    status = workload_status(f, f.records["w"], None)
    assert (status.state, status.reason, status.ended_at) == (
        "preempted",
        "displaced-unallocated",
        T + 9,
    )
    assert status.assignment == (m.HostGpus(host="h2", gpus=(6, 7)),)


def test_requeued_work_shows_no_old_run_and_finished_work_its_last_attempt() -> None:
    f = fold()
    run(f, "w", (0, 1))
    f.apply(m.WorkloadPreempted(workload_id="w", at=T + 15, reason="better-ranked"))
    waiting = workload_status(f, f.records["w"], 1)
    assert (waiting.state, waiting.started_at, waiting.assignment, waiting.ended_at) == (
        "pending",
        None,
        (),
        None,
    )
    run(f, "w", (4, 5), attempt=2, host="h2")
    running = workload_status(f, f.records["w"], None)
    assert running.state == "running" and running.ended_at is None and running.exit_code is None
    f.apply(m.WorkloadCompleted(workload_id="w", at=END, attempt=2))
    done = workload_status(f, f.records["w"], None)
    assert (done.attempt, done.started_at, done.exit_code) == (2, T + 20, 0)
    assert done.assignment == (m.HostGpus(host="h2", gpus=(4, 5)),)


def test_placed_is_not_running_until_its_host_reports_the_start() -> None:
    """Slurm's start is the allocation; the process starts later, when the agent says so.
    A start report of another attempt, or a second one, changes nothing; a new attempt
    starts unreported again; a start read only after its attempt's end is shown."""
    f = fold()
    run(f, "w", (0, 1))
    assert workload_status(f, f.records["w"], None).run_started_at is None
    stale = m.WorkloadStarted(workload_id="w", allocation="nlp", at=T + 11, host="h1", attempt=2)
    f.apply(stale)
    assert workload_status(f, f.records["w"], None).run_started_at is None
    f.apply(m.WorkloadStarted(workload_id="w", allocation="nlp", at=T + 12, host="h1"))
    running = workload_status(f, f.records["w"], None)
    assert (running.state, running.started_at, running.run_started_at) == (
        "running",
        T + 10,
        T + 12,
    )
    f.apply(m.WorkloadPreempted(workload_id="w", at=T + 15, reason="better-ranked"))
    assert workload_status(f, f.records["w"], 1).run_started_at is None  # pending again
    run(f, "w", (4, 5), attempt=2, host="h2")
    assert workload_status(f, f.records["w"], None).run_started_at is None
    f.apply(m.WorkloadStarted(workload_id="w", allocation="nlp", at=T + 22, host="h2", attempt=2))
    f.apply(m.WorkloadCompleted(workload_id="w", at=END, attempt=2))
    f.apply(m.WorkloadStarted(workload_id="w", allocation="nlp", at=END + 1, host="h2", attempt=2))
    done = workload_status(f, f.records["w"], None)
    assert (done.state, done.run_started_at) == ("completed", T + 22)  # like sacct, kept
    run(f, "late", (0, 1))
    f.apply(m.WorkloadCompleted(workload_id="late", at=END))
    f.apply(m.WorkloadStarted(workload_id="late", allocation="nlp", at=T + 12, host="h1"))
    late = workload_status(f, f.records["late"], None)
    assert (late.state, late.run_started_at) == ("completed", T + 12)


def test_a_requeued_workload_says_when_and_why_its_last_attempt_ended() -> None:
    """Pending again after a preemption: like Slurm's restart count and requeue reason, its
    status says attempt 1 ended at T + 15, preempted for a better-ranked request; once
    placed again, or never run, nothing of the kind is shown."""
    f = fold()
    run(f, "w", (0, 1))
    f.apply(m.WorkloadSubmitted(workload_id="new", client_id="new", user="ann", gpus=1, at=T))
    f.apply(m.WorkloadPreempted(workload_id="w", at=T + 15, reason="better-ranked"))
    pending = workload_status(f, f.records["w"], 1)
    assert (pending.state, pending.attempt) == ("pending", 1)
    assert (pending.requeued_at, pending.requeue_reason) == (T + 15, "better-ranked")
    assert pending.ended_at is None and pending.reason == ""  # it has not ended
    text = status_text(pending)
    assert "requeued:" in text and "after attempt 1 (better-ranked)" in text
    page = workload_page(T + 20, "w", pending, []).html
    assert '<th class="l">requeued</th>' in page and "attempt 1 (better-ranked)" in page
    never = workload_status(f, f.records["new"], 2)
    assert (never.requeued_at, never.requeue_reason) == (None, "")
    run(f, "w", (4, 5), attempt=2, host="h2")
    again = workload_status(f, f.records["w"], None)
    assert (again.state, again.requeued_at, again.requeue_reason) == ("running", None, "")


def test_a_drained_host_shows_its_drain_and_a_healthy_one_none() -> None:
    f = fold()
    f.apply(m.HostDraining(host="h1", at=T + 5, reason="bad fan", by="ops"))
    f.apply(m.HostDrained(host="h1", at=T + 6, epoch=1))
    rows = {r.host: r for r in host_rows(f)}
    assert (rows["h1"].state, rows["h1"].drain_reason, rows["h1"].drain_by) == (
        "drained",
        "bad fan",
        "ops",
    )
    assert rows["h1"].drain_at == T + 5
    assert (rows["h2"].drain_reason, rows["h2"].drain_by, rows["h2"].drain_at) == ("", None, None)
    f.apply(m.HostHealthy(host="h1", at=T + 7))
    back = {r.host: r for r in host_rows(f)}["h1"]
    assert (back.state, back.drain_reason, back.drain_at) == ("healthy", "", None)


def test_a_host_row_carries_no_heartbeat_time() -> None:
    """Heartbeats reach the health service only, never the log: placement cannot know one,
    so the field that was always null is gone from the contract."""
    assert "last_heartbeat" not in m.HostRow.__struct_fields__
    row = m.HostRow(host="h1", state="healthy", gpus=8, free_gpus=8)
    assert "last_heartbeat" not in msgspec.to_builtins(row)


def test_the_workload_api_gives_an_assignment_as_json_objects() -> None:
    event = TimelineEvent(
        at=T,
        kind="placed",
        attempt=1,
        detail={"assignment": [{"host": "real1", "gpus": [0, 1, 2, 3]}], "gpus": 4},
    )
    view = workload_page(T, "w", None, [event])
    doc = json.loads(json.dumps(view.data))
    assert doc["events"][0]["detail"]["assignment"] == [{"host": "real1", "gpus": [0, 1, 2, 3]}]


def test_status_shows_the_command_and_the_env_names_not_their_values() -> None:
    """As ``scontrol show job``'s ``Command``; an env value may be a token, so only the
    names are shown."""
    f = fold()
    f.apply(
        m.WorkloadSubmitted(
            workload_id="w",
            client_id="w",
            user="ann",
            gpus=1,
            allocation="nlp",
            command=("python", "train.py", "--run name"),
            env={"WANDB_API_KEY": "secret-token", "HF_HOME": "/data/hf"},
            at=T,
        )
    )
    status = workload_status(f, f.records["w"], 1)
    assert status.command == ("python", "train.py", "--run name")
    assert status.env_names == ("HF_HOME", "WANDB_API_KEY")
    text = status_text(status)
    assert "command:         python train.py '--run name'" in text
    assert "env:             HF_HOME WANDB_API_KEY" in text
    assert "secret-token" not in text and "secret-token" not in msgspec.json.encode(status).decode()


@pytest.mark.parametrize(("min_runtime_s", "until"), [(0, None), (3600, T + 10 + 3600)])
def test_a_running_workloads_protection_end_is_shown_only_when_it_is_protected(
    min_runtime_s: int, until: float | None
) -> None:
    """Unallocated work is never protected: `allot status` showed its start as a
    'protected until' (a new user's walkthrough)."""
    f = fold()
    run(f, "w", (0,), min_runtime_s=min_runtime_s)
    status = workload_status(f, f.records["w"], None)
    assert status.protected_until == until
    assert ("protected until" in status_text(status)) is (until is not None)
