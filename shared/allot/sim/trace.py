"""Read a workload trace (CSV) into workloads and their service demands.

Input: a CSV file with a header row. Columns, in any order:

=================  ========  ==============================================================
column             required  meaning (default when the column is absent or the cell empty)
=================  ========  ==============================================================
job_id             yes       workload id; unique in the file
submit_time_s      yes       submission time, seconds (number >= 0)
gpus               yes       GPUs requested (integer > 0)
duration_s         yes       service demand: seconds of running needed to finish (> 0)
allocation         no        budget-tree leaf charged (``team`` is accepted as a synonym);
                             default ``TraceDefaults.allocation`` (None: unallocated)
user               no        default ``TraceDefaults.user``; if that is empty too, the
                             allocation name, or ``"unknown"`` without an allocation
kind               no        ``debug``/``interactive``/``eval``/``training``/``filler``/...;
                             default ``TraceDefaults.kind``
min_runtime_s      no        protected window, integer in [0, 28800] (8 h); default
                             ``TraceDefaults.min_runtime_s``; 0 marks the work unallocated
resumable          no        ``true``/``false`` (also ``1``/``0``, ``yes``/``no``);
                             default ``TraceDefaults.resumable``
legacy_class       no        ``HIGH``/``NORMAL``/``LOW``, for the legacy ``priority``
                             baseline; default ``NORMAL``
legacy_protected   no        ``true``/``false``: opted out of preemption under the legacy
                             baseline; default ``false``
=================  ========  ==============================================================

Any other column (e.g. the Philly file's ``status``) is ignored.

Output: ``list[TraceJob]`` sorted by (``submit_time_s``, file order); each holds the
``Workload`` (id = job_id, ``submit_time`` = submit_time_s) and its ``duration_s``. The
legacy columns stay on the ``TraceJob`` (the workload keeps ``priority=0``); only the
``priority`` baseline reads them (``allot.sim.baselines.LegacyPriority``).

Errors: ``ValidationError`` whose field is ``"<file>:<line>: <column>"`` (line numbers are
1-based physical lines, the header is line 1) and whose reason says what was wrong: a missing
required column, a bad number, ``gpus <= 0``, ``min_runtime_s`` above 8 h, an unknown
boolean or legacy class, or a ``job_id`` already used on another line. Rows that repeat
another row's values under a *different* job_id are fine (the Philly file has 65).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from allot.core.errors import ValidationError
from allot.core.model import MAX_MIN_RUNTIME_S, Workload
from allot.sim.input_files import csv_rows

if TYPE_CHECKING:
    from _csv import Reader

REQUIRED_COLUMNS = ("job_id", "submit_time_s", "gpus", "duration_s")
LEGACY_CLASSES = ("HIGH", "NORMAL", "LOW")

_BOOLEANS = {
    **dict.fromkeys(("true", "1", "yes", "y", "t"), True),
    **dict.fromkeys(("false", "0", "no", "n", "f"), False),
}


@dataclass(frozen=True, slots=True)
class TraceDefaults:
    """Values for optional columns that are absent, or cells that are empty."""

    min_runtime_s: int = 7200
    resumable: bool = True
    kind: str = "training"
    user: str = ""  # empty: use the allocation name, or "unknown"
    allocation: str | None = None  # None: the job is unallocated (charged to nobody)


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One trace row: the workload as submitted and the running time it needs to finish."""

    workload: Workload
    duration_s: float
    legacy_class: str = "NORMAL"
    legacy_protected: bool = False


def read_trace(path: Path, defaults: TraceDefaults = TraceDefaults()) -> list[TraceJob]:
    """Read ``path`` (see the module docstring) and return its jobs by submit time."""
    if not 0 <= defaults.min_runtime_s <= MAX_MIN_RUNTIME_S:
        raise ValidationError(
            "TraceDefaults.min_runtime_s",
            f"must be in [0, {MAX_MIN_RUNTIME_S}] (8 h), got {defaults.min_runtime_s}",
        )
    name = str(path)
    with csv_rows(path) as reader:
        try:
            header = next(reader)
        except StopIteration:
            raise ValidationError(f"{name}:1", "empty file: expected a header row") from None
        col = _column_index(name, header)
        jobs = _read_rows(name, reader, col, defaults)
    jobs.sort(key=_submit_key)  # stable: ties keep file order
    return jobs


def _submit_key(job: TraceJob) -> float:
    return job.workload.submit_time


def _column_index(name: str, header: list[str]) -> dict[str, int]:
    col: dict[str, int] = {}
    for i, raw in enumerate(header):
        key = raw.strip()
        if not key:
            continue  # an unnamed column (e.g. a trailing comma) is ignored like any extra
        if key in col:
            raise ValidationError(f"{name}:1: {key}", "column appears twice in the header")
        col[key] = i
    if "allocation" not in col and "team" in col:
        col["allocation"] = col["team"]  # the Philly file names the allocation `team`
    for required in REQUIRED_COLUMNS:
        if required not in col:
            raise ValidationError(
                f"{name}:1: {required}",
                f"missing required column (header has: {', '.join(h.strip() for h in header)})",
            )
    return col


