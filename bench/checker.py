"""The fault-injection checker: a client history plus the log, in, figures and violations out.

Pure: no I/O, no clock. ``check(ops, records)`` takes the history of ``history``
and the decoded log records in the order every reader replays them (HOSTS, then WORKLOADS;
host records are needed because the fold ignores a placement on an unknown host), and
checks, as Jepsen does for a queue:

* **lost**: a submission acknowledged (``ok``) whose ``WorkloadSubmitted`` never appears;
* **unexpected**: a ``WorkloadSubmitted`` no client ever invoked, or one whose invocation
  certainly failed (``fail``); ``unknown`` invocations may appear or not;
* **double placement**: more than one placement applied for one (workload, attempt);
* **GPU double-booked**: replaying the records through ``LogFold``, and, independently of
  the fold's own bookkeeping, tracking (host, GPU) -> running workload from the placements
  of the current epoch the fold accepted and the ends it accepted: a GPU taken while held;
* **epochs**: every ``LeaderElected`` the fold applies has a strictly greater epoch (a
  stale one left in the log by a paused old leader is ignored, and counted);
* **stale decisions applied**: a decision (``WorkloadPlaced``, ``PreemptionNotice``) whose
  epoch is below the latest ``LeaderElected`` seen so far, yet the fold applied it.
  ``HostDrained`` is not counted: it is deliberately not fenced (a replay reads HOSTS
  before the epoch exists, and a stale "drained" frees or books no GPU);
* with ``require_placed``: an acknowledged submission never placed (after quiescence).

Recovery: for each fault recorded in the history, the time from the fault to the first
submission invoked after it (and before the next fault) that was both acknowledged and
placed: ``max(ack delay, placement delay)``, the placement delay measured by the wall
clock against the applied ``WorkloadPlaced.at``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from allot.eventlog.logfold import TERMINAL, LogFold
from allot.proto import messages as m
from history import FAULT, SUBMIT, Op, completions

Gpu = tuple[str, int]
Key = tuple[str | None, str]  # (allocation, client_id): what identifies a submission

_ENDS = (m.WorkloadCompleted, m.WorkloadFailed, m.WorkloadCancelled, m.WorkloadPreempted)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class Recovery:
    kind: str
    target: str
    at: float
    """Monotonic time of the fault (from the history)."""
    seconds: float | None
    """None: no submission invoked after it was acknowledged and placed before the next."""


@dataclass
class Report:
    invoked: int = 0
    acknowledged: int = 0
    failed: int = 0
    unknown: int = 0
    unknown_observed: int = 0
    lost: int = 0
    unexpected: int = 0
    duplicated_records: int = 0
    """``WorkloadSubmitted`` records of an id already submitted (the fold ignores them)."""
    placements_applied: int = 0
    placements_ignored: dict[str, int] = field(default_factory=dict)
    current_epoch_placements_refused: int = 0
    """Placements of the current epoch the fold refused: the leader decided on a view the
    log did not share (fencing masked it; worth a look, not a violation by itself)."""
    double_placements: int = 0
    gpu_double_booked: int = 0
    epochs: list[int] = field(default_factory=list)
    stale_leader_records: int = 0
    stale_decisions: int = 0
    stale_decisions_applied: int = 0
    unplaced: int = 0
    unfinished: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    """Final status of the acknowledged workloads (completed, failed, ...)."""
    recoveries: list[Recovery] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def recovery_summary(self) -> dict[str, dict[str, float | int | None]]:
        """Per fault kind: count, p50 and max seconds, and how many never recovered."""
        by_kind: dict[str, list[Recovery]] = {}
        for r in self.recoveries:
            by_kind.setdefault(r.kind, []).append(r)
        by_kind["all"] = list(self.recoveries)
        out: dict[str, dict[str, float | int | None]] = {}
        for kind, rs in by_kind.items():
            secs = [r.seconds for r in rs if r.seconds is not None]
            out[kind] = {
                "faults": len(rs),
                "p50_s": statistics.median(secs) if secs else None,
                "max_s": max(secs) if secs else None,
                "unrecovered": sum(1 for r in rs if r.seconds is None),
            }
        return out

    def figures(self) -> dict[str, object]:
        """Everything but the per-fault list and the violations, JSON-ready."""
        return {
            "invoked": self.invoked,
            "acknowledged": self.acknowledged,
            "failed": self.failed,
            "unknown": self.unknown,
            "unknown_observed": self.unknown_observed,
            "lost": self.lost,
            "unexpected": self.unexpected,
            "duplicated_records": self.duplicated_records,
            "placements_applied": self.placements_applied,
            "placements_ignored": dict(self.placements_ignored),
            "current_epoch_placements_refused": self.current_epoch_placements_refused,
            "double_placements": self.double_placements,
            "gpu_double_booked": self.gpu_double_booked,
            "epochs": list(self.epochs),
            "stale_leader_records": self.stale_leader_records,
            "stale_decisions": self.stale_decisions,
            "stale_decisions_applied": self.stale_decisions_applied,
            "unplaced": self.unplaced,
            "unfinished": self.unfinished,
            "outcomes": dict(self.outcomes),
        }


class _GpuTracker:
    """(host, GPU) -> (workload, attempt) running there, kept apart from the fold's state."""

    def __init__(self) -> None:
        self.busy: dict[Gpu, tuple[str, int]] = {}
        self.held: dict[str, tuple[int, list[Gpu]]] = {}

    def place(self, r: m.WorkloadPlaced) -> list[str]:
        clashes = []
        gpus = [(hg.host, g) for hg in r.assignment for g in hg.gpus]
        for gpu in gpus:
            holder = self.busy.get(gpu)
            if holder is not None:
                clashes.append(
                    f"{gpu[0]} GPU {gpu[1]}: {r.workload_id} attempt {r.attempt} placed while "
                    f"{holder[0]} attempt {holder[1]} holds it"
                )
        for gpu in gpus:
            self.busy[gpu] = (r.workload_id, r.attempt)
        self.held[r.workload_id] = (r.attempt, gpus)
        return clashes

    def end(self, workload_id: str, attempt: int) -> None:
        held = self.held.get(workload_id)
        if held is None or held[0] != attempt:
            return
        del self.held[workload_id]
        for gpu in held[1]:
            if self.busy.get(gpu) == (workload_id, attempt):
                del self.busy[gpu]


