"""/metrics: rendered from crafted inputs and parsed back with Prometheus's own parser.

The cluster every test starts from (``full_inputs``), built by applying log records to a real
``LogFold``:

* budget tree nlp 2 shares, vision 1, audio 1 -> effective 0.5 / 0.25 / 0.25;
* hosts h1 (8 GPUs, healthy), h2 (8, draining), h3 (4, drained), h4 (2, cordoned):
  8 healthy GPUs -> entitlements nlp 4, vision 2, audio 2;
* running: r1 (nlp, 4 GPUs, allocated) and r2 (no allocation, 2 GPUs);
* pending: p1 (nlp, 8), p2 (vision, 2), p3 (no allocation, 1) with rows in the queue
  snapshot, p4 (vision, 4) submitted after it; the snapshot also still lists ``gone``,
  which the fold has already placed elsewhere (cancelled): it must not be counted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from allot.core.budgets import parse_tree
from allot.core.errors import ValidationError
from allot.core.model import HostState
from allot.eventlog.budget_wire import spec_from_tree
from allot.eventlog.idle_book import IdleBook
from allot.eventlog.logfold import LogFold
from allot.eventlog.timeline import LogTimeline
from allot.proto import messages as m
from allot.services.dashboard.metrics import (
    CONTENT_TYPE,
    NO_ALLOCATION,
    PREEMPT_REASONS,
    QUEUE_WAIT_BUCKETS_S,
    UNKNOWN_REASON,
    MetricsInputs,
    QueueWaitHistogram,
    render_metrics,
)

T = 1_700_000_000.0
DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
WORKLOAD_IDS = {"r1", "r2", "p1", "p2", "p3", "p4", "gone"}
USERS = {"alice", "bob"}
ALLOWED_LABELS = {"allocation", "reason", "state", "le"}
WEEK = 7 * 86400.0


@dataclass(frozen=True)
class RecordedTimeline:
    """A timeline whose history answers are given (what the metrics read of ``LogTimeline``);
    ``waits`` are the placements' waits, all still in the timeline."""

    fold: LogFold
    notices: dict[str, int] = field(default_factory=dict)
    lost_gpu_s: float = 0.0
    waits: list[float] = field(default_factory=list)

    def preemptions_by_reason(self) -> dict[str, int]:
        return dict(self.notices)

    def preempted_gpu_seconds(self) -> float:
        return self.lost_gpu_s

    def lost_gpu_seconds_total(self) -> dict[str, float]:
        return {"nlp": self.lost_gpu_s / 2} if self.lost_gpu_s else {}

    @property
    def placements(self) -> int:
        return len(self.waits)

    def queue_waits_since(self, seen: int) -> list[float]:
        return list(self.waits[seen:])


# ---------------------------------------------------------------------------- builders
def submitted(
    wid: str, gpus: int, alloc: str | None, runtime: int = 600, user: str = "alice"
) -> m.WorkloadSubmitted:
    return m.WorkloadSubmitted(
        workload_id=wid,
        client_id=wid,
        user=user,
        gpus=gpus,
        allocation=alloc,
        min_runtime_s=runtime,
        at=T,
    )


def placed(wid: str, alloc: str | None, host: str, gpus: tuple[int, ...]) -> m.WorkloadPlaced:
    return m.WorkloadPlaced(
        workload_id=wid,
        allocation=alloc,
        at=T + 10,
        gpus=len(gpus),
        assignment=(m.HostGpus(host=host, gpus=gpus),),
        epoch=1,
    )


def cluster_fold() -> LogFold:
    f = LogFold()
    tree = parse_tree(
        {
            "name": "root",
            "children": [
                {"name": "nlp", "shares": 2},
                {"name": "vision", "shares": 1},
                {"name": "audio", "shares": 1},
            ],
        }
    )
    records: list[m.WorkloadSubmitted | m.WorkloadPlaced | m.CancelRequested] = [
        submitted("r1", 4, "nlp"),
        submitted("r2", 2, None, runtime=0, user="bob"),
        submitted("p1", 8, "nlp"),
        submitted("p2", 2, "vision", user="bob"),
        submitted("p3", 1, None, runtime=0),
        submitted("p4", 4, "vision"),
        submitted("gone", 1, "audio"),
        placed("r1", "nlp", "h1", (0, 1, 2, 3)),
        placed("r2", None, "h1", (4, 5)),
        m.CancelRequested(workload_id="gone", by="alice", at=T + 20),
    ]
    setup = [
        m.BudgetTreeSet(at=T, by="admin", tree=spec_from_tree(tree)),
        m.HostRegistered(host="h1", gpus=8, at=T),
        m.HostRegistered(host="h2", gpus=8, at=T),
        m.HostRegistered(host="h3", gpus=4, at=T),
        m.HostRegistered(host="h4", gpus=2, at=T),
        m.HostDraining(host="h2", at=T),
        m.HostDraining(host="h3", at=T),
        m.HostDrained(host="h3", at=T),
        m.LeaderElected(epoch=1, leader="p1", at=T),
    ]
    for record in [*setup, *records]:
        assert f.apply(record).changed, record
    # No log record cordons a host yet; the fold's state is what the metrics read.
    f.state.set_host_state("h4", HostState.CORDONED)
    return f


