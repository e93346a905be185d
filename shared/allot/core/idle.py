"""Idle allocated GPUs: when a run's GPUs have stayed below a utilization threshold long
enough to flag it (squatting). Pure: samples and time in, a verdict out.

INPUTS. One ``IdleTrack`` per run (a workload's attempt on its hosts), stepped by
observations in the order they were logged:

* ``PartSample(host, start, end, util_pct)``: the highest mean utilization (percent,
  0..100) among the run's GPUs on ``host`` over ``[start, end]`` (seconds on the caller's
  clock); ``util_pct`` None means the host could not read its GPUs (no evidence either
  way);
* ``RunEnded(at)``: the run's attempt ended.

``IdlePolicy``: ``threshold_pct`` (default 5: a GPU at 5% or more is busy), ``window_s``
(default 1800: how long every GPU must stay below it), ``max_gap_s`` (default 120: the
longest silence between two samples of a host, or between the hosts of a gang, that still
counts as continuous evidence), ``preempt`` (default False: flag only).

PER HOST the track keeps ``seen_until`` (the end of its newest sample) and, while its
samples are below the threshold, ``idle_since`` (the start of the first of them) and
``peak_pct`` (the highest utilization among them). The RUN is idle since
``max(idle_since)`` over its hosts, proven up to ``min(seen_until)``: every GPU of every
host below the threshold, with no host silent longer than ``max_gap_s``.

RULES, in order, for a ``PartSample``:

1. Ignored (the track unchanged): the run has ended, the host is not one of the run's,
   ``util_pct`` is None, ``end <= start``, or ``end <= seen_until`` of the host (a replay
   or a duplicate).
2. Busy (``util_pct >= threshold_pct``): the host's idle evidence is dropped; a flagged
   run is cleared (``why`` busy) at its last idle evidence, ``seen_until`` before this
   sample.
3. Idle after a gap (``start > seen_until + max_gap_s``) or after a busy sample: the
   host's evidence starts again at ``start``; a flagged run whose evidence broke this way
   is cleared (``why`` no-samples).
4. Idle, continuous: the host's evidence extends to ``end``; ``peak_pct`` keeps the highest.
5. A flagged run one of whose hosts has been silent more than ``max_gap_s`` before this
   sample's ``end`` is cleared (``why`` no-samples), and that host's evidence dropped.
6. Not flagged, every host idle, ``min(seen_until) - max(idle_since) >= window_s``: flagged
   (``IdleFlag``) at ``min(seen_until)`` with a reason naming the numbers, and
   ``preempt`` = ``policy.preempt``. A run is flagged once per idle stretch.

``RunEnded(at)``: the track ends; a flagged run is cleared (``why`` ended) at
``max(flagged_at, min(at, min(seen_until)))``.

OUTPUT. ``IdleStep(track, verdict)``: the new track and at most one verdict: ``IdleFlag``
or ``IdleCleared(since, until, why)``. An idle stretch's GPU-seconds are
``gpus x (until - since)``, from the start of its evidence (the window before the flag
included) to its clearing: ``until >= flagged_at >= since + window_s`` always.

NOT A BUG: the flag's time is the evidence's (``min(seen_until)``), not a clock's: the same
samples give the same flags in every replay. Never preempts anything: ``IdleFlag.preempt``
only says what the policy asks for; the placement leader acts on it (``Snapshot.idle`` of
``allot.core.cycle``; docs/decisions/0055).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from allot.core.duration_text import format_duration
from allot.core.errors import ValidationError

DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_WINDOW_S = 1800.0
DEFAULT_MAX_GAP_S = 120.0
MAX_WINDOW_S = 7 * 86400.0

ClearWhy = Literal["busy", "ended", "no-samples"]


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """Validated at construction: a bad value raises ``ValidationError(field, reason)``."""

    threshold_pct: float = DEFAULT_THRESHOLD_PCT
    window_s: float = DEFAULT_WINDOW_S
    max_gap_s: float = DEFAULT_MAX_GAP_S
    preempt: bool = False
    """Ask for the flagged run's preemption (``IdleFlag.preempt``): the placement leader
    notices it once its protection has ended; default: flag only."""

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold_pct <= 100.0:
            raise ValidationError(
                "threshold_pct", f"must be in (0, 100] percent, got {self.threshold_pct!r}"
            )
        if not 0.0 < self.window_s <= MAX_WINDOW_S:
            raise ValidationError(
                "window_s", f"must be in (0, {MAX_WINDOW_S:g}] seconds, got {self.window_s!r}"
            )
        if not 0.0 < self.max_gap_s <= MAX_WINDOW_S:
            raise ValidationError(
                "max_gap_s", f"must be in (0, {MAX_WINDOW_S:g}] seconds, got {self.max_gap_s!r}"
            )


@dataclass(frozen=True, slots=True)
class HostEvidence:
    """One host's part of a run: its newest sample's end and, while idle, since when."""

    seen_until: float
    idle_since: float | None = None
    peak_pct: float = 0.0


@dataclass(frozen=True, slots=True)
class IdleTrack:
    """One run's evidence; ``hosts`` sorted, ``evidence`` aligned with them (None: no sample
    yet). ``flagged_at`` is set while the run is flagged, ``flagged_since`` with it."""

    hosts: tuple[str, ...]
    evidence: tuple[HostEvidence | None, ...] = ()
    flagged_since: float | None = None
    flagged_at: float | None = None
    ended: bool = False

    def __post_init__(self) -> None:
        if not self.evidence:
            object.__setattr__(self, "evidence", (None,) * len(self.hosts))
        if len(self.evidence) != len(self.hosts):
            raise ValidationError("evidence", "must have one entry per host")

    @property
    def flagged(self) -> bool:
        return self.flagged_at is not None

    def idle_span(self) -> tuple[float, float] | None:
        """(since, until) of the run's idle evidence: every host idle; None otherwise."""
        if not self.evidence or any(e is None or e.idle_since is None for e in self.evidence):
            return None
        starts = [e.idle_since for e in self.evidence if e is not None and e.idle_since is not None]
        return max(starts), min(e.seen_until for e in self.evidence if e is not None)


