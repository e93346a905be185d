"""The log's history of a window as the simulator's inputs (``allot.eventlog.window_history``):
each kind of life a workload can have around the window becomes the trace row it should,
hosts become the cluster file's hosts and health events, and what export writes reads
back as the same inputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

from allot.config.yaml_io import load_yaml
from allot.core.errors import ValidationError
from allot.eventlog.window_history import RAN_NOTHING, ExportedHistory, WindowHistory
from allot.proto import messages as m
from allot.sim.cluster import HealthEvent, load_cluster
from allot.sim.scenario import dump_cluster_yaml, dump_trace_csv
from allot.sim.trace import read_trace

T0 = 1_800_000_000.0
SINCE = T0 + 1000
UNTIL = T0 + 2000  # a window of 1000 s


# -- builders ------------------------------------------------------------------------------------


def tree() -> m.BudgetTreeSet:
    spec = m.BudgetNodeSpec(
        name="root",
        children=(m.BudgetNodeSpec(name="nlp", shares=1), m.BudgetNodeSpec(name="cv", shares=1)),
    )
    return m.BudgetTreeSet(at=T0, by="bootstrap", tree=spec)


def start() -> list[msgspec.Struct]:
    """What every log here starts with: a host, a tree, a leader."""
    return [
        m.HostRegistered(host="h1", gpus=8, at=T0),
        tree(),
        m.LeaderElected(epoch=1, leader="p1", at=T0),
    ]


def sub(
    t: float,
    *,
    alloc: str | None = "nlp",
    runtime: int = 600,
    duration: float | None = None,
    wid: str = "w",
) -> m.WorkloadSubmitted:
    return m.WorkloadSubmitted(
        workload_id=wid,
        client_id=wid,
        user="ann",
        gpus=2,
        allocation=alloc,
        min_runtime_s=runtime if alloc else 0,
        duration_s=duration,
        at=T0 + t,
    )


def place(t: float, attempt: int = 1, wid: str = "w") -> m.WorkloadPlaced:
    return m.WorkloadPlaced(
        workload_id=wid,
        at=T0 + t,
        gpus=2,
        assignment=(m.HostGpus(host="h1", gpus=(0, 1)),),
        attempt=attempt,
        epoch=1,
    )


def done(t: float, attempt: int = 1, wid: str = "w") -> m.WorkloadCompleted:
    return m.WorkloadCompleted(workload_id=wid, at=T0 + t, attempt=attempt)


def preempt(t: float, attempt: int = 1, wid: str = "w") -> list[msgspec.Struct]:
    """A notice, and the run's end 50 s later (resumable: requeued then)."""
    return [
        m.PreemptionNotice(
            workload_id=wid,
            at=T0 + t,
            reason="reclaimed-for-entitlement",
            grace_deadline=T0 + t + 50,
            requeue=True,
            gpus=2,
            attempt=attempt,
            epoch=1,
        ),
        m.WorkloadPreempted(
            workload_id=wid, at=T0 + t + 50, reason="reclaimed-for-entitlement", attempt=attempt
        ),
    ]


def history(records: Sequence[msgspec.Struct]) -> ExportedHistory:
    window = WindowHistory(SINCE, UNTIL)
    for record in [*start(), *records]:
        window.apply(record)
    return window.result()


# -- workloads -----------------------------------------------------------------------------------

