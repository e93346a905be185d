"""``jobs.csv``: one row per job with its wait, JCT and preemptions (``allot.sim.jobs_csv``)."""

from __future__ import annotations

import csv
import io

from allot.sim.jobs_csv import COLUMNS, jobs_csv
from allot.sim.record import JobOutcome, Preemption, Segment, SimRecord, Waiting


def test_each_job_is_a_row_with_its_wait_jct_and_notices() -> None:
    record = SimRecord(
        policy="fairshare",
        seed=0,
        first_submit=0.0,
        last_submit=10.0,
        end_time=500.0,
        segments=[Segment("a", "nlp", True, 2, 5.0, 100.0)],
        waits=[Waiting("b", None, False, 1, 10.0, 500.0)],
        preemptions=[Preemption(50.0, "a", "nlp", 2, "reclaimed-for-entitlement", True)] * 2,
        jobs=[
            JobOutcome("a", "nlp", "training", 2, 0.0, 5.0, 300.5, "completed"),
            JobOutcome("b", None, "filler", 1, 10.0, None, None, "pending"),
        ],
    )
    rows = list(csv.reader(io.StringIO(jobs_csv(record))))
    assert tuple(rows[0]) == COLUMNS
    assert rows[1] == [
        "a",
        "nlp",
        "true",
        "training",
        "2",
        "0",
        "5",
        "300.5",
        "5",
        "300.5",
        "2",
        "completed",
        "",
    ]
    assert rows[2] == ["b", "", "false", "filler", "1", "10", "", "", "", "", "0", "pending", ""]
    assert jobs_csv(record) == jobs_csv(record)  # the same bytes
