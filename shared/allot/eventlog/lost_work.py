"""GPU-seconds lost to a preemption, and what the log keeps of a workload's checkpoint
protocol (issue 40; the definition: docs/decisions/0053).

Pure (no I/O, no clock). ``lost_gpu_seconds``: the work of the attempt that the next one
cannot resume, ``gpus x (end - max(start, last confirmed checkpoint))``: everything since
the last checkpoint the agent saw confirmed in this attempt, the whole attempt when there
was none (missed, or no checkpoint protocol at all: nothing says the work survived).
Range ``[0, gpus x (end - start)]``: a checkpoint time outside the run is clamped to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from allot.proto import messages as m


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    """A submission's checkpoint protocol, as the fold keeps it (one per workload that asked
    for it; None otherwise, so work without the protocol costs nothing)."""

    signal: m.CheckpointSignal | None
    timeout_s: float | None
    directory: str | None
    session: bool

    @classmethod
    def of(cls, r: m.WorkloadSubmitted) -> CheckpointSpec | None:
        """None unless ``r`` asks for the protocol: a checkpoint field set, or a session."""
        session = r.kind == m.SESSION_KIND
        if (
            r.checkpoint_signal is None
            and r.checkpoint_timeout_s is None
            and r.checkpoint_dir is None
            and not session
        ):
            return None
        return cls(r.checkpoint_signal, r.checkpoint_timeout_s, r.checkpoint_dir, session)


def lost_gpu_seconds(
    gpus: int, started_at: float, ended_at: float, checkpointed_at: float | None
) -> float:
    """GPU-seconds of one attempt lost to its preemption (see the module)."""
    if ended_at <= started_at:
        return 0.0
    since = (
        started_at if checkpointed_at is None else min(max(checkpointed_at, started_at), ended_at)
    )
    return gpus * (ended_at - since)


__all__ = ["CheckpointSpec", "lost_gpu_seconds"]
