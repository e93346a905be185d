"""build_report on tiny hand-made SimRecords: owed is capped by demand and by share,
delivered by owed, the drain-out is not counted, unallocated time is never delivered,
waits use nearest-rank percentiles, and the JSON is byte-stable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from allot.core.errors import ValidationError
from allot.sim.record import (
    CapacityChange,
    JobOutcome,
    Preemption,
    Segment,
    SimRecord,
    Waiting,
)
from allot.sim.report import build_report, write_report

H = 3600.0


# --- builders -------------------------------------------------------------------------


def record(
    *,
    gpus: int = 10,
    last_submit: float = H,
    end: float = H,
    shares: dict[str, float] | None = None,
    **fields: Any,
) -> SimRecord:
    """A record whose observed period is [0, last_submit] on a cluster of ``gpus`` GPUs."""
    rec = SimRecord(
        policy="fairshare", seed=7, first_submit=0.0, last_submit=last_submit, end_time=end
    )
    rec.capacity = [CapacityChange(0.0, gpus)]
    rec.effective_shares = dict(shares if shares is not None else {"a": 0.5, "b": 0.5})
    for name, value in fields.items():
        setattr(rec, name, value)
    return rec


def run(
    alloc: str | None, gpus: int, start: float, end: float, *, allocated: bool = True
) -> Segment:
    return Segment(f"{alloc}-{gpus}-{start}", alloc, allocated, gpus, start, end)


def wait(alloc: str, gpus: int, start: float, end: float, *, allocated: bool = True) -> Waiting:
    return Waiting(f"{alloc}-w-{start}", alloc, allocated, gpus, start, end)


def job(
    wait_s: float | None, *, kind: str = "debug", gpus: int = 1, submit: float = 0.0
) -> JobOutcome:
    first = None if wait_s is None else submit + wait_s
    return JobOutcome(
        f"j{submit}-{wait_s}-{kind}-{gpus}", "a", kind, gpus, submit, first, None, "completed"
    )


def alloc_row(report: dict[str, Any], name: str) -> tuple[float, float, float | None]:
    row = report["owed_delivered"]["by_allocation"][name]
    return row["owed_gpu_h"], row["delivered_gpu_h"], row["ratio"]


# --- owed and delivered ---------------------------------------------------------------


class OwedCase(NamedTuple):
    rec: SimRecord
    expected: tuple[float, float, float | None]  # allocation a: owed GPU-h, delivered, ratio


OWED_CASES = {
    # share 0.5 of 10 GPUs = 5 GPU-h in the hour; a runs 2 GPUs: owed is its demand, 2.
    "demand-below-share-is-owed-in-full": OwedCase(
        record(segments=[run("a", 2, 0, H)]), (2.0, 2.0, 1.0)
    ),
    # a runs 8 GPUs: owed is its share, 5; delivered is capped at owed.
    "delivered-is-capped-at-owed": OwedCase(record(segments=[run("a", 8, 0, H)]), (5.0, 5.0, 1.0)),
    # 1 GPU running + 4 waiting: demand 5 = share, owed 5, delivered 1.
    "waiting-work-is-demand-too": OwedCase(
        record(segments=[run("a", 1, 0, H)], waits=[wait("a", 4, 0, H)]), (5.0, 1.0, 0.2)
    ),
    # a waits 2 allocated GPUs while its min_runtime-0 work runs on 4: the free time is not
    # delivered, so owed 2, delivered 0.
    "unallocated-running-is-never-delivered": OwedCase(
        record(segments=[run("a", 4, 0, H, allocated=False)], waits=[wait("a", 2, 0, H)]),
        (2.0, 0.0, 0.0),
    ),
    # unallocated waiting is no demand: nothing owed, ratio null.
    "unallocated-waiting-is-not-demand": OwedCase(
        record(waits=[wait("a", 2, 0, H, allocated=False)]), (0.0, 0.0, None)
    ),
    # the last submission is at 1 h, the run ends at 2 h; a only runs in hour 2.
    "the-drain-out-hour-is-not-counted": OwedCase(
        record(end=2 * H, segments=[run("a", 4, H, 2 * H)]), (0.0, 0.0, None)
    ),
    # a runs 4 GPUs for both hours; only the first (observed) hour counts.
    "only-the-observed-hour-counts": OwedCase(
        record(end=2 * H, segments=[run("a", 4, 0, 2 * H)]), (4.0, 4.0, 1.0)
    ),
    # observed period 1.5 h: the half hour counts pro rata (share 5 GPU-h/h, demand 6 GPUs):
    # owed 5 + 2.5, delivered the same.
    "a-partial-last-hour-counts-pro-rata": OwedCase(
        record(last_submit=1.5 * H, end=3 * H, segments=[run("a", 6, 0, 3 * H)]), (7.5, 7.5, 1.0)
    ),
    # hour by hour, not in total: a wants 10 GPUs in hour 1 and none in hour 2. Owed is
    # 5 (capped by share) + 0, not min(0.5 * 20, 10) = 10.
    "owed-is-capped-hour-by-hour": OwedCase(
        record(last_submit=2 * H, end=2 * H, segments=[run("a", 10, 0, H)]), (5.0, 5.0, 1.0)
    ),
    # capacity drops from 10 to 2 GPUs at half past: share of capacity is 0.5*(5 + 1) = 3.
    "owed-follows-healthy-capacity": OwedCase(
        record(
            segments=[run("a", 8, 0, H)],
            capacity=[CapacityChange(0.0, 10), CapacityChange(H / 2, 2)],
        ),
        (3.0, 3.0, 1.0),
    ),
    # no share: nothing is owed whatever a ran.
    "an-allocation-without-a-share-is-owed-nothing": OwedCase(
        record(segments=[run("a", 8, 0, H)], shares={"b": 1.0}), (0.0, 0.0, None)
    ),
}


@pytest.mark.parametrize("case", OWED_CASES.values(), ids=OWED_CASES.keys())
def test_owed_and_delivered_worked_by_hand(case: OwedCase) -> None:
    owed, delivered, ratio = alloc_row(build_report(case.rec), "a")
    assert (owed, delivered) == pytest.approx(case.expected[:2])
    assert ratio == case.expected[2]


def test_overall_programs_and_team_counts() -> None:
    # Capacity 10, shares a 0.5, b 0.3, c 0.2, one hour.
    # a: runs 3, waits 2 -> owed 5, delivered 3.   b: runs 3 -> owed 3, delivered 3.
    # c: nothing -> owed 0, ratio null (not counted among teams).
    rec = record(
        shares={"a": 0.5, "b": 0.3, "c": 0.2},
        segments=[run("a", 3, 0, H), run("b", 3, 0, H)],
        waits=[wait("a", 2, 0, H)],
        programs={"a": "nlp", "b": "nlp", "c": "vision"},
    )
    od = build_report(rec)["owed_delivered"]
    assert od["overall"] == pytest.approx(6 / 8)
    assert od["by_program"]["nlp"] == {"owed_gpu_h": 8.0, "delivered_gpu_h": 6.0, "ratio": 0.75}
    assert od["by_program"]["vision"]["ratio"] is None
    assert (od["teams"], od["teams_at_or_above_095"]) == (2, 1)
    assert od["by_allocation"]["c"] == {"owed_gpu_h": 0.0, "delivered_gpu_h": 0.0, "ratio": None}


def test_hourly_owed_and_delivered_series_cover_the_observed_period_only() -> None:
    rec = record(last_submit=1.5 * H, end=3 * H, segments=[run("a", 6, 0, 3 * H)])
    ts = build_report(rec)["timeseries"]
    assert (ts["buckets"], ts["observed_buckets"]) == (3, 2)
    assert ts["owed_gpu_h"]["a"] == [5.0, 2.5]
    assert ts["delivered_gpu_h"]["a"] == [5.0, 2.5]
    assert ts["owed_gpu_h"]["b"] == [0.0, 0.0]


# --- occupancy and unallocated share ---------------------------------------------------


def test_occupancy_unallocated_fraction_and_their_series() -> None:
    # 10 GPUs for 2 h; hour 1: 6 allocated + 2 unallocated; hour 2 (drain-out): 5 unallocated.
    rec = record(
        end=2 * H,
        segments=[
            run("a", 6, 0, H),
            run("b", 2, 0, H, allocated=False),
            run("b", 5, H, 2 * H, allocated=False),
        ],
    )
    r = build_report(rec)
    assert r["occupancy"] == pytest.approx(13 / 20)
    assert r["occupancy_observed"] == pytest.approx(8 / 10)
    assert r["unallocated_fraction"] == pytest.approx(7 / 13)
    ts = r["timeseries"]
    assert ts["occupancy"] == [0.8, 0.5]
    assert ts["unallocated_share"] == [0.25, 1.0]
    assert ts["busy_gpu_h"] == [8.0, 5.0]
    assert ts["capacity_gpu_h"] == [10.0, 10.0]
    assert r["span_s"] == 2 * H


@pytest.mark.parametrize(
    ("start", "end"),
    [
        pytest.param(0.0, 1.0, id="one-second"),
        pytest.param(100.0, 3500.0, id="inside-one-bucket"),
        pytest.param(3599.0, 3601.0, id="across-one-edge"),
        pytest.param(1234.5, 40 * H + 17, id="many-whole-buckets-between"),
        pytest.param(0.0, 50 * H, id="exactly-the-whole-span"),
        pytest.param(-500.0, 60 * H, id="clipped-at-both-ends"),
    ],
)
def test_bucketing_conserves_gpu_seconds(start: float, end: float) -> None:
    rec = record(last_submit=50 * H, end=50 * H, segments=[run("a", 3, start, end)])
    busy = build_report(rec)["timeseries"]["busy_gpu_h"]
    assert len(busy) == 50
    expected = 3 * (min(end, 50 * H) - max(start, 0.0)) / H
    assert sum(busy) == pytest.approx(expected, abs=1e-5)
    assert all(0.0 <= b <= 3.0 + 1e-9 for b in busy)


def test_no_capacity_means_null_occupancy() -> None:
    rec = record(segments=[run("a", 1, 0, H)], capacity=[])
    r = build_report(rec)
    assert r["occupancy"] is None
    assert r["owed_delivered"]["overall"] is None


def test_preemptions_are_counted_per_bucket() -> None:
    rec = record(
        end=3 * H,
        preemptions=[
            Preemption(10.0, "x", "a", 1, "fairshare", True),
            Preemption(H + 1, "y", "a", 1, "fairshare", True),
            Preemption(H + 2, "z", "a", 1, "drain", False),
            Preemption(3 * H, "w", "a", 1, "drain", False),
        ],
        requeues=2,
    )
    r = build_report(rec)
    assert r["timeseries"]["preemptions"] == [1, 2, 1]
    assert (r["preemptions"], r["requeues"]) == (4, 2)


# --- waits ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("waits", "p50", "p90", "p99"),
    [
        pytest.param([7.0], 7.0, 7.0, 7.0, id="one-job"),
        pytest.param([float(x) for x in range(1, 11)], 5.0, 9.0, 10.0, id="one-to-ten"),
        pytest.param(
            [float(x) for x in range(100, 0, -1)], 50.0, 90.0, 99.0, id="hundred-unsorted"
        ),
        pytest.param([0.0, 0.0, 0.0, 1000.0], 0.0, 1000.0, 1000.0, id="a-long-tail"),
    ],
)
def test_wait_percentiles_are_nearest_rank(
    waits: list[float], p50: float, p90: float, p99: float
) -> None:
    rec = record(jobs=[job(w, submit=float(i)) for i, w in enumerate(waits)])
    stats = build_report(rec)["wait_s"]["all"]
    assert (stats["p50"], stats["p90"], stats["p99"]) == (p50, p90, p99)
    assert stats["mean"] == pytest.approx(sum(waits) / len(waits))
    assert (stats["n"], stats["never_started"]) == (len(waits), 0)


def test_a_job_that_never_started_waits_until_the_end_and_is_flagged() -> None:
    rec = record(end=10 * H, last_submit=H, jobs=[job(None, submit=H), job(60.0, kind="eval")])
    w = build_report(rec)["wait_s"]
    assert w["by_kind"]["debug"] == {
        "n": 1,
        "never_started": 1,
        "mean": 9 * H,
        "p50": 9 * H,
        "p90": 9 * H,
        "p99": 9 * H,
    }
    assert (w["all"]["n"], w["all"]["never_started"]) == (2, 1)
    assert w["by_kind"]["eval"]["p50"] == 60.0


def test_waits_by_size_bucket() -> None:
    rec = record(jobs=[job(float(g), gpus=g, submit=float(g)) for g in (1, 2, 8, 9, 63, 64, 128)])
    by_size = build_report(rec)["wait_s"]["by_size"]
    assert set(by_size) == {"1", "2-8", "9-63", "64+"}
    assert {k: v["n"] for k, v in by_size.items()} == {"1": 1, "2-8": 2, "9-63": 2, "64+": 2}
    assert by_size["64+"]["p50"] == 64.0


def test_empty_size_bucket_has_null_stats() -> None:
    stats = build_report(record())["wait_s"]["by_size"]["64+"]
    assert stats == {
        "n": 0,
        "never_started": 0,
        "mean": None,
        "p50": None,
        "p90": None,
        "p99": None,
    }


def test_wait_cdf_lists_101_nearest_rank_percentiles_per_kind() -> None:
    rec = record(jobs=[job(float(x), submit=float(x)) for x in range(1, 11)])
    cdf = build_report(rec)["wait_s"]["cdf_by_kind"]["debug"]
    assert len(cdf) == 101
    assert (cdf[0], cdf[10], cdf[11], cdf[50], cdf[100]) == (1.0, 1.0, 2.0, 5.0, 10.0)
    assert cdf == sorted(cdf)


# --- output shape and stability -------------------------------------------------------


def sample_record() -> SimRecord:
    return record(
        end=3 * H,
        last_submit=2 * H,
        segments=[run("a", 3, 10.123456789, 2.5 * H), run("b", 2, 0, H / 3, allocated=False)],
        waits=[wait("a", 2, 0, 200.0)],
        jobs=[job(200.0), job(None, kind="training", gpus=64)],
        final_fairshare={"a": 1 / 3, "b": 2 / 3},
        programs={"a": "p", "b": "p"},
    )


def test_report_has_exactly_the_documented_keys() -> None:
    r = build_report(sample_record())
    assert set(r) == {
        "policy",
        "seed",
        "span_s",
        "submissions_s",
        "drain_s",
        "workloads",
        "completed",
        "preemptions",
        "requeues",
        "occupancy",
        "occupancy_observed",
        "unallocated_fraction",
        "unallocated_fraction_observed",
        "owed_delivered",
        "wait_s",
        "jct_s",
        "timeseries",
        "final_fairshare",
        "preemption_rate",
        "unallocated_goodput",
        "reservations",
    }
    assert (r["policy"], r["seed"], r["workloads"], r["completed"]) == ("fairshare", 7, 2, 2)
    assert r["final_fairshare"] == {"a": 0.333333, "b": 0.666667}
    assert (r["submissions_s"], r["drain_s"]) == (2 * H, H)  # first submit at 0, end 3 h
    assert "scenario" not in r  # only when the caller knows it
    assert build_report(sample_record(), scenario={"name": "ai2", "seed": 1})["scenario"] == {
        "name": "ai2",
        "seed": 1,
    }


def test_allocated_and_unallocated_waits_apart() -> None:
    """The contract's meaning, from each job's segments and waits: unallocated work waits by
    design, and must not blur the allocated work's waits."""
    ran = SimRecord(
        policy="fairshare",
        seed=0,
        first_submit=0.0,
        last_submit=H,
        end_time=2 * H,
        segments=[run("a", 1, 10.0, H, allocated=True), run(None, 1, 5000.0, H, allocated=False)],
        jobs=[
            JobOutcome("a-1-10.0", "a", "training", 1, 0.0, 10.0, H, "completed"),
            JobOutcome("None-1-5000.0", None, "filler", 1, 0.0, 5000.0, H, "completed"),
            JobOutcome("never", None, "filler", 1, 0.0, None, None, "pending"),
        ],
        waits=[Waiting("never", None, False, 1, 0.0, 2 * H)],
    )
    waits = build_report(ran)["wait_s"]
    assert (waits["allocated"]["n"], waits["allocated"]["p90"]) == (1, 10.0)
    assert (waits["unallocated"]["n"], waits["unallocated"]["never_started"]) == (2, 1)
    assert waits["unallocated"]["p90"] == 2 * H  # the never-started one counts to the end
    assert waits["all"]["n"] == 3


