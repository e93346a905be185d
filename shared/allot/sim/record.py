"""What a simulation run leaves behind: the raw facts every report figure is computed from.

The engine appends to a ``SimRecord`` as it goes; ``allot.sim.report`` turns it into
report.json. Keeping the record separate from the report means a figure can be added or
re-derived without touching the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Segment:
    """One stretch of GPU time held by one attempt of a workload, ``[start, end)``.

    ``allocated`` is the contract's meaning: charged to ``allocation``. Unallocated segments
    carry ``allocation`` too when the workload named one (min_runtime 0), so reports can
    say whose free time it was, but they are never charged or counted as delivered.
    """

    workload_id: str
    allocation: str | None
    allocated: bool
    gpus: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Waiting:
    """A stretch during which a workload was queued (submitted or requeued), ``[start, end)``."""

    workload_id: str
    allocation: str | None
    allocated: bool
    gpus: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Preemption:
    time: float  # when the notice was issued
    workload_id: str
    allocation: str | None  # the victim's, when it was allocated work; None otherwise
    gpus: int
    reason: str
    requeued: bool


@dataclass(frozen=True, slots=True)
class JobOutcome:
    workload_id: str
    allocation: str | None
    kind: str
    gpus: int
    submit_time: float
    first_start: float | None  # None: never started before the run ended
    end_time: float | None
    state: str  # "completed" | "preempted" | "pending" | "running"


@dataclass(frozen=True, slots=True)
class AttemptCost:
    """What one attempt cost beyond its progress (``allot.sim.checkpoints``): kept for every
    preempted attempt and every attempt that restored or saved periodically.

    ``lost_s``: seconds lost to preemption (work since the last checkpoint, the notice
    save, the restore; a non-resumable workload's whole attempt), ``restore_s`` of them
    restoring; ``saves_s``: seconds in completed periodic saves (overhead, not lost);
    ``notice``: ``saved``, ``too-short`` (the save did not fit in the grace period) or
    empty (not preempted, or not checkpointing on notice). Multiply by ``gpus``."""

    workload_id: str
    allocation: str | None
    allocated: bool
    kind: str
    gpus: int
    end: float  # when the attempt ended
    preempted: bool
    lost_s: float
    restore_s: float
    saves_s: float
    notice: str


@dataclass(frozen=True, slots=True)
class CapacityChange:
    """From ``time`` on, ``healthy_gpus`` GPUs are on HEALTHY hosts."""

    time: float
    healthy_gpus: int


@dataclass(slots=True)
class SimRecord:
    policy: str
    seed: int
    first_submit: float
    last_submit: float
    end_time: float
    segments: list[Segment] = field(default_factory=list)
    waits: list[Waiting] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    jobs: list[JobOutcome] = field(default_factory=list)
    capacity: list[CapacityChange] = field(default_factory=list)
    requeues: int = 0
    final_fairshare: dict[str, float] = field(default_factory=dict)
    effective_shares: dict[str, float] = field(default_factory=dict)
    programs: dict[str, str] = field(default_factory=dict)  # allocation -> top-level program
    usage: dict[str, dict[int, float]] = field(default_factory=dict)
    """GPU-seconds charged per allocation and hour, as the accounting service's store holds
    them (``allot.core.usage``); empty for a record not made by the simulator."""
    reserved: set[str] = field(default_factory=set)
    """Workloads that held a reservation at some cycle (``allot.core.reservations``)."""
    reservation_idle_gpu_s: float = 0.0
    """GPU-seconds that reserved hosts held free and nobody used (the reservations' cost)."""
    short_lane: tuple[str, ...] = ()
    """The hosts of the run's short lane (none for the baselines, which ignore it)."""
    checkpointing: dict[str, object] | None = None
    """The checkpointing settings per kind (``CheckpointPlan.as_json``); None: not modelled
    (a record not made by ``allot simulate``), so no loss is reported."""
    attempt_costs: list[AttemptCost] = field(default_factory=list)


def allocated_workloads(record: SimRecord) -> set[str]:
    """The workloads that ran or waited as allocated work (the contract's meaning: charged
    to their allocation and protected), from their segments and waits."""
    allocated = {s.workload_id for s in record.segments if s.allocated}
    allocated.update(w.workload_id for w in record.waits if w.allocated)
    return allocated