LIVES = [
    # (records, expected row (submit_time_s, duration_s, min_runtime_s) or None, pending at
    # start, running at start)
    pytest.param(
        [sub(100), place(1200), done(1500)],
        (0.0, 300.0, 600),
        1,
        0,
        id="pending at the start arrives at 0 and needs what it then ran",
    ),
    pytest.param(
        [sub(100), place(800), done(1300)],
        (0.0, 300.0, 400),
        0,
        1,
        id="running at the start keeps the protection it had left (placed 800 + 600 - 1000)",
    ),
    pytest.param(
        [sub(100), place(200), done(1100)],
        (0.0, 100.0, 1),
        0,
        1,
        id="running at the start past its protection stays allocated with 1 s of it",
    ),
    pytest.param(
        [sub(1100), place(1200), *preempt(1300), place(1500, attempt=2), done(1700, 2)],
        (100.0, 350.0, 600),
        0,
        0,
        id="preempted and requeued inside resumes: it needs both runs (150 s + 200 s)",
    ),
    pytest.param(
        [sub(100), place(200), *preempt(400), place(1200, attempt=2), done(1400, 2)],
        (0.0, 200.0, 600),
        1,
        0,
        id="preempted before the window and pending at its start needs only its later run",
    ),
    pytest.param(
        [sub(1100), place(1100), done(1900)],
        (100.0, 800.0, 600),
        0,
        0,
        id="submitted and completed inside the window",
    ),
    pytest.param(
        [sub(1100, alloc=None), place(1150), done(1300)],
        (100.0, 150.0, 0),
        0,
        0,
        id="unallocated work stays unallocated",
    ),
    pytest.param(
        [sub(100), place(100), done(900)],
        None,
        0,
        0,
        id="over before the window: not in it",
    ),
    pytest.param(
        [sub(2100)],
        None,
        0,
        0,
        id="submitted after the window's end: not in it",
    ),
    pytest.param(
        [sub(1500), place(1600)],
        (500.0, 1400.0, 600),
        0,
        0,
        id="unknown demand still running at the end: what it ran (400 s) plus the window",
    ),
    pytest.param(
        [sub(1500, duration=50.0)],
        (500.0, 50.0, 600),
        0,
        0,
        id="a declared duration still pending at the end: the declared demand",
    ),
    pytest.param(
        [sub(100, duration=2000.0), place(500)],
        (0.0, 1500.0, 100),
        0,
        1,
        id="a declared duration running at the start: the rest of it (2000 - 500 s run before)",
    ),
    pytest.param(
        [sub(100), place(300), done(1200, attempt=2)],
        (0.0, 1000.0 + 1000.0, 1),
        0,
        1,
        id="an end of an attempt that never was is ignored by the fold: still running",
    ),
]


@pytest.mark.parametrize(("records", "row", "pending", "running"), LIVES)
def test_each_life_becomes_its_trace_row(
    records: list[msgspec.Struct],
    row: tuple[float, float, int] | None,
    pending: int,
    running: int,
) -> None:
    got = history(records)
    if row is None:
        assert got.jobs == ()
    else:
        (job,) = got.jobs
        w = job.workload
        assert (w.submit_time, job.duration_s, w.min_runtime_s) == row
        assert (w.id, w.gpus, w.user, w.kind, w.priority) == ("w", 2, "ann", "training", 0)
    assert (got.pending_at_start, got.running_at_start) == (pending, running)


def test_work_cancelled_while_pending_is_left_out_and_counted() -> None:
    cancel = m.CancelRequested(workload_id="w", allocation="nlp", by="ann", at=T0 + 1200)
    got = history([sub(900), cancel])
    assert got.jobs == ()
    assert got.left_out == {RAN_NOTHING: 1}


def test_work_alive_at_the_start_arrives_first_in_submission_order() -> None:
    got = history(
        [
            sub(1500, wid="late"),
            sub(300, wid="b-second"),
            sub(200, wid="c-first"),
            sub(1200, wid="a-inside"),
        ]
    )
    assert [j.workload.id for j in got.jobs] == ["c-first", "b-second", "a-inside", "late"]
    assert [j.workload.submit_time for j in got.jobs] == [0.0, 0.0, 200.0, 500.0]


def test_records_after_the_window_are_left_out() -> None:
    window = WindowHistory(SINCE, UNTIL)
    for record in [*start(), sub(1500), place(1600), done(2500)]:
        window.apply(record)
    assert window.after_until == 1
    (job,) = window.result().jobs
    assert job.duration_s == 400 + 1000  # not ended by the window's end: unknown demand


def test_the_tree_is_the_last_one_in_the_window() -> None:
    later = m.BudgetTreeSet(
        at=T0 + 1500,
        by="alice",
        tree=m.BudgetNodeSpec(name="root", children=(m.BudgetNodeSpec(name="nlp", shares=5),)),
    )
    got = history([later])
    assert got.tree is not None
    assert got.tree.leaves() == ("nlp",)


