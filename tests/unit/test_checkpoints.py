"""Checkpointing in the simulator (``allot.sim.checkpoints``): what a preempted attempt
keeps and loses, the engine that applies it, the report that counts it, and the
``--checkpoint`` option that sets it."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from allot.cli.simulate_cmd import checkpoint_plan
from allot.config.yaml_io import load_yaml
from allot.core.budgets import parse_tree
from allot.core.errors import ValidationError
from allot.sim.baselines import named_policy
from allot.sim.checkpoints import TODAY, Checkpointing, CheckpointPlan, attempt_end
from allot.sim.cluster import load_cluster
from allot.sim.engine import SimConfig, simulate
from allot.sim.jobs_csv import jobs_csv
from allot.sim.record import SimRecord
from allot.sim.report import build_report
from allot.sim.trace import read_trace

RECLAIM = Path(__file__).resolve().parents[1] / "golden" / "cases" / "reclaim"


def cp(
    every: float | None = None, *, notice: bool = False, save: float = 0.0, restore: float = 0.0
) -> Checkpointing:
    return Checkpointing(every_s=every, on_notice=notice, save_s=save, restore_s=restore)


# --- one attempt, by hand --------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    settings: Checkpointing
    wall: float
    restore: float
    grace: float | None  # None: the attempt completed
    kept: float
    lost: float
    saves: float = 0.0
    notice: str = ""
    resumable: bool = True


ATTEMPTS = {
    "today's default keeps the whole attempt and loses nothing": Attempt(
        TODAY, 1000.0, 0.0, 300.0, kept=1000.0, lost=0.0, notice="saved"
    ),
    "a save on notice keeps the work done until the save began": Attempt(
        cp(notice=True, save=60), 1000.0, 0.0, 300.0, kept=940.0, lost=60.0, notice="saved"
    ),
    "after a restore, the restore and the notice save are lost": Attempt(
        cp(notice=True, save=60, restore=120),
        1000.0,
        120.0,
        300.0,
        kept=820.0,
        lost=180.0,
        notice="saved",
    ),
    "a save longer than the grace keeps nothing without periodic saves": Attempt(
        cp(notice=True, save=60), 1000.0, 0.0, 30.0, kept=0.0, lost=1000.0, notice="too-short"
    ),
    "a save longer than the grace falls back on the last periodic save": Attempt(
        # period 360 s: saves done at 360 and 720; kept 2 x 300, lost 1000 - 600 - 120
        cp(300, notice=True, save=60),
        1000.0,
        0.0,
        30.0,
        kept=600.0,
        lost=280.0,
        saves=120.0,
        notice="too-short",
    ),
    "periodic only: the work since the last save is lost": Attempt(
        cp(300, save=60), 1000.0, 0.0, 300.0, kept=600.0, lost=280.0, saves=120.0
    ),
    "periodic at no cost": Attempt(cp(300), 1000.0, 0.0, 300.0, kept=900.0, lost=100.0),
    "a periodic save cut short is lost": Attempt(
        # the first save runs from 300 to 360: cut at 330, nothing kept
        cp(300, save=60),
        330.0,
        0.0,
        300.0,
        kept=0.0,
        lost=330.0,
    ),
    "preempted while restoring: the whole attempt is lost": Attempt(
        cp(notice=True, save=60, restore=120),
        100.0,
        120.0,
        300.0,
        kept=0.0,
        lost=100.0,
        notice="saved",
    ),
    "no checkpoint at all: the whole attempt is lost": Attempt(
        cp(), 1000.0, 0.0, 300.0, kept=0.0, lost=1000.0
    ),
    "a non-resumable workload loses its whole attempt, however it saves": Attempt(
        cp(notice=True), 1000.0, 0.0, 300.0, kept=0.0, lost=1000.0, resumable=False
    ),
    "a completed attempt loses only its restore": Attempt(
        # 1000 s of progress in 300-s steps: 3 saves of 60 s on the way, none at the end
        cp(300, save=60, restore=120),
        120.0 + 1180.0,
        120.0,
        None,
        1000.0,
        120.0,
        180.0,
    ),
}


@pytest.mark.parametrize("case", list(ATTEMPTS))
def test_an_attempt_keeps_and_loses_what_its_checkpoints_say(case: str) -> None:
    a = ATTEMPTS[case]
    end = attempt_end(
        a.settings, wall_s=a.wall, restore_s=a.restore, grace_s=a.grace, resumable=a.resumable
    )
    assert end.kept_s == pytest.approx(a.kept)
    assert end.lost_s == pytest.approx(a.lost)
    assert end.saves_s == pytest.approx(a.saves)
    assert end.notice == a.notice


@pytest.mark.parametrize(
    ("progress", "wall"),
    [(0.0, 0.0), (100.0, 100.0), (300.0, 300.0), (301.0, 361.0), (600.0, 660.0), (601.0, 721.0)],
)
def test_wall_time_counts_the_saves_before_the_progress_and_none_at_its_end(
    progress: float, wall: float
) -> None:
    settings = cp(300, save=60)
    assert settings.wall_for(progress) == pytest.approx(wall)
    assert settings.progress_in(wall) == pytest.approx(progress)


# --- properties -------------------------------------------------------------------------

seconds = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
settings_st = st.builds(
    Checkpointing,
    every_s=st.none() | st.floats(min_value=1.0, max_value=1e5),
    on_notice=st.booleans(),
    save_s=st.floats(min_value=0.0, max_value=3600.0),
    restore_s=st.floats(min_value=0.0, max_value=3600.0),
)


@given(settings_st, seconds)
# A progress whose quotient by every_s underflows to 0 must not count -1 saves (a negative
# wall time).
@example(Checkpointing(every_s=2.0, on_notice=False, save_s=1.0), 5e-324)
def test_progress_in_inverts_wall_for(settings: Checkpointing, progress: float) -> None:
    assert math.isclose(
        settings.progress_in(settings.wall_for(progress)), progress, rel_tol=1e-9, abs_tol=1e-6
    )
    assert settings.wall_for(progress) >= progress


@given(settings_st, seconds, seconds, st.floats(min_value=0.0, max_value=7200.0), st.booleans())
def test_a_preempted_attempt_keeps_at_most_its_progress_and_accounts_for_every_second(
    settings: Checkpointing, wall: float, restore: float, grace: float, resumable: bool
) -> None:
    end = attempt_end(settings, wall_s=wall, restore_s=restore, grace_s=grace, resumable=resumable)
    made = settings.progress_in(wall - restore)
    assert 0.0 <= end.kept_s <= made + 1e-6
    assert end.lost_s >= 0.0 and end.saves_s >= 0.0
    assert math.isclose(end.kept_s + end.lost_s + end.saves_s, wall, rel_tol=1e-9, abs_tol=1e-6)
    if settings.every_s is not None and resumable:  # never worse than the last periodic save
        last = settings.every_s * settings.saves_in(wall - restore)
        assert end.kept_s >= last - 1e-6 * max(1.0, last)


@given(seconds, seconds)
def test_free_saves_on_notice_lose_nothing_and_keep_the_attempt_exactly(
    wall: float, grace: float
) -> None:
    end = attempt_end(TODAY, wall_s=wall, restore_s=0.0, grace_s=grace)
    assert end.kept_s == wall  # exactly: the default must not move a single float
    assert end.lost_s == 0.0


# --- the engine -------------------------------------------------------------------------


def yaml_mapping(path: Path) -> dict[str, object]:
    data = load_yaml(path)
    assert isinstance(data, dict)
    return data


def reclaim_run(plan: CheckpointPlan | None) -> SimRecord:
    """The golden ``reclaim`` case: two of beta's four 4-GPU training jobs (6 h, started at
    0) are noticed at t=1800 and leave at t=2100; they resume when alpha ends (t=16500)."""
    cluster = load_cluster(yaml_mapping(RECLAIM / "cluster.yaml"))
    tree = parse_tree(yaml_mapping(RECLAIM / "budgets.yaml"))
    policy = named_policy("fairshare", tree, cluster.total_gpus, 300)
    config = SimConfig("fairshare", policy, checkpointing=plan)
    return simulate(cluster, tree, read_trace(RECLAIM / "trace.csv"), config)


def victims(record: SimRecord) -> dict[str, list[tuple[float, float]]]:
    noticed = {p.workload_id for p in record.preemptions}
    spans = defaultdict(list)
    for s in sorted(record.segments, key=lambda s: s.start):
        if s.workload_id in noticed:
            spans[s.workload_id].append((s.start, s.end))
    return dict(spans)


def test_the_default_plan_decides_exactly_as_no_plan() -> None:
    plain, planned = reclaim_run(None), reclaim_run(CheckpointPlan())
    assert planned.segments == plain.segments
    assert planned.preemptions == plain.preemptions
    assert planned.jobs == plain.jobs
    assert plain.checkpointing is None and plain.attempt_costs == []
    assert "lost_to_preemption" not in build_report(plain)
    assert build_report(planned)["lost_to_preemption"]["gpu_h"] == 0.0


def test_a_save_on_notice_and_a_restore_are_lost_and_lengthen_the_run() -> None:
    plan = CheckpointPlan({"training": cp(notice=True, save=60, restore=120)})
    record = reclaim_run(plan)
    spans = victims(record)
    assert len(spans) == 2
    for (start, end), (again, last) in spans.values():
        assert (start, end) == (0.0, 2100.0)
        # kept 2100 - 60 = 2040 s of 21600; the next attempt restores 120 s first
        assert last - again == pytest.approx(120.0 + 21600.0 - 2040.0)
    lost = build_report(record)["lost_to_preemption"]
    assert lost["gpu_h"] == pytest.approx(2 * 4 * (60 + 120) / 3600, abs=1e-6)
    assert lost["restore_gpu_h"] == pytest.approx(2 * 4 * 120 / 3600, abs=1e-6)
    assert lost["by_allocation"]["beta"]["gpu_h"] == lost["gpu_h"]
    assert lost["by_allocation"]["alpha"]["gpu_h"] == 0.0
    assert lost["by_kind"]["training"] == lost["gpu_h"]
    assert (lost["preempted_attempts"], lost["saved_on_notice"]) == (2, 2)
    assert record.checkpointing is not None
    assert record.checkpointing["training"] == plan.of("training").as_json()


def test_periodic_saves_only_lose_the_work_since_the_last_one_and_cost_time() -> None:
    plan = CheckpointPlan(default=cp(3600, save=60, restore=120))
    record = reclaim_run(plan)
    lost = build_report(record)["lost_to_preemption"]
    # preempted at t=2100, before their first save (progress 3600): restart from zero
    assert lost["allocated_gpu_h"] == pytest.approx(2 * 4 * 2100 / 3600, abs=1e-6)
    assert lost["restore_gpu_h"] == 0.0 and lost["saved_on_notice"] == 0
    for _, (again, last) in victims(record).values():
        assert last - again == pytest.approx(21600.0 + 5 * 60.0)  # 5 saves before the end
    assert lost["periodic_save_gpu_h"] > 0


def test_every_resumable_completed_workload_gets_exactly_its_duration_of_progress() -> None:
    plan = CheckpointPlan(default=cp(1000, notice=True, save=90, restore=200))
    record = reclaim_run(plan)
    durations = {j.workload.id: j.duration_s for j in read_trace(RECLAIM / "trace.csv")}
    held: dict[str, float] = defaultdict(float)
    for s in record.segments:
        held[s.workload_id] += s.end - s.start
    spent: dict[str, float] = defaultdict(float)
    for c in record.attempt_costs:
        spent[c.workload_id] += c.lost_s + c.saves_s
    for job in record.jobs:
        if job.state == "completed":
            assert held[job.workload_id] == pytest.approx(
                durations[job.workload_id] + spent[job.workload_id]
            )


def test_jobs_csv_carries_each_jobs_lost_gpu_seconds_only_when_modelled() -> None:
    plan = CheckpointPlan({"training": cp(notice=True, save=60, restore=120)})
    rows = [r.split(",") for r in jobs_csv(reclaim_run(plan)).splitlines()]
    assert rows[0][-1] == "lost_gpu_s"
    lost = sorted(r[-1] for r in rows[1:] if r[-1] != "0")
    assert lost == ["720", "720"]  # 4 GPUs x (60 s save + 120 s restore)
    plain = [r.split(",") for r in jobs_csv(reclaim_run(None)).splitlines()]
    assert {r[-1] for r in plain[1:]} == {""}


# --- the option -------------------------------------------------------------------------


def test_checkpoint_values_become_a_plan_per_kind_with_a_default() -> None:
    plan = checkpoint_plan(["*:every=1h,save=1m,restore=2m", "training:notice,save=30s"], 300)
    assert plan.of("filler") == cp(3600, save=60, restore=120)
    assert plan.of("training") == cp(notice=True, save=30)
    assert checkpoint_plan([], 300) == CheckpointPlan()
    assert checkpoint_plan(["eval:none"], 300).of("eval") == cp()
    assert checkpoint_plan(["eval:none"], 300).of("debug") == TODAY


BAD_SPECS = {
    "no colon": ("notice", "is not KIND:SPEC"),
    "no kind": (":notice", "is not KIND:SPEC"),
    "an empty spec": ("training:", "is not KIND:SPEC"),
    "an unknown word": ("training:notice,often", "unknown word 'often'"),
    "a bad duration": ("training:every=1x", "every: '1x' is not a duration"),
    "an empty duration": ("training:every=", "every: '' is not a duration"),
    "every 0": ("training:every=0", "every must be more than 0"),
    "notice with a value": ("training:notice=1m", "write notice, not 'notice=1m'"),
    "save without a value": ("training:notice,save", "write save=DUR"),
    "a word twice": ("training:every=1h,every=2h", "every given twice"),
    "none with another word": ("training:none,restore=1m", "none saves nothing"),
    "no word saying when": ("training:save=1m", "say when it saves"),
    "a save on notice longer than the grace": (
        "training:notice,save=10m",
        "save=10.0m is longer than the grace period (--grace 5.0m)",
    ),
}


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_a_bad_checkpoint_value_is_refused_naming_the_option_and_the_reason(case: str) -> None:
    text, reason = BAD_SPECS[case]
    with pytest.raises(ValidationError) as caught:
        checkpoint_plan([text], 300)
    assert caught.value.field == "--checkpoint"
    assert reason in caught.value.reason and repr(text) in caught.value.reason


def test_a_kind_named_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="names kind 'training' twice"):
        checkpoint_plan(["training:notice", "training:none"], 300)


def test_the_cli_refuses_a_kind_the_trace_lacks_and_reports_the_settings(tmp_path: Path) -> None:
    inputs = [f"--{name}={RECLAIM / f'{name}.yaml'}" for name in ("cluster", "budgets")]
    inputs.append(f"--trace={RECLAIM / 'trace.csv'}")

    def allot(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "allot.cli.main", "simulate", *inputs, "--quiet", *argv],
            capture_output=True,
            text=True,
            check=False,
        )

    done = allot("--checkpoint", "trainig:notice", "--out", str(tmp_path / "typo"))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "allot simulate: --checkpoint: 'trainig:notice': no workload of kind 'trainig' in "
        "the trace (kinds: debug, training)"
    )
    done = allot("--checkpoint", "*:notice,save=1m,restore=2m", "--out", str(tmp_path / "ok"))
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "ok" / "report.html").read_text(encoding="utf-8")
    assert "Work lost to preemption" in html and "GPU-hours lost to preemption" in html