def queue_row(
    wid: str, alloc: str | None, gpus: int, tier: str, *, sort_metric: float, reason: str
) -> m.QueueRow:
    return m.QueueRow(
        position=1,
        workload_id=wid,
        allocation=alloc,
        user="alice",
        gpus=gpus,
        kind="training",
        tier=tier,  # type: ignore[arg-type]
        sort_metric=sort_metric,
        submitted_at=T,
        reason=reason,
    )


QUEUE = m.QueueSnapshot(
    at=T + 30,
    rows=(
        queue_row("p1", "nlp", 8, "over-entitlement", sort_metric=1.4, reason="over-entitlement"),
        queue_row(
            "p2", "vision", 2, "under-entitlement", sort_metric=0.8, reason="protected-until"
        ),
        queue_row("p3", None, 1, "unallocated", sort_metric=2.0, reason="unallocated-idle-only"),
        queue_row(
            "gone", "audio", 1, "under-entitlement", sort_metric=0.05, reason="better-ranked-first"
        ),
    ),
    total=4,
)


def rank_row(name: str, leaf: bool, usage: float, fs: float | None, rank: int | None) -> m.RankRow:
    return m.RankRow(
        path=name if not leaf else f"root/{name}",
        name=name,
        leaf=leaf,
        raw_shares=1,
        norm_shares=0.25,
        raw_usage=usage,
        effective_usage=0.1,
        level_fs=1.0,
        rank=rank,
        fairshare=fs,
    )


RANKING = m.RankingUpdated(
    at=T + 40,
    window_s=WEEK,
    nodes=(
        rank_row("root", False, 50_400.0, None, None),
        rank_row("nlp", True, 14_400.0, 0.6, 2),
        rank_row("vision", True, 36_000.0, 0.2, 3),
        rank_row("audio", True, 0.0, 0.9, 1),
    ),
)

STATS = m.PlacementStats(
    at=T + 50,
    epoch=1,
    cycles=10,
    buckets_s=(0.001, 0.01, 0.1),
    counts=(2, 5, 9, 10),
    sum_s=0.8,
    count=10,
    decide_s=0.125,
    append_wait_s=0.5,
)

WAITS = [0.5, 1.0, 30.0, 3600.0, 90_000.0]


def full_inputs(**changes: object) -> MetricsInputs:
    """Every input present: every metric family is exported."""
    timeline = RecordedTimeline(
        cluster_fold(),
        notices={"better-ranked": 3, "host-drain": 1},
        lost_gpu_s=1234.5,
        waits=WAITS,
    )
    inputs = MetricsInputs(
        timeline=timeline,
        now=T + 100,
        queue=QUEUE,
        ranking=RANKING,
        placement_stats=STATS,
        idle=idle_book(),
    )
    return replace(inputs, **changes)  # type: ignore[arg-type]


def idle_book() -> IdleBook:
    """nlp: a 2-GPU run idle from T-1000, flagged at T-100 and cleared at T (2,000 GPU-s),
    and a 4-GPU run flagged idle since T-50, still open."""
    book = IdleBook()

    def flagged(wid: str, gpus: int, since: float, at: float) -> m.WorkloadFlaggedIdle:
        return m.WorkloadFlaggedIdle(
            workload_id=wid,
            allocation="nlp",
            gpus=gpus,
            at=at,
            idle_since=since,
            threshold_pct=5.0,
            window_s=60.0,
        )

    book.apply(flagged("w1", 2, T - 1000, T - 100))
    book.apply(
        m.WorkloadIdleCleared(
            workload_id="w1",
            allocation="nlp",
            gpus=2,
            at=T,
            idle_since=T - 1000,
            until=T,
            why="busy",
            idle_gpu_seconds=2000.0,
        )
    )
    book.apply(flagged("w2", 4, T - 50, T - 10))
    return book


