"""``jobs.csv``: one row per job of a simulation, for a user's own figures (JCT, slowdown,
plots) without the Python API.

Columns: ``workload_id``, ``allocation`` (empty: none named), ``allocated`` (the contract's
meaning: charged and protected), ``kind``, ``gpus``, ``submit_s``, ``first_start_s`` and
``end_s`` (the trace's clock; empty: never started / not ended by the run's end),
``wait_s = first_start - submit``, ``jct_s = end - submit``, ``preemptions`` (notices the
job received), ``state`` (``completed``, ``preempted``, ``pending`` or ``running`` at the
end), ``lost_gpu_s`` (GPU-seconds its attempts lost to preemption, restores included,
rounded to 6 decimals: ``allot.sim.checkpoints``; empty when the record does not model
checkpointing). Rows in the record's job order; the same record gives the same bytes."""

from __future__ import annotations

import csv
import io
from collections import Counter
from pathlib import Path

from allot.sim.output_files import csv_number
from allot.sim.record import SimRecord, allocated_workloads

COLUMNS = (
    "workload_id",
    "allocation",
    "allocated",
    "kind",
    "gpus",
    "submit_s",
    "first_start_s",
    "end_s",
    "wait_s",
    "jct_s",
    "preemptions",
    "state",
    "lost_gpu_s",
)


def jobs_csv(record: SimRecord) -> str:
    """The CSV text (see the module docstring)."""
    notices = Counter(p.workload_id for p in record.preemptions)
    allocated = allocated_workloads(record)
    lost: dict[str, float] = {}
    for cost in record.attempt_costs:
        lost[cost.workload_id] = lost.get(cost.workload_id, 0.0) + cost.gpus * cost.lost_s
    modelled = record.checkpointing is not None
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for job in record.jobs:
        start, end = job.first_start, job.end_time
        writer.writerow(
            (
                job.workload_id,
                job.allocation or "",
                "true" if job.workload_id in allocated else "false",
                job.kind,
                job.gpus,
                _cell(job.submit_time),
                _cell(start),
                _cell(end),
                _cell(None if start is None else start - job.submit_time),
                _cell(None if end is None else end - job.submit_time),
                notices[job.workload_id],
                job.state,
                _cell(round(lost.get(job.workload_id, 0.0), 6) + 0.0) if modelled else "",
            )
        )
    return out.getvalue()


def _cell(value: float | None) -> str:
    return "" if value is None else csv_number(value)


def write_jobs_csv(record: SimRecord, out_dir: Path) -> None:
    """Write ``out_dir/jobs.csv``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "jobs.csv").write_text(jobs_csv(record), encoding="utf-8", newline="")