def _read_rows(
    name: str,
    reader: Reader,
    col: dict[str, int],
    defaults: TraceDefaults,
) -> list[TraceJob]:
    """The hot loop: one try block parses a row; any failure re-parses it slowly to name
    the column and the reason (``_diagnose``)."""
    i_id = col["job_id"]
    i_submit = col["submit_time_s"]
    i_gpus = col["gpus"]
    i_duration = col["duration_s"]
    i_alloc = col.get("allocation", -1)
    i_user = col.get("user", -1)
    i_kind = col.get("kind", -1)
    i_min = col.get("min_runtime_s", -1)
    i_resumable = col.get("resumable", -1)
    i_class = col.get("legacy_class", -1)
    i_protected = col.get("legacy_protected", -1)
    width = max(col.values()) + 1
    padding = [""] * width
    inf = math.inf
    default_alloc = defaults.allocation
    default_user = defaults.user
    default_kind = defaults.kind
    default_min = defaults.min_runtime_s
    default_resumable = defaults.resumable

    seen: dict[str, int] = {}
    jobs: list[TraceJob] = []
    append = jobs.append
    for raw in reader:
        if not raw:
            continue  # a blank line
        row = raw if len(raw) >= width else (raw + padding)[:width]
        try:
            job_id = row[i_id].strip()
            submit = float(row[i_submit])
            duration = float(row[i_duration])
            gpus = int(row[i_gpus])
            if not (job_id and gpus > 0 and 0 <= submit < inf and 0 < duration < inf):
                raise ValueError
            alloc = (row[i_alloc].strip() if i_alloc >= 0 else "") or default_alloc
            user = (row[i_user].strip() if i_user >= 0 else "") or default_user or alloc
            kind = (row[i_kind].strip() if i_kind >= 0 else "") or default_kind
            min_runtime = default_min
            if i_min >= 0 and row[i_min].strip():
                min_runtime = int(row[i_min])
                if not 0 <= min_runtime <= MAX_MIN_RUNTIME_S:
                    raise ValueError
            resumable = default_resumable
            if i_resumable >= 0 and row[i_resumable].strip():
                resumable = _BOOLEANS[row[i_resumable].strip().lower()]
            legacy_class = "NORMAL"
            if i_class >= 0 and row[i_class].strip():
                legacy_class = row[i_class].strip().upper()
                if legacy_class not in LEGACY_CLASSES:
                    raise ValueError
            protected = False
            if i_protected >= 0 and row[i_protected].strip():
                protected = _BOOLEANS[row[i_protected].strip().lower()]
        except (ValueError, KeyError):
            _diagnose(name, reader.line_num, row, col)
            raise  # pragma: no cover - _diagnose always raises
        if job_id in seen:
            raise ValidationError(
                f"{name}:{reader.line_num}: job_id",
                f"duplicate job_id {job_id!r} (first on line {seen[job_id]})",
            )
        seen[job_id] = reader.line_num
        try:
            workload = Workload(
                id=job_id,
                allocation=alloc,
                user=user or "unknown",
                gpus=gpus,
                min_runtime_s=min_runtime,
                resumable=resumable,
                kind=kind,
                submit_time=submit,
            )
        except ValidationError as exc:  # a rule the model checks that this loop does not
            raise ValidationError(f"{name}:{reader.line_num}: {exc.field}", exc.reason) from None
        append(TraceJob(workload, duration, legacy_class, protected))
    return jobs


def _diagnose(name: str, line: int, row: list[str], col: dict[str, int]) -> None:
    """Raise the ValidationError for a row the fast path rejected."""
    where = f"{name}:{line}"
    if not row[col["job_id"]].strip():
        raise ValidationError(f"{where}: job_id", "must not be empty")
    _number(where, "submit_time_s", row[col["submit_time_s"]], positive=False)
    gpus = _integer(where, "gpus", row[col["gpus"]])
    if gpus <= 0:
        raise ValidationError(f"{where}: gpus", f"must be > 0, got {gpus}")
    _number(where, "duration_s", row[col["duration_s"]], positive=True)
    if "min_runtime_s" in col and row[col["min_runtime_s"]].strip():
        min_runtime = _integer(where, "min_runtime_s", row[col["min_runtime_s"]])
        if not 0 <= min_runtime <= MAX_MIN_RUNTIME_S:
            raise ValidationError(
                f"{where}: min_runtime_s",
                f"must be in [0, {MAX_MIN_RUNTIME_S}] (the contract's 8 h cap), got {min_runtime}",
            )
    for column in ("resumable", "legacy_protected"):
        if column in col and row[col[column]].strip():
            text = row[col[column]]
            if text.strip().lower() not in _BOOLEANS:
                raise ValidationError(f"{where}: {column}", f"not a boolean (true/false): {text!r}")
    text = row[col["legacy_class"]] if "legacy_class" in col else ""
    raise ValidationError(
        f"{where}: legacy_class",
        f"must be one of {', '.join(LEGACY_CLASSES)}, got {text!r}",
    )


def _integer(where: str, column: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValidationError(f"{where}: {column}", f"not an integer: {text!r}") from None


def _number(where: str, column: str, text: str, *, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"{where}: {column}", f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise ValidationError(f"{where}: {column}", f"must be finite, got {text!r}")
    if positive and value <= 0:
        raise ValidationError(f"{where}: {column}", f"must be > 0, got {text!r}")
    if value < 0:
        raise ValidationError(f"{where}: {column}", f"must be >= 0, got {text!r}")
    return value
