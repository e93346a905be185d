"""The health service's idle detection: agents' utilization reports judged against the log.

Pure (no I/O, no clock: ``now`` is an argument). The health service folds HOSTS and
WORKLOADS from the placements on (``apply``) into ``IdleWatch.fold`` (``LogFold``: which
allocated run holds which GPUs), the idle records of USAGE into ``IdleWatch.book``
(``IdleBook``), and calls:

* ``judge(host, report, now)`` for each ``HostUtilization`` an agent sends on its own
  host's subject. Refused, naming the field (``ValidationError``): a host that never
  registered (``host``), a ``sent_at`` more than ``CLOCK_SKEW_S`` ahead of ``now`` or more
  than ``MAX_REPORT_AGE_S`` behind it, a ``since`` not before ``sent_at`` or more than
  ``MAX_INTERVAL_S`` before it (``since``), more GPUs than the host registered (``util``).
  Otherwise each allocated run holding GPUs of the host gets one ``PartSample``: the
  highest utilization among its GPUs there (None if one was not read) over ``[max(since,
  its placement), sent_at]``; its track (``allot.core.idle``) steps, and the answer is the
  ``HostUtilizationRecorded`` to log (each part with its idle evidence after this sample;
  None when the host runs no allocated work: nothing to judge, nothing logged) and the
  flag and clear records the steps caused.
* ``ended(now)`` every second or so: the clear record of each flagged run whose attempt no
  longer runs in the fold (``why`` ended), its track dropped.
* ``seed(recorded)`` at start, with the last ``HostUtilizationRecorded`` of each host, then
  ``adopt_open_flags()``: the tracks as they were when those records were written, and the
  stretches the log holds open flagged again. What ``judge`` does next is what it would
  have done without the restart, except across the restart's own silence (longer than
  ``max_gap_s``: the evidence starts again).

Unallocated work is never judged: it is free (charged to nobody) and runs only on idle GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec

from allot.core.errors import ValidationError
from allot.core.idle import (
    HostEvidence,
    IdleCleared,
    IdleFlag,
    IdlePolicy,
    IdleTrack,
    PartSample,
    RunEnded,
    step,
)
from allot.eventlog.host_work import CLOCK_SKEW_S
from allot.eventlog.idle_book import IdleBook
from allot.eventlog.logfold import LogFold, WorkloadRecord
from allot.proto import messages as m
from allot.proto.messages import LIVE_STATES

NOT_REGISTERED = "is not a registered host"
"""How a refused report of a host health has not registered (yet) ends: an agent starting
beside health meets it once (``allot.services.agent``)."""
MAX_REPORT_AGE_S = 300.0
"""A report sent longer ago than this is refused (``sent_at``): a replayed or stuck one."""
MAX_INTERVAL_S = 3600.0
"""Longest interval one report may average over (``since``)."""

RunKey = tuple[str, int]
"""(workload id, attempt)."""


@dataclass(frozen=True, slots=True)
class Judged:
    recorded: m.HostUtilizationRecorded | None
    flags: tuple[m.WorkloadFlaggedIdle | m.WorkloadIdleCleared, ...] = ()


class IdleWatch:
    """See the module docstring."""

    def __init__(self, policy: IdlePolicy) -> None:
        self.policy = policy
        self.fold = LogFold()
        self.book = IdleBook()
        self.tracks: dict[RunKey, IdleTrack] = {}

    def apply(self, record: msgspec.Struct) -> None:
        """One log record: HOSTS and WORKLOADS into the fold, idle records into the book.

        The watch may be fed WORKLOADS without submissions (``subjects.RUNS_FROM_PLACEMENTS``).
        The first record of a workload the fold has not seen, a
        placement or a cancel of pending work (nothing else of a workload comes first in
        a log), is preceded by a stand-in submission, so that the fold's rules (fencing,
        attempts, double booking, a cancel before the placement) apply as to the real one."""
        if isinstance(record, m.WorkloadFlaggedIdle | m.WorkloadIdleCleared):
            self.book.apply(record)
            return
        if (
            isinstance(record, m.WorkloadPlaced | m.CancelRequested)
            and record.workload_id not in self.fold.records
        ):
            self.fold.apply(stand_in(record))
        self.fold.apply(record)

    # -- reports --------------------------------------------------------------------------

    def judge(self, host: str, report: m.HostUtilization, now: float) -> Judged:
        """See the module docstring; raises ``ValidationError`` naming the field."""
        self._check(host, report, now)
        parts: list[m.PartUtilization] = []
        flags: list[m.WorkloadFlaggedIdle | m.WorkloadIdleCleared] = []
        for wid in sorted(self.fold.workload_on(host)):
            rec = self.fold.records.get(wid)
            if rec is None or rec.status not in LIVE_STATES or not rec.workload.allocated:
                continue
            gpus = next((g for h, g in rec.assignment if h == host), ())
            if not gpus:
                continue
            values = [report.util[g] if g < len(report.util) else None for g in gpus]
            util = (
                None if any(v is None for v in values) else max(v for v in values if v is not None)
            )
            start = max(report.since, rec.started_at or report.since)
            key = (wid, rec.attempt)
            track = self.tracks.get(key) or IdleTrack(
                hosts=tuple(sorted(h for h, _ in rec.assignment))
            )
            result = step(track, PartSample(host, start, report.sent_at, util), self.policy)
            self.tracks[key] = result.track
            if result.verdict is not None:
                flags.append(self._record(rec, result.verdict, now))
            evidence = result.track.evidence[result.track.hosts.index(host)]
            parts.append(
                m.PartUtilization(
                    workload_id=wid,
                    allocation=rec.workload.allocation or "",
                    attempt=rec.attempt,
                    gpus=gpus,
                    util_pct=util,
                    idle_since=evidence.idle_since if evidence is not None else None,
                    peak_pct=evidence.peak_pct if evidence is not None else 0.0,
                )
            )
        if not parts:
            return Judged(None, tuple(flags))
        recorded = m.HostUtilizationRecorded(
            host=host, since=report.since, until=report.sent_at, at=now, parts=tuple(parts)
        )
        return Judged(recorded, tuple(flags))

    def _check(self, host: str, report: m.HostUtilization, now: float) -> None:
        if host not in self.fold.state:
            raise ValidationError("host", f"{host!r} {NOT_REGISTERED}")
        if report.sent_at > now + CLOCK_SKEW_S:
            raise ValidationError(
                "sent_at",
                f"{report.sent_at:.3f} is {report.sent_at - now:.0f} s ahead of the clock "
                f"(at most {CLOCK_SKEW_S:g} s of clock skew)",
            )
        if report.sent_at < now - MAX_REPORT_AGE_S:
            raise ValidationError(
                "sent_at",
                f"{report.sent_at:.3f} is {now - report.sent_at:.0f} s old "
                f"(at most {MAX_REPORT_AGE_S:g} s)",
            )
        if report.since >= report.sent_at:
            raise ValidationError("since", "must be before sent_at (the interval measured)")
        if report.sent_at - report.since > MAX_INTERVAL_S:
            raise ValidationError(
                "since",
                f"the interval is {report.sent_at - report.since:.0f} s; at most "
                f"{MAX_INTERVAL_S:g} s",
            )
        registered = self.fold.state.host(host).gpus
        if len(report.util) > registered:
            raise ValidationError(
                "util", f"reports {len(report.util)} GPUs; {host} registered {registered}"
            )

    # -- ends, restarts -------------------------------------------------------------------

    def ended(self, now: float) -> list[m.WorkloadIdleCleared]:
        """Clear records of flagged runs no longer running; their tracks are dropped."""
        out: list[m.WorkloadIdleCleared] = []
        for key, track in list(self.tracks.items()):
            rec = self.fold.records.get(key[0])
            if rec is not None and rec.attempt == key[1] and rec.status in LIVE_STATES:
                continue
            result = step(track, RunEnded(now), self.policy)
            del self.tracks[key]
            if isinstance(result.verdict, IdleCleared) and rec is not None:
                cleared = self._record(rec, result.verdict, now, attempt=key[1])
                assert isinstance(cleared, m.WorkloadIdleCleared)
                out.append(cleared)
        return out

    def seed(self, recorded: m.HostUtilizationRecorded) -> None:
        """A host's last recorded report: its parts' evidence, for runs still running."""
        for part in recorded.parts:
            rec = self.fold.records.get(part.workload_id)
            if rec is None or rec.attempt != part.attempt or rec.status not in LIVE_STATES:
                continue
            key = (part.workload_id, part.attempt)
            track = self.tracks.get(key) or IdleTrack(
                hosts=tuple(sorted(h for h, _ in rec.assignment))
            )
            if recorded.host not in track.hosts:
                continue
            i = track.hosts.index(recorded.host)
            evidence = list(track.evidence)
            evidence[i] = HostEvidence(recorded.until, part.idle_since, part.peak_pct)
            self.tracks[key] = replace(track, evidence=tuple(evidence))

    def adopt_open_flags(self) -> None:
        """Every stretch the log holds open is flagged on its run's track (a track without
        evidence for a run that ended meanwhile: ``ended`` clears it)."""
        for s in self.book.open_stretches():
            key = (s.workload_id, s.attempt)
            rec = self.fold.records.get(s.workload_id)
            track = self.tracks.get(key)
            if track is None:
                hosts = tuple(sorted(h for h, _ in rec.assignment)) if rec is not None else ()
                track = IdleTrack(hosts=hosts)
            self.tracks[key] = replace(track, flagged_since=s.since, flagged_at=s.flagged_at)

    # -- answers --------------------------------------------------------------------------

    def snapshot(self, allocation: str | None, now: float) -> m.IdleSnapshot:
        rows = tuple(
            m.IdleRow(
                workload_id=s.workload_id,
                allocation=s.allocation,
                attempt=s.attempt,
                user=s.user,
                gpus=s.gpus,
                idle_since=s.since,
                flagged_at=s.flagged_at,
                peak_pct=s.peak_pct,
                reason=s.reason,
            )
            for s in self.book.open_stretches(allocation)
        )
        return m.IdleSnapshot(
            at=now,
            threshold_pct=self.policy.threshold_pct,
            window_s=self.policy.window_s,
            rows=rows,
        )

    def _record(
        self,
        rec: WorkloadRecord,
        verdict: IdleFlag | IdleCleared,
        now: float,
        attempt: int | None = None,
    ) -> m.WorkloadFlaggedIdle | m.WorkloadIdleCleared:
        w = rec.workload
        allocation = w.allocation or ""
        n = rec.attempt if attempt is None else attempt
        if isinstance(verdict, IdleFlag):
            return m.WorkloadFlaggedIdle(
                workload_id=w.id,
                allocation=allocation,
                attempt=n,
                user=w.user or None,  # None: a stand-in's (``stand_in``); the service asks the log
                gpus=w.gpus,
                at=verdict.at,
                idle_since=verdict.since,
                threshold_pct=self.policy.threshold_pct,
                window_s=self.policy.window_s,
                peak_pct=verdict.peak_pct,
                reason=verdict.reason[: m.MAX_TEXT_LEN],
                preempt=verdict.preempt,
                recorded_at=now,
            )
        return m.WorkloadIdleCleared(
            workload_id=w.id,
            allocation=allocation,
            attempt=n,
            gpus=w.gpus,
            at=now,
            idle_since=verdict.since,
            until=verdict.until,
            why=verdict.why,
            idle_gpu_seconds=w.gpus * (verdict.until - verdict.since),
        )


def stand_in(record: m.WorkloadPlaced | m.CancelRequested) -> m.WorkloadSubmitted:
    """The submission a record of a workload not read yet implies: its allocation, and a
    placement's GPUs and minimum runtime (whether it is allocated); no user (empty: a flag
    of the run names none until the service reads it from the log)."""
    return m.WorkloadSubmitted(
        workload_id=record.workload_id,
        client_id=record.workload_id,
        user="",
        gpus=record.gpus if isinstance(record, m.WorkloadPlaced) else 1,
        allocation=record.allocation,
        min_runtime_s=record.min_runtime_s if isinstance(record, m.WorkloadPlaced) else 0,
        at=record.at,
    )


def msg_id(record: m.WorkloadFlaggedIdle | m.WorkloadIdleCleared) -> str:
    """A record's ``Nats-Msg-Id``: one flag and one clear per stretch."""
    kind = "idle" if isinstance(record, m.WorkloadFlaggedIdle) else "idle-cleared"
    return f"{kind}:{record.workload_id}:{record.attempt}:{record.idle_since!r}"


__all__ = ["MAX_INTERVAL_S", "MAX_REPORT_AGE_S", "IdleWatch", "Judged", "msg_id", "stand_in"]
