"""Checkpointing in the simulator: what a preempted attempt keeps, and what it loses.

Input: per workload kind a ``Checkpointing(every_s, on_notice, save_s, restore_s)``
(a ``CheckpointPlan``), and per attempt its wall time, its restore time and, when it was
preempted, its grace period. Output: ``attempt_end``: the progress the next attempt starts
from, the seconds lost, the seconds spent in periodic saves. Standard library only.

An attempt's clock ``t`` starts after its restore (``restore_s`` when it starts from a
checkpoint, else 0: GPUs held, no progress). With periodic saves, each ``every_s`` of
progress is followed by a save of ``save_s`` (no progress), so with ``P = every + save``::

    progress_in(t) = q * every + min(r, every)        q, r = divmod(t, P)
    saves_in(t)    = q                                 (saves completed by t)
    wall_for(p)    = p + save * (ceil(p / every) - 1)  (p > 0; no save at completion)

and without them ``progress_in(t) = wall_for(t) = t``. ``progress_in(wall_for(p)) == p``;
an unpreempted run takes ``restore + wall_for(remaining)``.

A preempted attempt ends at its grace deadline, ``t`` after its restore, with grace ``g``:

1. on notice, ``save <= g``: it works until ``t - save``, then saves:
   kept = ``progress_in(t - save)``;
2. otherwise, with periodic saves: kept = ``every * saves_in(t)`` (its last periodic save);
3. otherwise nothing: kept = 0 (a requeued workload restarts from zero, or from an
   earlier attempt's checkpoint).

Lost seconds = wall - kept - ``save * saves completed`` (>= 0): work since the last
checkpoint, the notice save, a periodic save cut short and the restore. A non-resumable
workload is not requeued: it loses its whole attempt. A completed attempt loses its
restore, which only an earlier preemption made necessary. Lost GPU-seconds = GPUs x that.

NOT A BUG: a workload under notice whose run would end before its deadline completes
(the natural end comes first); it does not stop to save.

The default, on notice at no cost, is what the simulator did before checkpointing was
modelled (the whole attempt is kept, nothing lost): ``kept == wall`` exactly, in floats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

ALL_KINDS = "*"


@dataclass(frozen=True, slots=True)
class Checkpointing:
    """How workloads of one kind checkpoint (seconds; ``every_s`` None: no periodic saves)."""

    every_s: float | None = None
    on_notice: bool = True
    save_s: float = 0.0
    restore_s: float = 0.0

    def __post_init__(self) -> None:
        if self.every_s is not None and not (math.isfinite(self.every_s) and self.every_s > 0):
            raise ValueError(f"every_s must be a positive number, got {self.every_s!r}")
        for name, value in (("save_s", self.save_s), ("restore_s", self.restore_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    @property
    def saves_anything(self) -> bool:
        return self.on_notice or self.every_s is not None

    def progress_in(self, t: float) -> float:
        """Progress made in ``t`` seconds after the restore (0 while restoring)."""
        if t <= 0:
            return 0.0
        if self.every_s is None:
            return t
        q, r = divmod(t, self.every_s + self.save_s)
        return q * self.every_s + min(r, self.every_s)

    def saves_in(self, t: float) -> int:
        """Periodic saves completed in ``t`` seconds after the restore."""
        if self.every_s is None or t <= 0:
            return 0
        return int(t // (self.every_s + self.save_s))

    def wall_for(self, progress: float) -> float:
        """Seconds after the restore to make ``progress`` (saves before it included)."""
        if self.every_s is None or progress <= 0:
            return progress
        # One save after each whole interval but the last; never negative, even when the
        # quotient of a tiny progress underflows to 0.
        return progress + self.save_s * max(0, math.ceil(progress / self.every_s) - 1)

    def as_json(self) -> dict[str, object]:
        return {
            "every_s": self.every_s,
            "on_notice": self.on_notice,
            "save_s": self.save_s,
            "restore_s": self.restore_s,
        }


TODAY = Checkpointing()
"""On notice at no cost: a preempted attempt keeps everything up to its deadline."""


@dataclass(frozen=True, slots=True)
class CheckpointPlan:
    """``Checkpointing`` per kind; a kind not named gets ``default`` (``*`` on the CLI)."""

    by_kind: Mapping[str, Checkpointing] = field(default_factory=dict)
    default: Checkpointing = TODAY

    def of(self, kind: str) -> Checkpointing:
        return self.by_kind.get(kind, self.default)

    def as_json(self) -> dict[str, object]:
        """``{"*": settings, kind: settings, ...}`` for report.json."""
        return {
            ALL_KINDS: self.default.as_json(),
            **{k: self.by_kind[k].as_json() for k in sorted(self.by_kind)},
        }


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    kept_s: float  # progress the next attempt starts from (0: nothing new saved)
    lost_s: float  # seconds of this attempt lost (restore included)
    saves_s: float  # seconds spent in completed periodic saves (overhead, not lost)
    notice: str  # "saved", "too-short" (save longer than the grace), or "" (not asked)


def attempt_end(
    cp: Checkpointing,
    *,
    wall_s: float,
    restore_s: float,
    grace_s: float | None,
    resumable: bool = True,
) -> AttemptEnd:
    """How an attempt of ``wall_s`` seconds, the first ``restore_s`` restoring, ended:
    completed (``grace_s`` None) or preempted after a notice of ``grace_s`` seconds."""
    t = wall_s - restore_s
    if grace_s is None:
        return AttemptEnd(cp.progress_in(t), restore_s, cp.save_s * cp.saves_in(t), "")
    if not resumable:  # its saves too: nothing will read them
        return AttemptEnd(0.0, wall_s, 0.0, "")
    notice = ""
    if cp.on_notice:
        notice = "saved" if cp.save_s <= grace_s else "too-short"
    if notice == "saved":
        until = max(0.0, t - cp.save_s)
        kept = cp.progress_in(until)
        saves = cp.saves_in(until)
    elif cp.every_s is not None:
        saves = cp.saves_in(t)
        kept = cp.every_s * saves
    else:
        kept, saves = 0.0, 0
    saves_s = cp.save_s * saves
    return AttemptEnd(kept, max(0.0, wall_s - kept - saves_s), saves_s, notice)