@dataclass(frozen=True, slots=True)
class PartSample:
    host: str
    start: float
    end: float
    util_pct: float | None


@dataclass(frozen=True, slots=True)
class RunEnded:
    at: float


@dataclass(frozen=True, slots=True)
class IdleFlag:
    since: float
    at: float
    peak_pct: float
    reason: str
    preempt: bool = False


@dataclass(frozen=True, slots=True)
class IdleCleared:
    since: float
    until: float
    why: ClearWhy


@dataclass(frozen=True, slots=True)
class IdleStep:
    track: IdleTrack
    verdict: IdleFlag | IdleCleared | None = None


def step(track: IdleTrack, seen: PartSample | RunEnded, policy: IdlePolicy) -> IdleStep:
    """The track after ``seen``, and the verdict it caused (see the module docstring)."""
    if track.ended:
        return IdleStep(track)
    if isinstance(seen, RunEnded):
        return _ended(track, seen.at)
    if seen.host not in track.hosts or seen.util_pct is None or seen.end <= seen.start:
        return IdleStep(track)  # rule 1
    i = track.hosts.index(seen.host)
    before = track.evidence[i]
    if before is not None and seen.end <= before.seen_until:
        return IdleStep(track)  # rule 1: a replay or a duplicate
    if seen.util_pct >= policy.threshold_pct:  # rule 2
        now = HostEvidence(seen_until=seen.end)
        cleared = _cleared(track, before.seen_until if before else seen.start, "busy")
        return _with(track, i, now, cleared)
    continuous = (
        before is not None
        and before.idle_since is not None
        and seen.start <= before.seen_until + policy.max_gap_s
    )
    if continuous:  # rule 4
        assert before is not None and before.idle_since is not None
        now = HostEvidence(seen.end, before.idle_since, max(before.peak_pct, seen.util_pct))
        result = _with(track, i, now, None)
    else:  # rule 3
        now = HostEvidence(seen.end, seen.start, seen.util_pct)
        gap = before is not None and before.idle_since is not None
        until = before.seen_until if before is not None else seen.start
        result = _with(track, i, now, _cleared(track, until, "no-samples") if gap else None)
    if result.verdict is None:
        result = _silent_hosts(result.track, seen.end, policy)  # rule 5
    if result.verdict is None:
        result = _flag(result.track, policy)  # rule 6
    return result


def _with(
    track: IdleTrack, i: int, evidence: HostEvidence, cleared: IdleCleared | None
) -> IdleStep:
    hosts = list(track.evidence)
    hosts[i] = evidence
    if cleared is None:
        return IdleStep(replace(track, evidence=tuple(hosts)))
    return IdleStep(
        replace(track, evidence=tuple(hosts), flagged_since=None, flagged_at=None), cleared
    )


def _cleared(track: IdleTrack, until: float, why: ClearWhy) -> IdleCleared | None:
    if track.flagged_at is None or track.flagged_since is None:
        return None
    return IdleCleared(track.flagged_since, max(track.flagged_at, until), why)


def _silent_hosts(track: IdleTrack, end: float, policy: IdlePolicy) -> IdleStep:
    if not track.flagged:
        return IdleStep(track)
    silent = [e is None or e.seen_until < end - policy.max_gap_s for e in track.evidence]
    if not any(silent):
        return IdleStep(track)
    last = min((e.seen_until for e in track.evidence if e is not None), default=end)
    cleared = _cleared(track, last, "no-samples")
    kept = tuple(
        None if gone or e is None else HostEvidence(e.seen_until)
        for gone, e in zip(silent, track.evidence, strict=True)
    )
    # The hosts still heard keep only their last time: the next stretch starts afresh.
    return IdleStep(replace(track, evidence=kept, flagged_since=None, flagged_at=None), cleared)


def _flag(track: IdleTrack, policy: IdlePolicy) -> IdleStep:
    span = track.idle_span()
    if track.flagged or span is None:
        return IdleStep(track)
    since, until = span
    if until - since < policy.window_s:
        return IdleStep(track)
    peak = max(e.peak_pct for e in track.evidence if e is not None)
    reason = (
        f"every GPU below {policy.threshold_pct:g}% for {format_duration(until - since)} "
        f"(threshold {format_duration(policy.window_s)}; highest {peak:.1f}%)"
    )
    flag = IdleFlag(since=since, at=until, peak_pct=peak, reason=reason, preempt=policy.preempt)
    return IdleStep(replace(track, flagged_since=since, flagged_at=until), flag)


def _ended(track: IdleTrack, at: float) -> IdleStep:
    last = min((e.seen_until for e in track.evidence if e is not None), default=at)
    cleared = _cleared(track, min(at, last), "ended")
    return IdleStep(replace(track, ended=True, flagged_since=None, flagged_at=None), cleared)


__all__ = [
    "DEFAULT_MAX_GAP_S",
    "DEFAULT_THRESHOLD_PCT",
    "DEFAULT_WINDOW_S",
    "HostEvidence",
    "IdleCleared",
    "IdleFlag",
    "IdlePolicy",
    "IdleStep",
    "IdleTrack",
    "PartSample",
    "RunEnded",
    "step",
]