# ---------------------------------------------------------------------------- reading back
@dataclass(frozen=True)
class Scrape:
    types: dict[str, str]  # family -> type
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def value(self, name: str, **labels: str) -> float:
        return self.samples[(name, frozenset(labels.items()))]

    def by(self, name: str, label: str) -> dict[str, float]:
        return {dict(k)[label]: v for (n, k), v in self.samples.items() if n == name}

    def names(self) -> set[str]:
        return {n for n, _ in self.samples}


def scrape(inputs: MetricsInputs) -> Scrape:
    text = render_metrics(inputs).decode()
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in types, f"{family.name} twice"
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return Scrape(types, samples)


def exported_series(inputs: MetricsInputs | None = None) -> set[str]:
    """Every series name PromQL can select (``_total``, ``_bucket``, ``_sum``, ``_count``)."""
    return scrape(inputs or full_inputs()).names()


def exported_families() -> dict[str, str]:
    """Family name as PromQL names it (counters with ``_total``) -> Prometheus type."""
    types = scrape(full_inputs()).types
    return {(f"{n}_total" if t == "counter" else n): t for n, t in types.items()}


# ---------------------------------------------------------------------------- now
def test_held_entitlement_and_budget_come_from_the_fold_without_a_leader_answer() -> None:
    s = scrape(full_inputs())
    assert s.by("allot_allocation_held_gpus", "allocation") == {
        "nlp": 4.0,
        "vision": 0.0,
        "audio": 0.0,
    }
    # effective share x 8 healthy GPUs (h2 draining, h3 drained, h4 cordoned do not count)
    assert s.by("allot_allocation_entitlement_gpus", "allocation") == {
        "nlp": 4.0,
        "vision": 2.0,
        "audio": 2.0,
    }
    assert s.by("allot_allocation_budget_ratio", "allocation") == {
        "nlp": 0.5,
        "vision": 0.25,
        "audio": 0.25,
    }


def test_the_leaders_allocations_snapshot_is_the_source_when_given() -> None:
    answer = m.AllocationsSnapshot(
        at=T + 60,
        healthy_gpus=16,
        total_gpus=22,
        rows=(
            m.AllocationRow(
                allocation="nlp", effective_share=0.7, entitlement_gpus=11.2, held_gpus=9
            ),
            m.AllocationRow(allocation="vision", effective_share=0.3, entitlement_gpus=4.8),
        ),
    )
    s = scrape(full_inputs(allocations=answer))
    assert s.by("allot_allocation_held_gpus", "allocation") == {"nlp": 9.0, "vision": 0.0}
    assert s.by("allot_allocation_entitlement_gpus", "allocation") == {"nlp": 11.2, "vision": 4.8}
    assert s.by("allot_allocation_budget_ratio", "allocation") == {"nlp": 0.7, "vision": 0.3}


def test_running_gpus_split_allocated_and_unallocated_and_allocated_is_the_sum_held() -> None:
    s = scrape(full_inputs())
    assert s.value("allot_running_allocated_gpus") == 4.0
    assert s.value("allot_running_unallocated_gpus") == 2.0
    held = sum(s.by("allot_allocation_held_gpus", "allocation").values())
    assert held == s.value("allot_running_allocated_gpus")


def test_hosts_and_gpus_by_state_cover_every_state() -> None:
    s = scrape(full_inputs())
    assert s.by("allot_hosts", "state") == {
        "healthy": 1.0,
        "draining": 1.0,
        "drained": 1.0,
        "cordoned": 1.0,
    }
    assert s.by("allot_host_gpus", "state") == {
        "healthy": 8.0,
        "draining": 8.0,
        "drained": 4.0,
        "cordoned": 2.0,
    }


def test_an_empty_cluster_still_reports_every_host_state_as_zero() -> None:
    s = scrape(MetricsInputs(timeline=RecordedTimeline(LogFold()), now=T))
    assert s.by("allot_hosts", "state") == dict.fromkeys(HostState, 0.0)
    assert s.by("allot_host_gpus", "state") == dict.fromkeys(HostState, 0.0)
    assert s.value("allot_running_allocated_gpus") == 0.0
    assert s.value("allot_queue_wait_seconds_count") == 0.0