def test_a_window_reaching_before_the_log_is_refused() -> None:
    window = WindowHistory(T0 - 10, UNTIL)
    for record in start():
        window.apply(record)
    with pytest.raises(ValidationError) as err:
        window.result()
    assert err.value.field == "since"
    assert "10 s before the log's first record" in err.value.reason
    # and says what fits (`allot whatif --since 1d` on a stack a few minutes old)
    assert f"(a window of {int(UNTIL - T0)}s or less fits)" in err.value.reason


def test_a_window_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(ValidationError) as err:
        WindowHistory(UNTIL, SINCE)
    assert err.value.field == "since"


# -- hosts ---------------------------------------------------------------------------------------


def test_allocated_runs_before_the_window_are_its_prior_usage() -> None:
    """Usage before ``since`` is charged on the trace's clock (hours before 0), so a replay
    ranks from the usage the live ranking had: a run that ended before the window counts
    whole, one running at ``since`` up to it, unallocated work not at all."""
    records = [
        sub(0, wid="a"),
        place(100, wid="a"),
        done(400, wid="a"),  # 2 GPUs x 300 s, all before since (T0 + 1000)
        sub(0, alloc=None, wid="c"),
        place(450, wid="c"),  # the same GPUs, one run after another
        done(700, wid="c"),
        sub(0, wid="b"),
        place(800, wid="b"),  # 2 GPUs x 200 s up to since, then inside the window
    ]
    prior = history(records).prior_usage
    assert set(prior) == {"nlp"}
    assert sum(prior["nlp"].values()) == pytest.approx(2 * 300 + 2 * 200)
    assert all(hour < 0 for hour in prior["nlp"])  # all before the trace's 0


def test_prior_usage_reads_back_from_export_json(tmp_path: Path) -> None:
    from allot.cli.history_cmds import EXPORT, _prior_usage, export_meta

    exported = history([sub(0), place(100), done(400)])
    meta = export_meta(exported)
    (tmp_path / EXPORT).write_text(msgspec.json.encode(meta).decode(), encoding="utf-8")
    assert _prior_usage(meta, tmp_path / EXPORT) == exported.prior_usage
    with pytest.raises(ValidationError, match="prior_usage") as bad:
        _prior_usage({"prior_usage": {"nlp": {"-1": -5.0}}}, tmp_path / EXPORT)
    assert bad.value.field == "--from"


def test_hosts_keep_their_names_and_their_states_become_health_events() -> None:
    got = history(
        [
            m.HostRegistered(host="h2", gpus=4, at=T0),
            m.HostDraining(host="h2", reason="ecc", at=T0 + 500),  # down at the start
            m.HostRegistered(host="h3", gpus=8, at=T0),
            m.HostDraining(host="h3", reason="ecc", by="ops", at=T0 + 1200),
            m.HostDrained(host="h3", at=T0 + 1300),
            m.HostHealthy(host="h3", at=T0 + 1600),
            m.HostRegistered(host="h4", gpus=8, at=T0 + 1500),  # joins inside the window
            m.HostRegistered(host="h5", gpus=8, at=T0 + 2500),  # after the window
        ]
    )
    spec = load_cluster(got.cluster)
    assert [(h.id, h.gpus) for h in spec.hosts] == [("h1", 8), ("h2", 4), ("h3", 8), ("h4", 8)]
    assert spec.health_events == (
        HealthEvent("h2", 0.0, "unhealthy"),
        HealthEvent("h4", 0.0, "unhealthy"),
        HealthEvent("h3", 200.0, "unhealthy"),
        HealthEvent("h4", 500.0, "repaired"),
        HealthEvent("h3", 600.0, "repaired"),
    )


# -- what export writes --------------------------------------------------------------------------


def test_the_files_read_back_as_the_same_inputs(tmp_path: Path) -> None:
    got = history(
        [
            sub(100, wid="a"),
            place(800, wid="a"),
            sub(1100, alloc=None, wid="b", duration=75.5),
            m.HostRegistered(host="h2", gpus=4, at=T0 + 1500),
        ]
    )
    (tmp_path / "trace.csv").write_text(dump_trace_csv(got.jobs))
    (tmp_path / "cluster.yaml").write_text(dump_cluster_yaml(got.cluster))
    assert tuple(read_trace(tmp_path / "trace.csv")) == got.jobs
    data = load_yaml(tmp_path / "cluster.yaml")
    assert isinstance(data, dict)
    assert load_cluster(data) == load_cluster(got.cluster)
