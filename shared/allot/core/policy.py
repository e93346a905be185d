"""Policies: the knobs one scheduling entry point is run with.

``FAIRSHARE`` is Allot. The other modes are the baselines the simulator compares it with;
they run through the same ``run_cycle`` (same placement, same gang rules, same drains) and
differ only in queue order and in who may preempt whom:

- ``PRIORITY``: the legacy system of the seeds. Workloads carry a class in ``priority``
  (2 HIGH, 1 NORMAL, 0 LOW) and may opt out of preemption (``opt_out``); a team may hold at
  most ``protected_gpu_cap`` opted-out GPUs at once (the rest run unshielded). Queue: class,
  then submit time. A request preempts unshielded work of a strictly lower class. A drain
  cannot remove shielded work: operators had to negotiate it (the seeds' on-call toil).
- ``FIFO``: one global queue by submit time; a workload that does not fit is passed over
  (greedy backfill) rather than blocking the queue; no preemption.
- ``PARTITIONED``: each team owns a fixed set of hosts (``ClusterState`` pools named after
  the team); FIFO with backfill inside each; no preemption. Work of a team with no hosts,
  and unallocated work, may use the hosts no team owns (pool ``""``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from allot.core.errors import ValidationError
from allot.core.model import DEFAULT_GRACE_S


class Mode(StrEnum):
    FAIRSHARE = "fairshare"
    PRIORITY = "priority"
    FIFO = "fifo"
    PARTITIONED = "partitioned"


@dataclass(frozen=True, slots=True)
class Policy:
    mode: Mode = Mode.FAIRSHARE
    # FAIRSHARE: pending work of allocations below their entitlement sorts first (the
    # "entitlement tier"); off = rank by Fair Tree over the window alone.
    entitlement_tier: bool = True
    preemption: bool = True
    grace_s: int = DEFAULT_GRACE_S
    # PRIORITY: opted-out GPUs each team may hold at once (a team missing here: no cap).
    protected_gpu_cap: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        if self.grace_s < 0:
            raise ValidationError("grace_s", f"must be >= 0, got {self.grace_s}")
        for team, cap in (self.protected_gpu_cap or {}).items():
            if cap < 0:
                raise ValidationError(f"protected_gpu_cap.{team}", f"must be >= 0, got {cap}")

    @property
    def preempts(self) -> bool:
        return self.preemption and self.mode in (Mode.FAIRSHARE, Mode.PRIORITY)