# ---------------------------------------------------------------------------- window
def test_window_usage_factor_and_rank_come_from_the_rankings_leaves() -> None:
    s = scrape(full_inputs())
    assert s.by("allot_allocation_window_usage_gpu_seconds", "allocation") == {
        "nlp": 14_400.0,
        "vision": 36_000.0,
        "audio": 0.0,
    }  # the root (not a leaf, 50 400) is not an allocation
    assert s.by("allot_allocation_fairshare_ratio", "allocation") == {
        "nlp": 0.6,
        "vision": 0.2,
        "audio": 0.9,
    }
    assert s.by("allot_allocation_fairtree_rank", "allocation") == {
        "nlp": 2.0,
        "vision": 3.0,
        "audio": 1.0,
    }
    assert s.value("allot_usage_window_seconds") == WEEK


def test_an_unranked_leaf_has_window_usage_but_no_factor_or_rank() -> None:
    ranking = msgspec.structs.replace(RANKING, nodes=(rank_row("nlp", True, 5.0, None, None),))
    s = scrape(full_inputs(ranking=ranking))
    assert s.by("allot_allocation_window_usage_gpu_seconds", "allocation") == {"nlp": 5.0}
    assert s.by("allot_allocation_fairshare_ratio", "allocation") == {}
    assert s.by("allot_allocation_fairtree_rank", "allocation") == {}


def test_sort_key_is_the_queues_value_when_pending_else_tier_plus_one_minus_factor() -> None:
    s = scrape(full_inputs())
    assert s.by("allot_allocation_sort_key", "allocation") == pytest.approx(
        {
            "nlp": 1.4,  # queue row (computed agrees: held 4 = entitlement 4 -> tier 1, 1-0.6)
            "vision": 0.8,  # queue row; computed would be 0 + 1 - 0.2 = 0.8
            "audio": 0.1,  # only a stale row ("gone", 0.05): held 0 < 2 -> tier 0, 1 - 0.9
        }
    )


def test_the_queues_sort_metric_wins_over_the_computed_one() -> None:
    # Under the untiered policy the queue says tier 0 though nlp is at its entitlement.
    queue = msgspec.structs.replace(
        QUEUE, rows=(queue_row("p1", "nlp", 8, "under-entitlement", sort_metric=0.4, reason=""),)
    )
    s = scrape(full_inputs(queue=queue))
    assert s.value("allot_allocation_sort_key", allocation="nlp") == pytest.approx(0.4)
    s = scrape(full_inputs(queue=None))
    assert s.value("allot_allocation_sort_key", allocation="nlp") == pytest.approx(1.4)


def test_without_a_ranking_the_sort_key_uses_factor_zero_as_placement_does() -> None:
    s = scrape(full_inputs(ranking=None, queue=None))
    assert s.by("allot_allocation_sort_key", "allocation") == {
        "nlp": 2.0,  # tier 1 (held 4, entitled 4) + 1 - 0
        "vision": 1.0,
        "audio": 1.0,
    }


# ---------------------------------------------------------------------------- pending
def test_pending_counts_every_pending_workload_once_by_allocation_and_reason() -> None:
    s = scrape(full_inputs())
    workloads = {
        (dict(k)["allocation"], dict(k)["reason"]): v
        for (n, k), v in s.samples.items()
        if n == "allot_pending_workloads"
    }
    gpus = {
        (dict(k)["allocation"], dict(k)["reason"]): v
        for (n, k), v in s.samples.items()
        if n == "allot_pending_gpus"
    }
    assert workloads == {
        ("nlp", "over-entitlement"): 1.0,
        ("vision", "protected-until"): 1.0,
        ("vision", UNKNOWN_REASON): 1.0,  # p4: submitted after the snapshot
        (NO_ALLOCATION, "unallocated-idle-only"): 1.0,
    }  # "gone" is in the snapshot but no longer pending: not counted
    assert gpus == {
        ("nlp", "over-entitlement"): 8.0,
        ("vision", "protected-until"): 2.0,
        ("vision", UNKNOWN_REASON): 4.0,
        (NO_ALLOCATION, "unallocated-idle-only"): 1.0,
    }