def check(
    ops: Sequence[Op],
    records: Iterable[msgspec.Struct],
    *,
    require_placed: bool = False,
    fold: LogFold | None = None,
) -> Report:
    """``fold``: a fresh ``LogFold`` by default; tests pass a deliberately broken one to
    show that the checks behind the fold catch what it would let through."""
    rep = Report()
    calls = completions(ops)
    by_key: dict[Key, tuple[Op, Op | None]] = {}
    for invoke, done in calls.values():
        by_key[(_alloc(invoke), str(invoke.value["client_id"]))] = (invoke, done)
        rep.invoked += 1
        kind = "pending" if done is None else done.type
        if kind == "ok":
            rep.acknowledged += 1
        elif kind == "fail":
            rep.failed += 1
        else:  # unknown, or never completed (the run stopped while it waited)
            rep.unknown += 1

    fold = LogFold() if fold is None else fold
    gpus = _GpuTracker()
    latest_epoch = 0  # the latest LeaderElected seen, applied or not
    submitted: dict[str, Key] = {}  # workload id -> submission key, first record only
    placed_at: dict[str, float] = {}  # workload id -> wall time of its first applied placement
    per_attempt: Counter[tuple[str, int]] = Counter()
    ignored: Counter[str] = Counter()

    for rec in records:
        if isinstance(rec, m.LeaderElected):
            applied = fold.apply(rec)
            if rec.epoch <= latest_epoch:
                rep.stale_leader_records += 1
            if applied.changed:
                if rep.epochs and rec.epoch <= rep.epochs[-1]:
                    rep.violations.append(
                        Violation(
                            "epoch_not_increasing",
                            f"epoch {rec.epoch} applied after {rep.epochs[-1]}",
                        )
                    )
                rep.epochs.append(rec.epoch)
            latest_epoch = max(latest_epoch, rec.epoch)
            continue
        stale = isinstance(rec, m.WorkloadPlaced | m.PreemptionNotice) and rec.epoch < latest_epoch
        current = isinstance(rec, m.WorkloadPlaced) and rec.epoch == latest_epoch
        applied = fold.apply(rec)
        if stale:
            rep.stale_decisions += 1
            if applied.changed:
                rep.stale_decisions_applied += 1
                rep.violations.append(
                    Violation(
                        "stale_decision_applied",
                        f"{type(rec).__name__} of {rec.workload_id} "  # type: ignore[attr-defined]
                        f"epoch {rec.epoch} applied after epoch {latest_epoch}",  # type: ignore[attr-defined]
                    )
                )
        if isinstance(rec, m.WorkloadSubmitted):
            if rec.workload_id in submitted:
                rep.duplicated_records += 1
            else:
                submitted[rec.workload_id] = (rec.allocation, rec.client_id)
        elif isinstance(rec, m.WorkloadPlaced):
            if not applied.changed:
                ignored[applied.why] += 1
                if current:
                    rep.current_epoch_placements_refused += 1
                continue
            rep.placements_applied += 1
            placed_at.setdefault(rec.workload_id, rec.at)
            key = (rec.workload_id, rec.attempt)
            per_attempt[key] += 1
            if per_attempt[key] == 2:
                rep.double_placements += 1
                rep.violations.append(
                    Violation(
                        "double_placement",
                        f"{rec.workload_id} attempt {rec.attempt} placed more than once",
                    )
                )
            if current:
                for clash in gpus.place(rec):
                    rep.gpu_double_booked += 1
                    rep.violations.append(Violation("gpu_double_booked", clash))
        elif isinstance(rec, _ENDS) and applied.changed:
            gpus.end(rec.workload_id, rec.attempt)
    rep.placements_ignored = dict(ignored)

    _submissions(rep, by_key, submitted, placed_at, fold, require_placed=require_placed)
    rep.recoveries = _recoveries(ops, calls, placed_at)
    return rep


