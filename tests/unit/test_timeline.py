"""The live timeline: what it keeps from the log, that owed/delivered is the simulator's own
computation (parity with ``build_report`` on a hand-built ``SimRecord``), and invariants
over random logs (hypothesis)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allot.core.errors import ValidationError
from allot.eventlog.owed_query import owed_snapshot
from allot.eventlog.timeline import LogTimeline
from allot.proto import messages as m
from allot.sim.record import CapacityChange, Segment, SimRecord, Waiting
from allot.sim.report import build_report

T0 = 1_800_000_000.0
NOW = T0 + 3600
SHARES = {"nlp": 0.25, "vision": 0.25, "ops": 0.5}

# -- builders ------------------------------------------------------------------------------------


def tree() -> m.BudgetTreeSet:
    """research (nlp, vision) and ops, equal shares at each level."""
    spec = m.BudgetNodeSpec(
        name="root",
        children=(
            m.BudgetNodeSpec(
                name="research",
                children=(m.BudgetNodeSpec(name="nlp"), m.BudgetNodeSpec(name="vision")),
            ),
            m.BudgetNodeSpec(name="ops"),
        ),
    )
    return m.BudgetTreeSet(at=T0, by="admin", tree=spec)


def submitted(
    wid: str, at: float, gpus: int = 4, alloc: str | None = "nlp", runtime: int = 600
) -> m.WorkloadSubmitted:
    return m.WorkloadSubmitted(
        workload_id=wid,
        client_id=wid,
        user="ann",
        gpus=gpus,
        allocation=alloc,
        min_runtime_s=runtime,
        at=at,
    )


def placed(
    wid: str, at: float, host: str, gpus: tuple[int, ...], *, attempt: int = 1, epoch: int = 1
) -> m.WorkloadPlaced:
    return m.WorkloadPlaced(
        workload_id=wid,
        at=at,
        gpus=len(gpus),
        assignment=(m.HostGpus(host=host, gpus=gpus),),
        attempt=attempt,
        epoch=epoch,
    )


def notice(wid: str, at: float, preemptor: str, attempt: int = 1) -> m.PreemptionNotice:
    return m.PreemptionNotice(
        workload_id=wid,
        at=at,
        reason="reclaimed-for-entitlement",
        grace_deadline=at + 300,
        requeue=True,
        gpus=4,
        preemptor=preemptor,
        victim_held_gpus=4,
        victim_entitlement_gpus=4.0,
        attempt=attempt,
        epoch=1,
    )


def crafted_log() -> list[msgspec.Struct]:
    """Two 8-GPU hosts. w1 (nlp, 4 GPUs) runs, is noticed for w2 (vision, 8 GPUs), leaves,
    is requeued and placed again on h2, which drains for a while; w1 completes; w2 is still
    running at NOW. Noise the fold ignores: a stale-epoch placement, a duplicate
    submission, a late report of w1's first attempt."""
    return [
        tree(),
        m.HostRegistered(host="h1", gpus=8, at=T0),
        m.HostRegistered(host="h2", gpus=8, at=T0),
        m.LeaderElected(epoch=1, leader="p1", at=T0),
        submitted("w1", T0),
        placed("w1", T0 + 100, "h1", (0, 1, 2, 3)),
        m.WorkloadStarted(workload_id="w1", at=T0 + 101, host="h1", pid=42, attempt=1),
        submitted("w2", T0 + 200, gpus=8, alloc="vision"),
        placed("w2", T0 + 250, "h2", tuple(range(8)), epoch=0),  # stale: ignored
        submitted("w2", T0 + 260, gpus=8, alloc="vision"),  # duplicate: ignored
        notice("w1", T0 + 1000, preemptor="w2"),
        m.WorkloadPreempted(
            workload_id="w1", at=T0 + 1200, reason="reclaimed-for-entitlement", attempt=1
        ),
        m.WorkloadCompleted(workload_id="w1", at=T0 + 1250, attempt=1),  # old attempt
        placed("w2", T0 + 1300, "h1", tuple(range(8))),
        placed("w1", T0 + 1500, "h2", (0, 1, 2, 3), attempt=2),
        m.HostDraining(host="h2", at=T0 + 2000, reason="xid 79"),
        m.WorkloadCompleted(workload_id="w1", at=T0 + 2500, attempt=2),
        m.HostHealthy(host="h2", at=T0 + 3000),
    ]


