"""The nouns of the scheduling core: workloads, hosts and the cluster snapshot (running work
is ``allot.core.running``).

Everything here is a frozen value. Times are seconds on the caller's clock (the simulator's
virtual clock, or the placement service's wall clock read *outside* the core) and always
arrive as arguments.

The contract (see the seeds): a workload declares ``min_runtime_s`` in [0, 8 h]. It is
*allocated* when it is charged to an allocation (a leaf of the budget tree) and its
``min_runtime_s`` is above zero; allocated work is protected from preemption until
``start + min_runtime_s``. Anything else is *unallocated*: free, never charged, and
preemptible at any moment by any allocated request.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from allot.core.errors import ValidationError

MAX_MIN_RUNTIME_S = 8 * 3600
"""The contract's ceiling on the protected window (the seeds chose 8 hours)."""

DEFAULT_GRACE_S = 300
"""Time between a preemption notice and the moment the victim's GPUs count as free."""

DEFAULT_UNALLOCATED_GRACE_S = 30
"""The same for unallocated victims under Fair Tree: free work may be preempted at any
moment (the contract), so it gets only the time to checkpoint, and the allocated request
that displaces it starts in seconds, not after a full grace period (decision 0045)."""


class HostState(StrEnum):
    HEALTHY = "healthy"
    DRAINING = "draining"  # unhealthy: nothing new lands; workloads leave as protection ends
    DRAINED = "drained"  # draining and empty: waits for an operator
    CORDONED = "cordoned"  # operator hold: nothing new lands, running work is left alone


@dataclass(frozen=True, slots=True)
class Workload:
    """A request for ``gpus`` GPUs, as submitted (and as requeued after a preemption)."""

    id: str
    allocation: str | None
    user: str
    gpus: int
    min_runtime_s: int
    resumable: bool = True
    kind: str = "training"
    priority: int = 0  # user priority: orders only within the workload's own allocation
    submit_time: float = 0.0

    def __post_init__(self) -> None:
        if not self.id:
            raise ValidationError("id", "must be a non-empty string")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus <= 0:
            raise ValidationError("gpus", f"must be a positive integer, got {self.gpus!r}")
        if (
            isinstance(self.min_runtime_s, bool)
            or not isinstance(self.min_runtime_s, int)
            or not 0 <= self.min_runtime_s <= MAX_MIN_RUNTIME_S
        ):
            raise ValidationError(
                "min_runtime_s",
                f"must be an integer in [0, {MAX_MIN_RUNTIME_S}] (8 h), got {self.min_runtime_s!r}",
            )
        if self.allocation == "":
            raise ValidationError("allocation", "must be a leaf name or absent, not empty")

    @property
    def allocated(self) -> bool:
        """Charged to a budget and protected for its minimum runtime."""
        return self.allocation is not None and self.min_runtime_s > 0


@dataclass(frozen=True, slots=True)
class Host:
    id: str
    gpus: int
    state: HostState = HostState.HEALTHY

    def __post_init__(self) -> None:
        if not self.id:
            raise ValidationError("host.id", "must be a non-empty string")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus <= 0:
            raise ValidationError(
                f"host {self.id}: gpus", f"must be a positive integer, got {self.gpus!r}"
            )

    @property
    def schedulable(self) -> bool:
        return self.state is HostState.HEALTHY


Assignment = tuple[tuple[str, tuple[int, ...]], ...]
"""Where a workload runs: ``((host_id, (gpu_index, ...)), ...)``, hosts in sorted order."""