def test_without_a_queue_snapshot_pending_is_still_counted_with_reason_unknown() -> None:
    s = scrape(full_inputs(queue=None))
    assert s.by("allot_pending_workloads", "allocation") == {
        "nlp": 1.0,
        "vision": 2.0,
        NO_ALLOCATION: 1.0,
    }
    assert set(s.by("allot_pending_workloads", "reason")) == {UNKNOWN_REASON}


def test_a_row_without_a_reason_code_counts_as_unknown() -> None:
    queue = msgspec.structs.replace(
        QUEUE, rows=(queue_row("p1", "nlp", 8, "over-entitlement", sort_metric=1.4, reason=""),)
    )
    s = scrape(full_inputs(queue=queue))
    assert s.value("allot_pending_gpus", allocation="nlp", reason=UNKNOWN_REASON) == 8.0


# ---------------------------------------------------------------------------- counters
def test_preemptions_are_a_counter_per_reason_with_every_reason_present() -> None:
    s = scrape(full_inputs())
    assert s.types["allot_preemptions"] == "counter"
    assert s.by("allot_preemptions_total", "reason") == {
        "displaced-unallocated": 0.0,
        "reclaimed-for-entitlement": 0.0,
        "better-ranked": 3.0,
        "host-drain": 1.0,
        "higher-class": 0.0,
        "reservation": 0.0,
        "idle": 0.0,
    }
    assert set(PREEMPT_REASONS) == set(s.by("allot_preemptions_total", "reason"))
    assert s.types["allot_preempted_gpu_seconds"] == "counter"
    assert s.value("allot_preempted_gpu_seconds_total") == 1234.5


# ---------------------------------------------------------------------------- histograms
def buckets(s: Scrape, name: str) -> list[tuple[float, float]]:
    return sorted((float(le), v) for le, v in s.by(f"{name}_bucket", "le").items())


def test_queue_wait_histogram_counts_each_wait_in_its_bucket_cumulatively() -> None:
    s = scrape(full_inputs())
    got = dict(buckets(s, "allot_queue_wait_seconds"))
    assert [b for b in got if math.isfinite(b)] == list(QUEUE_WAIT_BUCKETS_S)
    assert got[1.0] == 2.0  # 0.5 and 1.0: le is inclusive
    assert got[15.0] == 2.0
    assert got[30.0] == 3.0
    assert got[3600.0] == 4.0
    assert got[86400.0] == 4.0
    assert got[172800.0] == 5.0  # 90 000 s (25 h)
    assert got[math.inf] == 5.0
    assert s.value("allot_queue_wait_seconds_count") == 5.0
    assert s.value("allot_queue_wait_seconds_sum") == pytest.approx(sum(WAITS))


@pytest.mark.parametrize(
    "name", ["allot_queue_wait_seconds", "allot_scheduling_cycle_duration_seconds"]
)
def test_histograms_are_cumulative_and_end_with_inf_equal_to_count(name: str) -> None:
    s = scrape(full_inputs())
    assert s.types[name] == "histogram"
    series = buckets(s, name)
    counts = [v for _, v in series]
    assert counts == sorted(counts)
    assert series[-1][0] == math.inf
    assert series[-1][1] == s.value(f"{name}_count")


def test_cycle_duration_is_the_leaders_histogram_passed_through() -> None:
    s = scrape(full_inputs())
    assert buckets(s, "allot_scheduling_cycle_duration_seconds") == [
        (0.001, 2.0),
        (0.01, 5.0),
        (0.1, 9.0),
        (math.inf, 10.0),
    ]
    assert s.value("allot_scheduling_cycle_duration_seconds_sum") == 0.8


def test_where_the_cycles_time_went_is_two_counters_passed_through() -> None:
    s = scrape(full_inputs())
    assert s.types["allot_scheduling_cycle_decide_seconds"] == "counter"
    assert s.types["allot_scheduling_cycle_append_wait_seconds"] == "counter"
    assert s.value("allot_scheduling_cycle_decide_seconds_total") == 0.125
    assert s.value("allot_scheduling_cycle_append_wait_seconds_total") == 0.5


def test_a_leader_with_no_cycles_yet_exports_an_empty_histogram() -> None:
    stats = m.PlacementStats(at=T)
    s = scrape(full_inputs(placement_stats=stats))
    assert buckets(s, "allot_scheduling_cycle_duration_seconds") == [(math.inf, 0.0)]
    assert s.value("allot_scheduling_cycle_duration_seconds_count") == 0.0