def timeline(
    records: list[msgspec.Struct] | None = None, horizon_s: float = 8 * 86400.0
) -> LogTimeline:
    tl = LogTimeline(horizon_s=horizon_s)
    for record in crafted_log() if records is None else records:
        tl.apply(record)
    return tl


# -- what the timeline keeps ---------------------------------------------------------------------


def _kinds(tl: LogTimeline, wid: str) -> list[tuple[float, str, int]]:
    return [(e.at - T0, e.kind, e.attempt) for e in tl.events(wid)]


def _segments(tl: LogTimeline) -> list[tuple[str, bool, int, float, float]]:
    rec = tl.sim_record(NOW, 3600)
    return [(s.workload_id, s.allocated, s.gpus, s.start - T0, s.end - T0) for s in rec.segments]


def _waits(tl: LogTimeline) -> list[tuple[str, float, float]]:
    rec = tl.sim_record(NOW, 3600)
    return [(w.workload_id, w.start - T0, w.end - T0) for w in rec.waits]


def _capacity(tl: LogTimeline) -> list[tuple[float, int]]:
    return [(c.time - T0, c.healthy_gpus) for c in tl.sim_record(NOW, 3600).capacity]


CASES: list[tuple[str, Callable[[LogTimeline], object], object]] = [
    (
        "w1: submitted, placed, protected, notice, preempted, requeued, placed again, done",
        lambda tl: _kinds(tl, "w1"),
        [
            (0, "submitted", 0),
            (100, "placed", 1),
            (700, "protected-until", 1),
            (101, "started", 1),
            (1000, "notice", 1),
            (1200, "preempted", 1),
            (1200, "requeued", 1),
            (1500, "placed", 2),
            (2100, "protected-until", 2),
            (2500, "completed", 2),
        ],
    ),
    (
        "the stale placement and the duplicate leave no trace on w2",
        lambda tl: _kinds(tl, "w2"),
        [(200, "submitted", 0), (1300, "placed", 1), (1900, "protected-until", 1)],
    ),
    (
        "the notice carries its reason, preemptor and deadline",
        lambda tl: {
            k: tl.events("w1")[4].detail[k] for k in ("reason", "preemptor", "grace_deadline")
        },
        {"reason": "reclaimed-for-entitlement", "preemptor": "w2", "grace_deadline": T0 + 1300},
    ),
    (
        "the preempted event names who took the GPUs",
        lambda tl: tl.events("w1")[5].detail["preemptor"],
        "w2",
    ),
    (
        "placed names its hosts",
        lambda tl: [e.detail["hosts"] for e in tl.events("w1") if e.kind == "placed"],
        [["h1"], ["h2"]],
    ),
    (
        "segments: one per attempt, the running one ends at now",
        _segments,
        [("w1", True, 4, 100, 1200), ("w1", True, 4, 1500, 2500), ("w2", True, 8, 1300, 3600)],
    ),
    (
        "waits: from submission and from the requeue to each placement",
        _waits,
        [("w1", 0, 100), ("w2", 200, 1300), ("w1", 1200, 1500)],
    ),
    (
        "capacity: the value at the window start, then the drain and its end",
        _capacity,
        [(0, 16), (2000, 8), (3000, 16)],
    ),
    ("notices by reason", LogTimeline.preemptions_by_reason, {"reclaimed-for-entitlement": 1}),
    ("GPU-seconds of the preempted attempt", LogTimeline.preempted_gpu_seconds, 4 * 1100.0),
    ("queue waits, in log order", LogTimeline.queue_waits, [100.0, 1100.0, 300.0]),
    ("requeues in the window", lambda tl: tl.sim_record(NOW, 3600).requeues, 1),
    (
        "jobs: both workloads, w1 completed, w2 running",
        lambda tl: [(j.workload_id, j.state, j.first_start) for j in tl.sim_record(NOW, 3600).jobs],
        [("w1", "completed", T0 + 100), ("w2", "running", T0 + 1300)],
    ),
    (
        "shares and programs come from the fold's tree",
        lambda tl: (tl.sim_record(NOW, 3600).effective_shares, tl.sim_record(NOW, 3600).programs),
        (SHARES, {"nlp": "research", "vision": "research", "ops": "ops"}),
    ),
    (
        "host events",
        lambda tl: [e.kind for e in tl.host_events("h2")],
        ["registered", "draining", "healthy"],
    ),
    ("an unknown workload has no events", lambda tl: tl.events("nobody"), []),
]