def _alloc(op: Op) -> str | None:
    a = op.value.get("allocation")
    return None if a is None else str(a)


def _submissions(
    rep: Report,
    by_key: dict[Key, tuple[Op, Op | None]],
    submitted: dict[str, Key],
    placed_at: dict[str, float],
    fold: LogFold,
    *,
    require_placed: bool,
) -> None:
    seen_keys = {key: wid for wid, key in submitted.items()}
    for key, (_, done) in by_key.items():
        wid = seen_keys.get(key)
        kind = "pending" if done is None else done.type
        if kind == "ok":
            if wid is None:
                rep.lost += 1
                rep.violations.append(
                    Violation("lost", f"acknowledged submission {key[1]} ({key[0]}) not in the log")
                )
                continue
            rec = fold.records.get(wid)
            status = rec.status if rec is not None else "unknown"
            rep.outcomes[status] = rep.outcomes.get(status, 0) + 1
            if status not in TERMINAL:
                rep.unfinished += 1
            if wid not in placed_at:
                rep.unplaced += 1
                if require_placed:
                    rep.violations.append(
                        Violation("unplaced", f"acknowledged {wid} ({key[1]}) never placed")
                    )
        elif wid is not None and kind == "fail":
            rep.unexpected += 1
            rep.violations.append(
                Violation("unexpected", f"{wid} ({key[1]}) is in the log but its submit failed")
            )
        elif wid is not None:
            rep.unknown_observed += 1
    for wid, key in submitted.items():
        if key not in by_key:
            rep.unexpected += 1
            rep.violations.append(
                Violation("unexpected", f"{wid} ({key[1]}, {key[0]}) in the log, never submitted")
            )


def _recoveries(
    ops: Sequence[Op],
    calls: dict[str, tuple[Op, Op | None]],
    placed_at: dict[str, float],
) -> list[Recovery]:
    faults = [op for op in ops if op.f == FAULT and op.type == "info"]
    good: list[tuple[float, float, float]] = []  # (invoke time, ack delay base, placed wall)
    for invoke, done in calls.values():
        if done is None or done.type != "ok" or invoke.f != SUBMIT:
            continue
        wid = done.value.get("workload_id")
        if isinstance(wid, str) and wid in placed_at:
            good.append((invoke.time, done.time, placed_at[wid]))
    good.sort()
    out = []
    for i, fault in enumerate(faults):
        until = faults[i + 1].time if i + 1 < len(faults) else float("inf")
        best: float | None = None
        for invoked, acked, placed_wall in good:
            if invoked < fault.time:
                continue
            if invoked >= until:
                break
            delay = max(acked - fault.time, placed_wall - fault.wall)
            best = delay if best is None else min(best, delay)
        out.append(
            Recovery(
                kind=str(fault.value.get("kind")),
                target=str(fault.value.get("target")),
                at=fault.time,
                seconds=best,
            )
        )
    return out