def test_a_kept_histogram_adds_only_the_placements_since_the_last_scrape() -> None:
    timeline = RecordedTimeline(LogFold(), waits=[2.0, 40.0])
    kept = QueueWaitHistogram()
    first = scrape(MetricsInputs(timeline=timeline, now=T, queue_waits=kept))
    assert first.value("allot_queue_wait_seconds_count") == 2.0
    again = scrape(MetricsInputs(timeline=timeline, now=T, queue_waits=kept))
    assert again.value("allot_queue_wait_seconds_count") == 2.0  # nothing counted twice
    timeline.waits.append(700.0)
    later = scrape(MetricsInputs(timeline=timeline, now=T, queue_waits=kept))
    assert later.value("allot_queue_wait_seconds_count") == 3.0
    assert later.value("allot_queue_wait_seconds_sum") == 742.0
    assert later.value("allot_queue_wait_seconds_bucket", le="600.0") == 2.0
    assert later.value("allot_queue_wait_seconds_bucket", le="1800.0") == 3.0


def test_a_kept_histogram_reads_a_new_timeline_from_its_start() -> None:
    kept = QueueWaitHistogram()
    render_metrics(
        MetricsInputs(
            timeline=RecordedTimeline(LogFold(), waits=[1.0, 2.0, 3.0]), now=T, queue_waits=kept
        )
    )
    restarted = RecordedTimeline(
        LogFold(), waits=[4.0]
    )  # fewer placements than seen: new log reader
    s = scrape(MetricsInputs(timeline=restarted, now=T, queue_waits=kept))
    assert s.value("allot_queue_wait_seconds_count") == 4.0
    assert s.value("allot_queue_wait_seconds_sum") == 10.0


# ---------------------------------------------------------------------------- the real timeline
def record_stream() -> list[msgspec.Struct]:
    """a1 (nlp, 4 GPUs) waits 30 s; b1 (vision, 4 GPUs) waits 5 s, runs 95 s, is preempted
    for a1's allocation and requeued; c1 (nlp, 2 GPUs) is still pending."""
    tree = parse_tree(
        {
            "name": "root",
            "children": [{"name": "nlp", "shares": 1}, {"name": "vision", "shares": 1}],
        }
    )
    return [
        m.BudgetTreeSet(at=T, by="admin", tree=spec_from_tree(tree)),
        m.HostRegistered(host="h1", gpus=8, at=T),
        m.LeaderElected(epoch=1, leader="p", at=T),
        submitted("b1", 4, "vision"),
        m.WorkloadPlaced(
            workload_id="b1",
            allocation="vision",
            at=T + 5,
            gpus=4,
            assignment=(m.HostGpus(host="h1", gpus=(0, 1, 2, 3)),),
            epoch=1,
        ),
        submitted("a1", 8, "nlp"),
        m.PreemptionNotice(
            workload_id="b1",
            allocation="vision",
            at=T + 20,
            reason="reclaimed-for-entitlement",
            grace_deadline=T + 100,
            requeue=True,
            gpus=4,
            preemptor="a1",
            epoch=1,
        ),
        m.WorkloadPreempted(
            workload_id="b1", allocation="vision", at=T + 100, reason="reclaimed-for-entitlement"
        ),
        m.WorkloadPlaced(
            workload_id="a1",
            allocation="nlp",
            at=T + 130,
            gpus=8,
            assignment=(m.HostGpus(host="h1", gpus=tuple(range(8))),),
            epoch=1,
        ),
        submitted("c1", 2, "nlp"),
    ]


def test_the_real_timeline_feeds_the_counters_and_the_wait_histogram() -> None:
    timeline = LogTimeline()
    for record in record_stream():
        timeline.apply(record)
    s = scrape(MetricsInputs(timeline=timeline, now=T + 200))
    assert s.value("allot_preemptions_total", reason="reclaimed-for-entitlement") == 1.0
    assert s.value("allot_preemptions_total", reason="better-ranked") == 0.0
    assert s.value("allot_preempted_gpu_seconds_total") == 4 * 95.0  # 4 GPUs, T+5 .. T+100
    # b1 waited 5 s, a1 130 s (submitted at T: records carry the submission time)
    assert s.value("allot_queue_wait_seconds_count") == 2.0
    assert s.value("allot_queue_wait_seconds_sum") == 135.0
    assert s.value("allot_queue_wait_seconds_bucket", le="5.0") == 1.0
    assert s.value("allot_queue_wait_seconds_bucket", le="120.0") == 1.0
    assert s.value("allot_queue_wait_seconds_bucket", le="300.0") == 2.0
    assert s.value("allot_allocation_held_gpus", allocation="nlp") == 8.0
    pending = {
        (dict(k)["allocation"], dict(k)["reason"]): v
        for (n, k), v in s.samples.items()
        if n == "allot_pending_workloads"
    }
    assert pending == {("nlp", UNKNOWN_REASON): 1.0, ("vision", UNKNOWN_REASON): 1.0}