@pytest.mark.parametrize(("what", "query", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_timeline_keeps(
    what: str, query: Callable[[LogTimeline], object], expected: object
) -> None:
    assert query(timeline()) == expected, what


def test_ignored_records_are_ignored_by_the_timeline_too() -> None:
    tl = timeline()
    assert tl.fold.ignored == 3
    assert tl.placements == 3  # the stale placement is not one


def test_cancel_of_pending_work_closes_its_wait_and_of_running_work_waits_for_the_agent() -> None:
    records = [
        *crafted_log()[:5],
        submitted("w3", T0 + 10, gpus=2),
        m.CancelRequested(workload_id="w3", by="ann", at=T0 + 40),
        placed("w1", T0 + 100, "h1", (0, 1, 2, 3)),
        m.CancelRequested(workload_id="w1", by="ann", at=T0 + 200),
        m.WorkloadCancelled(workload_id="w1", at=T0 + 210, attempt=1),
    ]
    tl = timeline(records)
    assert _kinds(tl, "w3") == [(10, "submitted", 0), (40, "cancelled", 0)]
    assert [k for _, k, _ in _kinds(tl, "w1")][-2:] == ["cancel-requested", "cancelled"]
    assert ("w3", 10, 40) in _waits(tl)
    assert ("w1", True, 4, 100, 210) in _segments(tl)


def test_unallocated_work_is_a_segment_but_never_owed() -> None:
    records = [
        *crafted_log()[:4],
        submitted("free", T0, gpus=8, alloc=None, runtime=0),
        placed("free", T0 + 60, "h1", tuple(range(8))),
    ]
    tl = timeline(records)
    assert _segments(tl) == [("free", False, 8, 60, 3600)]
    assert [e.kind for e in tl.events("free")] == ["submitted", "placed"]  # never protected
    owed = tl.owed(NOW, 3600)
    assert owed["overall"] is None
    assert all(row["owed_gpu_h"] == 0.0 for row in owed["by_allocation"].values())


# -- parity with the simulator's report ----------------------------------------------------------


def _hand_built(since: float) -> SimRecord:
    """The crafted log's window ``[since, NOW]``, written by hand as the engine would."""

    def clip(a: float, b: float) -> tuple[float, float]:
        return max(a, since), min(b, NOW)

    return SimRecord(
        policy="hand",
        seed=7,
        first_submit=since,
        last_submit=NOW,
        end_time=NOW,
        segments=[
            Segment("w1", "nlp", True, 4, *clip(T0 + 100, T0 + 1200)),
            Segment("w1", "nlp", True, 4, *clip(T0 + 1500, T0 + 2500)),
            Segment("w2", "vision", True, 8, *clip(T0 + 1300, NOW)),
        ],
        waits=[
            Waiting("w2", "vision", True, 8, *clip(T0 + 200, T0 + 1300)),
            Waiting("w1", "nlp", True, 4, *clip(T0 + 1200, T0 + 1500)),
        ],
        capacity=[
            CapacityChange(since, 16),
            CapacityChange(T0 + 2000, 8),
            CapacityChange(T0 + 3000, 16),
        ],
        effective_shares=dict(SHARES),
        programs={"nlp": "research", "vision": "research", "ops": "ops"},
    )


@pytest.mark.parametrize("bucket_s", [3600, 600, 7])
def test_owed_is_what_build_report_computes_on_the_same_record(bucket_s: int) -> None:
    since = T0 + 600
    live = timeline().owed(NOW, NOW - since, bucket_s)
    assert live == build_report(_hand_built(since), bucket_s)["owed_delivered"]


def test_owed_numbers_worked_by_hand() -> None:
    """One hour bucket over [T0+600, T0+3600]: healthy GPU-s = 16x1400 + 8x1000 + 16x600
    = 40000. nlp: share 0.25 -> 10000; ran 4x600 + 4x1000 = 6400, waited 4x300 = 1200:
    owed min(10000, 7600) = 7600, delivered 6400. vision: ran 8x2300 = 18400, waited 8x700:
    owed 10000 (its share), delivered 10000. ops: nothing asked, nothing owed."""
    owed = timeline().owed(NOW, 3000)
    by = owed["by_allocation"]
    assert by["nlp"] == {
        "owed_gpu_h": round(7600 / 3600, 6),
        "delivered_gpu_h": round(6400 / 3600, 6),
        "ratio": round(6400 / 7600, 6),
    }
    assert by["vision"]["owed_gpu_h"] == round(10000 / 3600, 6)
    assert by["vision"]["ratio"] == 1.0
    assert by["ops"] == {"owed_gpu_h": 0.0, "delivered_gpu_h": 0.0, "ratio": None}
    assert owed["overall"] == round(16400 / 17600, 6)
    assert owed["by_program"]["research"]["ratio"] == owed["overall"]


def test_owed_snapshot_rows_carry_the_report_numbers_and_the_budget() -> None:
    snap = owed_snapshot(timeline(), m.OwedQuery(window_s=3000.0, bucket_s=3600), NOW)
    assert [(r.allocation, r.effective_share) for r in snap.rows] == [
        ("nlp", 0.25),
        ("ops", 0.5),
        ("vision", 0.25),
    ]
    nlp = snap.rows[0]
    assert (nlp.owed_gpu_h, nlp.delivered_gpu_h, nlp.ratio) == (
        round(7600 / 3600, 6),
        round(6400 / 3600, 6),
        round(6400 / 7600, 6),
    )
    assert (snap.at, snap.since, snap.window_s, snap.bucket_s) == (NOW, NOW - 3000, 3000.0, 3600)
    assert snap.overall == round(16400 / 17600, 6)
    # It is a valid wire message: it survives an encode/decode with every constraint checked.
    assert msgspec.json.decode(msgspec.json.encode(snap), type=m.OwedSnapshot) == snap


def test_held_series_means_per_bucket_and_entitlement() -> None:
    starts, held, entitled = timeline().held_series(NOW, 3600, 1800)
    assert starts == [T0, T0 + 1800]
    # nlp held 4 GPUs over [100,1200) and [1500,1800): 4x1400 / 1800; then [1800,2500).
    assert held["nlp"] == pytest.approx([4 * 1400 / 1800, 4 * 700 / 1800])
    assert held["vision"] == pytest.approx([8 * 500 / 1800, 8.0])
    assert held["ops"] == [0.0, 0.0]
    # healthy: 16 until 2000, 8 until 3000, then 16: second bucket 16x200 + 8x1000 + 16x600.
    assert entitled["ops"] == pytest.approx([8.0, 0.5 * (16 * 200 + 8 * 1000 + 16 * 600) / 1800])


def test_held_series_of_a_log_younger_than_the_window_starts_at_its_first_record() -> None:
    """A week asked of an hour-old log: buckets from the first record (T0), not 7 days of
    empty ones; the last, partial bucket is a mean over its own length."""
    tl = timeline()
    assert tl.first == T0
    starts, held, _ = tl.held_series(NOW, 7 * 86400, 2400)
    assert starts == [T0, T0 + 2400]
    # vision held 8 GPUs over [1300, 3600): 8 x 1100 / 2400, then 8 over the last 1200 s.
    assert held["vision"] == pytest.approx([8 * 1100 / 2400, 8.0])


# -- memory and bad queries ----------------------------------------------------------------------


def test_history_older_than_the_horizon_is_dropped_but_counters_stay() -> None:
    tl = timeline(horizon_s=1000.0)
    later = T0 + 10_000
    tl.apply(m.HostDraining(host="h1", at=later))  # the newest record moves the cutoff
    assert tl.events("w1") == []  # w1 ended at T0+2500, long before later - 1000
    assert [e.kind for e in tl.events("w2")] == []  # still running: only old events dropped
    assert tl.preemptions_by_reason() == {"reclaimed-for-entitlement": 1}
    assert tl.preempted_gpu_seconds() == 4400.0
    assert tl.queue_waits() == [] and tl.placements == 3
    rec = tl.sim_record(later, 1000)
    assert [(s.workload_id, s.start, s.end) for s in rec.segments] == [("w2", later - 1000, later)]
    assert [(c.time, c.healthy_gpus) for c in rec.capacity] == [(later - 1000, 16), (later, 8)]


def _steady_log(days: float, n: int) -> list[msgspec.Struct]:
    """``n`` 1-GPU workloads spread over ``days`` on ``crafted_log``'s two hosts, each
    waiting 5 s and running 20 min (a GPU is reused only after its last user ended)."""
    out = crafted_log()[:4]
    step = days * 86400 / n
    for i in range(n):
        t, wid = T0 + i * step, f"s{i}"
        out.append(submitted(wid, t, gpus=1, alloc=("nlp", "vision", "ops")[i % 3]))
        out.append(placed(wid, t + 5, f"h{1 + i % 2}", ((i // 2) % 8,)))
        out.append(m.WorkloadCompleted(workload_id=wid, at=t + 5 + 1200, attempt=1))
    return out


def test_pruning_never_changes_an_answer_inside_the_horizon() -> None:
    log = _steady_log(days=3, n=1200)  # one submission every 216 s
    short, long = timeline(log, horizon_s=86400.0), timeline(log, horizon_s=10 * 86400.0)
    now = short.newest  # what a reader's clock says: at or after the newest record
    assert short.sim_record(now, 86400) == long.sim_record(now, 86400)
    assert short.owed(now, 86400, 600) == long.owed(now, 86400, 600)
    assert short.held_series(now, 86400) == long.held_series(now, 86400)
    assert short.events("s1199") == long.events("s1199") != []
    assert short.events("s0") == [] and long.events("s0") != []
    with pytest.raises(ValidationError, match="before the history kept"):
        short.owed(now - 3600, 86400)  # would need what was dropped
    assert long.owed(now - 3600, 86400)["overall"] is not None


def test_queue_waits_since_feeds_a_histogram_incrementally() -> None:
    tl = timeline()
    assert tl.queue_waits_since(0) == [100.0, 1100.0, 300.0]
    assert tl.queue_waits_since(2) == [300.0]
    assert tl.queue_waits_since(3) == []
    pruned = timeline(horizon_s=1750.0)  # the wait of the first placement (at +100) is gone
    assert (pruned.placements, pruned.queue_waits()) == (3, [1100.0, 300.0])
    assert pruned.queue_waits_since(0) == [1100.0, 300.0]


@pytest.mark.parametrize(
    ("window_s", "reason"),
    [
        (0.0, "must be a positive number"),
        (-5.0, "must be a positive number"),
        (math.nan, "must be a positive number"),
        (9 * 86400.0, "longer than the history kept"),
    ],
    ids=["zero", "negative", "nan", "past-the-horizon"],
)
def test_a_bad_window_is_refused_naming_the_field(window_s: float, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason) as info:
        timeline().owed(NOW, window_s)
    assert info.value.field == "window_s"


def test_a_bad_horizon_is_refused() -> None:
    with pytest.raises(ValidationError, match="horizon_s"):
        LogTimeline(horizon_s=0)


# -- invariants over random logs -----------------------------------------------------------------

ALLOCS: tuple[str | None, ...] = ("nlp", "vision", "ops", None)
HOST_GPUS = {"h1": 8, "h2": 8}


@dataclass
class _Driver:
    """A toy leader and agents that write a valid log (plus noise the fold must ignore) and
    keep their own account of GPU-seconds to compare with the timeline's."""

    tl: LogTimeline = field(default_factory=LogTimeline)
    now: float = T0
    pending: list[str] = field(default_factory=list)
    running: dict[str, tuple[float, int, int, str, tuple[int, ...]]] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)
    free: dict[str, set[int]] = field(
        default_factory=lambda: {h: set(range(n)) for h, n in HOST_GPUS.items()}
    )
    gpu_seconds: float = 0.0
    n: int = 0

    def start(self) -> None:
        for record in crafted_log()[:4]:
            self.tl.apply(record)

    def step(self, op: int, pick: int, size: int, dt: float) -> None:
        self.now += dt
        at = self.now
        if op == 0 or not (self.pending or self.running):
            wid = f"w{self.n}"
            self.n += 1
            alloc = ALLOCS[pick % len(ALLOCS)]
            runtime = 0 if alloc is None or size % 3 == 0 else 600
            assert self.tl.apply(
                submitted(wid, at, gpus=size, alloc=alloc, runtime=runtime)
            ).changed
            self.pending.append(wid)
            self.gpus[wid] = size
        elif op == 1 and self.pending:
            wid = self.pending[pick % len(self.pending)]
            for host, free in self.free.items():
                if len(free) >= self.gpus[wid]:
                    taken = tuple(sorted(free)[: self.gpus[wid]])
                    attempt = self.attempts.get(wid, 0) + 1
                    # The same decision from a fenced-off leader first: ignored.
                    assert not self.tl.apply(
                        placed(wid, at, host, taken, attempt=attempt, epoch=0)
                    ).changed
                    assert self.tl.apply(placed(wid, at, host, taken, attempt=attempt)).changed
                    free.difference_update(taken)
                    self.attempts[wid] = attempt
                    self.pending.remove(wid)
                    self.running[wid] = (at, self.gpus[wid], attempt, host, taken)
                    break
        elif op in (2, 3, 4) and self.running:
            wid = sorted(self.running)[pick % len(self.running)]
            start, gpus, attempt, host, taken = self.running.pop(wid)
            self.gpu_seconds += gpus * (at - start)
            self.free[host].update(taken)
            end: msgspec.Struct
            if op == 2:
                end = m.WorkloadCompleted(workload_id=wid, at=at, attempt=attempt)
            elif op == 3:
                end = m.WorkloadFailed(workload_id=wid, at=at, attempt=attempt)
            else:
                end = m.WorkloadPreempted(
                    workload_id=wid, at=at, reason="better-ranked", attempt=attempt
                )
                self.pending.append(wid)  # resumable: the fold requeues it
            assert self.tl.apply(end).changed
        elif op == 5:
            host = sorted(HOST_GPUS)[pick % 2]
            record = (
                m.HostDraining(host=host, at=at) if size % 2 else m.HostHealthy(host=host, at=at)
            )
            self.tl.apply(record)

    def gpu_seconds_at_end(self) -> float:
        return self.gpu_seconds + sum(g * (self.now - s) for s, g, *_ in self.running.values())


STEPS = st.lists(
    st.tuples(
        st.integers(0, 5),
        st.integers(0, 100),
        st.integers(1, 4),
        st.floats(0.0, 900.0, allow_nan=False),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(steps=STEPS, bucket_s=st.sampled_from([60, 600, 3600]))
def test_invariants_over_random_logs(
    steps: list[tuple[int, int, int, float]], bucket_s: int
) -> None:
    d = _Driver()
    d.start()
    for step in steps:
        d.step(*step)
    window = max(1.0, d.now - T0 + 1.0)
    rec = d.tl.sim_record(d.now, window)
    # Every GPU-second the agents ran is in exactly one segment.
    seg_gpu_s = sum(s.gpus * (s.end - s.start) for s in rec.segments)
    assert seg_gpu_s == pytest.approx(d.gpu_seconds_at_end(), abs=1e-6)
    assert d.tl.placements == sum(1 for e in _all_events(d) if e.kind == "placed")
    owed: dict[str, Any] = d.tl.owed(d.now, window, bucket_s)
    capacity_gpu_h = build_report(rec, bucket_s)["timeseries"]["capacity_gpu_h"]
    for name, row in owed["by_allocation"].items():
        assert row["delivered_gpu_h"] <= row["owed_gpu_h"] + 1e-6, name
        assert row["ratio"] is None or 0.0 <= row["ratio"] <= 1.0
        # Owed never exceeds the allocation's share of the healthy capacity.
        assert row["owed_gpu_h"] <= SHARES[name] * sum(capacity_gpu_h) + 1e-5, name
    assert owed["overall"] is None or 0.0 <= owed["overall"] <= 1.0


def _all_events(d: _Driver) -> list[Any]:
    return [e for wid in d.gpus for e in d.tl.events(wid)]
