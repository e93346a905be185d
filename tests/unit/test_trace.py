"""read_trace: columns, defaults, ordering, errors naming file:line and column, and the
Philly file as it is."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest

from allot.core.errors import ValidationError
from allot.sim.trace import TraceDefaults, TraceJob, read_trace

PHILLY = Path(__file__).resolve().parents[3] / "shared" / "traces" / "philly_pollux.csv"

FULL_HEADER = (
    "job_id,submit_time_s,gpus,duration_s,allocation,user,kind,min_runtime_s,resumable,"
    "legacy_class,legacy_protected"
)


def write_csv(tmp_path: Path, header: str, *rows: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join((header, *rows)) + "\n", encoding="utf-8")
    return path


def only(jobs: list[TraceJob]) -> TraceJob:
    assert len(jobs) == 1
    return jobs[0]


def test_a_full_row_becomes_a_workload_and_its_duration(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path, FULL_HEADER, "j1,10,8,3600.5,nlp,ann,interactive,5400,false,HIGH,true"
    )
    job = only(read_trace(path, TraceDefaults()))
    w = job.workload
    assert (w.id, w.submit_time, w.gpus, w.allocation, w.user, w.kind) == (
        "j1",
        10.0,
        8,
        "nlp",
        "ann",
        "interactive",
    )
    assert (w.min_runtime_s, w.resumable) == (5400, False)
    assert w.priority == 0  # legacy fields stay on the TraceJob; the baseline applies them
    assert job.duration_s == 3600.5
    assert (job.legacy_class, job.legacy_protected) == ("HIGH", True)
    assert w.allocated


@pytest.mark.parametrize(
    ("header", "row", "expected"),
    [
        pytest.param(
            "job_id,submit_time_s,gpus,duration_s",
            "j,0,1,5",
            {"allocation": None, "user": "unknown", "kind": "training", "min_runtime_s": 7200},
            id="only-required-columns-take-every-default",
        ),
        pytest.param(
            "job_id,submit_time_s,gpus,duration_s,team",
            "j,0,1,5,6214e9",
            {"allocation": "6214e9", "user": "6214e9"},
            id="team-is-accepted-for-allocation-and-names-the-user",
        ),
        pytest.param(
            "job_id,submit_time_s,gpus,duration_s,team",
            "j,0,1,5,103959",
            {"allocation": "103959"},
            id="numeric-looking-team-hash-stays-a-string",
        ),
        pytest.param(
            FULL_HEADER,
            "j,0,1,5,,,,,,,",
            {"allocation": None, "user": "unknown", "kind": "training", "resumable": True},
            id="empty-cells-take-defaults",
        ),
        pytest.param(
            FULL_HEADER,
            "j,0,1,5,vision,,filler,0,,,",
            {"allocation": "vision", "user": "vision", "kind": "filler", "allocated": False},
            id="min-runtime-zero-is-unallocated-even-with-an-allocation",
        ),
        pytest.param(
            "job_id,submit_time_s,gpus,duration_s,team,user,status",
            "j,0,1,5,ee9e8c,,Pass",
            {"allocation": "ee9e8c"},
            id="extra-columns-like-status-are-ignored",
        ),
        pytest.param(
            " job_id , submit_time_s ,gpus,duration_s",
            "j,0,1,5",
            {"gpus": 1},
            id="header-whitespace-is-tolerated",
        ),
    ],
)
def test_optional_columns_and_defaults(
    tmp_path: Path, header: str, row: str, expected: dict[str, object]
) -> None:
    w = only(read_trace(write_csv(tmp_path, header, row), TraceDefaults())).workload
    for attr, value in expected.items():
        assert getattr(w, attr) == value, attr


def test_defaults_object_fills_absent_columns(tmp_path: Path) -> None:
    defaults = TraceDefaults(
        min_runtime_s=600, resumable=False, kind="eval", user="bob", allocation="evals"
    )
    w = only(
        read_trace(write_csv(tmp_path, "job_id,submit_time_s,gpus,duration_s", "j,0,2,9"), defaults)
    ).workload
    assert (w.min_runtime_s, w.resumable, w.kind, w.user, w.allocation) == (
        600,
        False,
        "eval",
        "bob",
        "evals",
    )


def test_jobs_are_sorted_by_submit_time_then_file_order(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path,
        "job_id,submit_time_s,gpus,duration_s",
        "late,50,1,1",
        "tie-first,10,1,1",
        "early,5,1,1",
        "tie-second,10,1,1",
    )
    assert [j.workload.id for j in read_trace(path)] == ["early", "tie-first", "tie-second", "late"]


def test_identical_rows_under_different_ids_are_fine(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path, "job_id,submit_time_s,gpus,duration_s,team", "a,1,1,5,x", "b,1,1,5,x"
    )
    assert [j.workload.id for j in read_trace(path)] == ["a", "b"]


def test_blank_lines_are_skipped_and_line_numbers_stay_physical(tmp_path: Path) -> None:
    path = write_csv(tmp_path, "job_id,submit_time_s,gpus,duration_s", "a,1,1,5", "", "b,1,zero,5")
    with pytest.raises(ValidationError) as err:
        read_trace(path)
    assert err.value.field == f"{path}:4: gpus"


REQ = "job_id,submit_time_s,gpus,duration_s"


class BadTrace(NamedTuple):
    header: str
    rows: tuple[str, ...]
    where: str  # "<line>: <column>" expected after the file name
    reason: str  # a phrase the reason must contain


BAD_TRACES = {
    "missing-required-column": BadTrace(
        "job_id,submit_time_s,duration_s", ("a,0,5",), "1: gpus", "missing required column"
    ),
    "gpus-not-an-integer": BadTrace(REQ, ("a,0,1.5,5",), "2: gpus", "not an integer"),
    "gpus-zero": BadTrace(REQ, ("a,0,1,5", "b,0,0,5"), "3: gpus", "> 0"),
    "gpus-negative": BadTrace(REQ, ("a,0,-4,5",), "2: gpus", "> 0"),
    "submit-not-a-number": BadTrace(REQ, ("a,soon,1,5",), "2: submit_time_s", "not a number"),
    "submit-negative": BadTrace(REQ, ("a,-1,1,5",), "2: submit_time_s", ">= 0"),
    "duration-zero": BadTrace(REQ, ("a,0,1,0",), "2: duration_s", "> 0"),
    "duration-infinite": BadTrace(REQ, ("a,0,1,inf",), "2: duration_s", "finite"),
    "min-runtime-above-eight-hours": BadTrace(
        REQ + ",min_runtime_s", ("a,0,1,5,28801",), "2: min_runtime_s", "8 h"
    ),
    "min-runtime-not-an-integer": BadTrace(
        REQ + ",min_runtime_s", ("a,0,1,5,1h",), "2: min_runtime_s", "not an integer"
    ),
    "duplicate-job-id-names-both-lines": BadTrace(
        REQ, ("a,0,1,5", "b,0,1,5", "a,9,1,5"), "4: job_id", "first on line 2"
    ),
    "empty-job-id": BadTrace(REQ, (",0,1,5",), "2: job_id", "empty"),
    "resumable-not-a-boolean": BadTrace(
        REQ + ",resumable", ("a,0,1,5,maybe",), "2: resumable", "boolean"
    ),
    "legacy-protected-not-a-boolean": BadTrace(
        REQ + ",legacy_protected", ("a,0,1,5,sure",), "2: legacy_protected", "boolean"
    ),
    "unknown-legacy-class": BadTrace(
        REQ + ",legacy_class", ("a,0,1,5,URGENT",), "2: legacy_class", "HIGH, NORMAL, LOW"
    ),
    "column-twice": BadTrace(
        "job_id,submit_time_s,gpus,gpus,duration_s", ("a,0,1,1,5",), "1: gpus", "twice"
    ),
}


@pytest.mark.parametrize("case", BAD_TRACES.values(), ids=BAD_TRACES.keys())
def test_errors_name_file_line_column_and_reason(tmp_path: Path, case: BadTrace) -> None:
    path = write_csv(tmp_path, case.header, *case.rows)
    with pytest.raises(ValidationError) as err:
        read_trace(path)
    assert err.value.field == f"{path}:{case.where}"
    assert case.reason in err.value.reason


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("", encoding="utf-8")
    with pytest.raises(ValidationError, match="header"):
        read_trace(path)


def test_defaults_above_the_contract_cap_are_rejected(tmp_path: Path) -> None:
    path = write_csv(tmp_path, "job_id,submit_time_s,gpus,duration_s", "a,0,1,5")
    with pytest.raises(ValidationError) as err:
        read_trace(path, TraceDefaults(min_runtime_s=9 * 3600))
    assert err.value.field == "TraceDefaults.min_runtime_s"


@pytest.mark.skipif(not PHILLY.exists(), reason="../shared/traces is absent (it is present in CI)")
def test_reads_the_philly_file_as_it_is() -> None:
    jobs = read_trace(PHILLY, TraceDefaults())
    assert len(jobs) == 82_247
    assert len({j.workload.id for j in jobs}) == 82_247
    submits = [j.workload.submit_time for j in jobs]
    assert submits == sorted(submits)
    assert submits[0] == 0.0
    gpus = Counter(j.workload.gpus for j in jobs)
    assert (gpus[1], gpus[64], gpus[128]) == (76_627, 6, 3)
    total_gpu_h = sum(j.workload.gpus * j.duration_s for j in jobs) / 3600
    assert total_gpu_h == pytest.approx(978_078.5, abs=0.1)
    teams = Counter(j.workload.allocation for j in jobs)
    assert len(teams) == 15
    assert teams["6214e9"] == 41_226
    assert teams["103959"] == 1_934  # a hash that looks like a number stays a string
    first = jobs[0].workload
    assert (first.user, first.kind, first.min_runtime_s, first.resumable) == (
        "7f04ca",
        "training",
        7200,
        True,
    )