def test_waits_the_timeline_forgets_stay_counted_in_the_kept_histogram() -> None:
    timeline = LogTimeline(horizon_s=64.0)  # forgets placements older than 64 s of log time
    kept = QueueWaitHistogram()

    def count(waits: QueueWaitHistogram | None) -> float:
        inputs = MetricsInputs(timeline=timeline, now=T)
        if waits is not None:
            inputs = replace(inputs, queue_waits=waits)
        return scrape(inputs).value("allot_queue_wait_seconds_count")

    for record in record_stream():  # scraped after every record, as Prometheus would
        timeline.apply(record)
        count(kept)
    assert count(kept) == 2.0
    assert count(None) == 1.0  # b1's placement (T+5) is older than T+130 - 64 s: forgotten
    later = T + 10_000
    timeline.apply(m.WorkloadCompleted(workload_id="a1", allocation="nlp", at=later))
    timeline.apply(
        m.WorkloadPlaced(
            workload_id="c1",
            allocation="nlp",
            at=later + 1,
            gpus=2,
            assignment=(m.HostGpus(host="h1", gpus=(0, 1)),),
            epoch=1,
        )
    )
    assert count(None) == 1.0  # only c1 is remembered now
    assert count(kept) == 3.0  # never goes down
    assert kept.sum_s == 135.0 + 10_001.0


# ---------------------------------------------------------------------------- inputs missing
def test_missing_inputs_leave_out_only_the_metrics_that_need_them() -> None:
    full = set(scrape(full_inputs()).types)
    bare = set(scrape(full_inputs(ranking=None, queue=None, placement_stats=None)).types)
    assert full - bare == {
        "allot_allocation_window_usage_gpu_seconds",
        "allot_allocation_fairshare_ratio",
        "allot_allocation_fairtree_rank",
        "allot_usage_window_seconds",
        "allot_scheduling_cycle_duration_seconds",
        "allot_scheduling_cycle_decide_seconds",
        "allot_scheduling_cycle_append_wait_seconds",
        "allot_ranking_age_seconds",
        "allot_placement_snapshot_age_seconds",
    }
    assert bare <= full


def test_ages_measure_the_oldest_input_against_now() -> None:
    s = scrape(full_inputs())
    assert s.value("allot_ranking_age_seconds") == 60.0  # now T+100, ranking T+40
    assert s.value("allot_placement_snapshot_age_seconds") == 70.0  # queue at T+30
    s = scrape(full_inputs(now=T))  # a clock behind the inputs: an age is never negative
    assert s.value("allot_ranking_age_seconds") == 0.0


# ---------------------------------------------------------------------------- naming rules
UNIT_SUFFIXES = ("_seconds", "_gpus", "_gpu_seconds", "_ratio")
DIMENSIONLESS = {
    "allot_hosts",  # a count of hosts
    "allot_pending_workloads",  # a count of workloads
    "allot_idle_workloads",  # a count of runs flagged idle
    "allot_preemptions",  # a count of notices (exposed as _total)
    "allot_allocation_fairtree_rank",  # an ordinal
    "allot_allocation_sort_key",  # tier + 1 - factor: a number with no unit
}


def test_every_name_is_prefixed_and_in_base_units() -> None:
    for name in scrape(full_inputs()).types:
        assert name.startswith("allot_"), name
        assert name.endswith(UNIT_SUFFIXES) or name in DIMENSIONLESS, name
        assert not re.search(r"_(hours|minutes|milliseconds|percent|bytes_total)$", name), name


def test_history_and_now_are_told_apart_by_name() -> None:
    names = set(scrape(full_inputs()).types)
    usage = [n for n in names if "usage" in n]
    assert usage and all("window" in n for n in usage)
    assert "allot_allocation_held_gpus" in names
    assert not [n for n in names if "held" in n and "window" in n]