def test_floats_are_rounded_and_json_is_byte_stable(tmp_path: Path) -> None:
    first = build_report(sample_record())
    second = build_report(sample_record())
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)

    def floats(value: object) -> list[float]:
        if isinstance(value, float):
            return [value]
        if isinstance(value, dict):
            return [f for v in value.values() for f in floats(v)]
        if isinstance(value, list):
            return [f for v in value for f in floats(v)]
        return []

    assert all(f == round(f, 6) for f in floats(first))
    write_report(first, tmp_path / "one")
    write_report(second, tmp_path / "two")
    text = (tmp_path / "one" / "report.json").read_text()
    assert text == json.dumps(first, sort_keys=True, indent=2) + "\n"
    for name in ("report.json", "report.html"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_negative_zero_is_written_as_zero() -> None:
    rec = record(first_submit=-0.0, last_submit=-0.0, end=-0.0)
    text = json.dumps(build_report(rec), sort_keys=True)
    assert "-0.0" not in text


@pytest.mark.parametrize(
    ("rec", "bucket_s", "field"),
    [
        pytest.param(record(), 0, "bucket_s", id="zero-bucket"),
        pytest.param(record(end=-1.0), 3600, "end_time", id="end-before-first-submit"),
    ],
)
def test_bad_input_is_rejected(rec: SimRecord, bucket_s: int, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        build_report(rec, bucket_s=bucket_s)
    assert err.value.field == field


def test_an_empty_record_still_reports() -> None:
    r = build_report(record(last_submit=0.0, end=0.0))
    assert (r["span_s"], r["workloads"], r["occupancy"]) == (0.0, 0, None)
    assert r["timeseries"]["buckets"] == 0
    assert r["wait_s"]["all"]["p50"] is None


def test_preemption_rate_and_unallocated_goodput() -> None:
    """Two unallocated attempts of one workload (30 s, then 2 h) after one notice, and one
    allocated run of 3 GPUs over 2.5 h: 1 notice over 2 GPU-h + 7.5 GPU-h run."""
    r = build_report(
        record(
            end=3 * H,
            last_submit=2 * H,
            segments=[
                run("a", 3, 0, 2.5 * H),
                Segment("u1", None, False, 2, 0.0, 30.0),
                Segment("u1", None, False, 2, 60.0, 60.0 + H / 2),
            ],
            preemptions=[Preemption(0.0, "u1", None, 2, "displaced-unallocated", True)],
        )
    )
    busy_h = (3 * 2.5 * H + 2 * 30.0 + 2 * H / 2) / H
    assert r["preemption_rate"] == {
        "per_1000_gpu_h": round(1 / busy_h * 1000, 6),
        "allocated_per_1000_gpu_h": 0.0,
    }
    assert r["unallocated_goodput"] == {
        "startup_allowance_s": 60.0,
        "gpu_h": round((60.0 + H) / H, 6),
        "goodput_gpu_h": 1.0,
        "goodput_fraction": round(H / (60.0 + H), 6),
        "attempts": 2,
        "short_attempts": 1,
        "workloads": 1,
        # one notice over a life of 0 .. 60 + 1,800 s (31 minutes)
        "preemptions_per_minute_mean": round(1 / 31, 6),
        "preemptions_per_minute_max": round(1 / 31, 6),
    }
    assert r["reservations"] == {"workloads": 0, "idle_gpu_h": 0.0}