def test_no_workload_or_user_label_anywhere() -> None:
    s = scrape(full_inputs())
    for name, labels in s.samples:
        keys = {k for k, _ in labels}
        values = {v for _, v in labels}
        assert keys <= ALLOWED_LABELS, (name, keys)
        assert not values & (WORKLOAD_IDS | USERS), (name, values)


def test_the_body_is_the_text_format_the_content_type_names() -> None:
    body = render_metrics(full_inputs())
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")
    assert body.startswith(b"# HELP allot_")
    body.decode("utf-8")


# ---------------------------------------------------------------------------- bad input
def stats(**kw: object) -> m.PlacementStats:
    return msgspec.structs.replace(STATS, **kw)


@pytest.mark.parametrize(
    ("bad", "field", "reason"),
    [
        (stats(counts=(2, 5, 10)), "placement_stats.counts", "one count per bucket plus +Inf"),
        (stats(counts=(2, 5, 4, 10)), "placement_stats.counts[2]", "cumulative"),
        (stats(buckets_s=(0.001, 0.1, 0.01)), "placement_stats.buckets_s[2]", "increasing"),
        (stats(count=11), "placement_stats.counts", "differs from count 11"),
        (stats(counts=()), "placement_stats.counts", "empty but buckets_s has 3"),
        (stats(decide_s=0.5, append_wait_s=0.31), "placement_stats.append_wait_s", "exceeds"),
    ],
    ids=[
        "a-count-missing",
        "not-cumulative",
        "bounds-out-of-order",
        "inf-not-count",
        "no-counts",
        "parts-over-sum",
    ],
)
def test_a_malformed_cycle_histogram_is_refused_naming_the_field(
    bad: m.PlacementStats, field: str, reason: str
) -> None:
    with pytest.raises(ValidationError) as e:
        full_inputs(placement_stats=bad)
    assert e.value.field == field
    assert reason in e.value.reason


@pytest.mark.parametrize(
    "now", [math.nan, math.inf, -1.0, "soon"], ids=["nan", "inf", "negative", "text"]
)
def test_now_must_be_a_finite_time(now: object) -> None:
    with pytest.raises(ValidationError) as e:
        full_inputs(now=now)
    assert e.value.field == "now"


def test_a_negative_queue_wait_is_refused_naming_its_index() -> None:
    inputs = full_inputs(timeline=RecordedTimeline(LogFold(), waits=[3.0, -1.0]))
    with pytest.raises(ValidationError) as e:
        render_metrics(inputs)
    assert e.value.field == "timeline.queue_waits_since(0)[1]"
    assert inputs.queue_waits.counts == [0] * (len(QUEUE_WAIT_BUCKETS_S) + 1)


# ---------------------------------------------------------------------------- docs
def documented() -> dict[str, str]:
    """``docs/metrics.md`` table rows: | `name` | type | ... -> {name: type}."""
    out: dict[str, str] = {}
    for line in DOCS.read_text().splitlines():
        row = re.match(r"\|\s*`(allot_[a-z_]+)`\s*\|\s*(\w+)\s*\|", line)
        if row:
            assert row[1] not in out, f"{row[1]} documented twice"
            out[row[1]] = row[2]
    return out


def test_idle_gpu_seconds_count_closed_and_open_stretches_and_never_go_down() -> None:
    inputs = full_inputs()  # now = T + 100
    s = scrape(inputs)
    # closed: 2 GPUs x 1000 s; open: 4 GPUs x (T+100 - (T-50)) = 600
    assert s.by("allot_idle_gpu_seconds_total", "allocation") == {"nlp": 2600.0}
    assert s.by("allot_idle_workloads", "allocation") == {"nlp": 1.0}
    assert s.by("allot_idle_gpus", "allocation") == {"nlp": 4.0}
    # The open stretch closes before the last scrape's now (its last idle evidence): the
    # counter keeps what it exported.
    assert inputs.idle is not None
    book = inputs.idle
    assert isinstance(book, IdleBook)
    book.apply(
        m.WorkloadIdleCleared(
            workload_id="w2",
            allocation="nlp",
            gpus=4,
            at=T + 120,
            idle_since=T - 50,
            until=T + 50,
            why="busy",
        )
    )
    again = scrape(replace(inputs, now=T + 200))
    assert again.by("allot_idle_gpu_seconds_total", "allocation") == {"nlp": 2600.0}
    assert again.by("allot_idle_workloads", "allocation") == {}


def test_docs_list_exactly_the_exported_metrics_with_their_types() -> None:
    assert documented() == exported_families()
