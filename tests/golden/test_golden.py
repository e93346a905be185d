"""Golden tests for the simulator: fixed cases in, committed reports out, byte for byte.

Each ``cases/<name>/`` folder says in its README what it probes; ``golden_harness`` runs it
through the same pieces as ``allot simulate``. A golden diff is reviewed, never patched by
hand: regenerate with ``make golden``. Beside the byte comparison, each case asserts the
facts its README reasons out by hand, so a regenerated file cannot quietly bless a wrong
decision; and the simulation and the scenario generator must be repeatable to the byte
(in this process, in the CLI under other hash seeds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from golden_harness import CASES, CASES_DIR, EXPECTED, render, run_case, simulate_case

from allot.sim.record import SimRecord

CASE_FILES = ("cluster.yaml", "budgets.yaml", "trace.csv", "README.md", EXPECTED)


def cli(*argv: str, hash_seed: str = "0") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run(
        [sys.executable, "-m", "allot.cli.main", *argv],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def first_start(record: SimRecord, workload_id: str) -> float | None:
    (job,) = [j for j in record.jobs if j.workload_id == workload_id]
    return job.first_start


def segments(record: SimRecord, workload_id: str) -> list[tuple[float, float]]:
    return sorted((s.start, s.end) for s in record.segments if s.workload_id == workload_id)


def ratio(report: dict[str, Any], allocation: str) -> float | None:
    value: float | None = report["owed_delivered"]["by_allocation"][allocation]["ratio"]
    return value


# --- the committed files --------------------------------------------------------------


def test_every_case_folder_is_listed_and_complete() -> None:
    folders = sorted(p.name for p in CASES_DIR.iterdir() if p.is_dir())
    assert folders == sorted(CASES)
    for name in folders:
        for file in CASE_FILES:
            assert (CASES_DIR / name / file).is_file(), f"{name}/{file} is missing"


@pytest.mark.parametrize("name", list(CASES))
def test_report_matches_the_committed_golden_file(name: str) -> None:
    expected = (CASES_DIR / name / EXPECTED).read_text(encoding="utf-8")
    actual = run_case(name)
    assert actual == expected, (
        f"{name}: the report differs from {EXPECTED}; if the change is intended, run "
        "`make golden` and review the diff"
    )


@pytest.mark.parametrize("name", list(CASES))
def test_the_same_case_twice_gives_the_same_bytes(name: str) -> None:
    assert run_case(name) == run_case(name)


@pytest.mark.parametrize("name", list(CASES))
def test_the_cli_writes_the_golden_report(name: str, tmp_path: Path) -> None:
    """``allot simulate`` itself (another process, another hash seed) writes exactly the
    golden report: the harness and the CLI take the same path."""
    case = CASES_DIR / name
    policies = CASES[name]
    choice = ["--compare", ",".join(policies)] if len(policies) > 1 else ["--policy", policies[0]]
    done = cli(
        "simulate",
        "--cluster",
        str(case / "cluster.yaml"),
        "--budgets",
        str(case / "budgets.yaml"),
        "--trace",
        str(case / "trace.csv"),
        *choice,
        "--out",
        str(tmp_path),
        "--quiet",
        hash_seed="12345",
    )
    assert done.returncode == 0, done.stderr
    expected = json.loads((case / EXPECTED).read_text(encoding="utf-8"))
    for policy in policies:
        folder = tmp_path / policy if len(policies) > 1 else tmp_path
        written = (folder / "report.json").read_text(encoding="utf-8")
        assert written == render(expected[policy]), f"{policy}: CLI report differs"


def test_scenario_ai2_is_byte_identical_across_runs(tmp_path: Path) -> None:
    outs = []
    for run, hash_seed in (("one", "1"), ("two", "2")):
        out = tmp_path / run
        done = cli(
            "scenario", "ai2", "--seed", "3", "--days", "2", "--out", str(out), hash_seed=hash_seed
        )
        assert done.returncode == 0, done.stderr
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir())
    assert names == ["budgets.yaml", "cluster.yaml", "scenario.json", "trace.csv"]
    assert sorted(p.name for p in outs[1].iterdir()) == names
    for file in names:
        first = (outs[0] / file).read_bytes()
        assert first, f"{file} is empty"
        assert first == (outs[1] / file).read_bytes(), f"{file} differs between two runs"


# --- hand-reasoned facts, one function per case -------------------------------------------


def check_reclaim(record: SimRecord, report: dict[str, Any]) -> None:
    # Beta held 16 GPUs, twice its entitlement of 8; alpha reclaims exactly the 8 above it.
    assert report["preemptions"] == 2
    assert report["requeues"] == 2
    assert {p.allocation for p in record.preemptions} == {"beta"}
    assert {p.reason for p in record.preemptions} == {"reclaimed-for-entitlement"}
    # ... not before beta's protection ends (t=1800), not later either.
    assert [p.time for p in record.preemptions] == [1800.0, 1800.0]
    assert sum(p.gpus for p in record.preemptions) == 8
    # Alpha starts when the notices expire: 1800 + 300 s grace.
    for alpha in ("alpha-1", "alpha-2"):
        assert first_start(record, alpha) == 2100.0
        assert segments(record, alpha) == [(2100.0, 16500.0)]
    # Owed 8 GPUs from 600 to 16500, delivered from 2100: 14400 / 15900.
    assert ratio(report, "alpha") == pytest.approx(14400 / 15900, abs=1e-6)
    assert ratio(report, "beta") == 1.0
    # The victims resumed (not restarted): 21600 s of work in two pieces.
    for victim in ("beta-1", "beta-2"):
        pieces = segments(record, victim)
        assert pieces[0] == (0.0, 2100.0)
        assert sum(end - start for start, end in pieces) == 21600.0
    assert report["completed"] == report["workloads"] == 7


def check_drain(record: SimRecord, report: dict[str, Any]) -> None:
    assert report["preemptions"] == 2
    assert report["requeues"] == 2
    assert {p.reason for p in record.preemptions} == {"host-drain"}
    by_id = {p.workload_id: p for p in record.preemptions}
    # The filler is never protected: noticed the moment the host turns unhealthy.
    assert by_id["nlp-filler"].time == 1800.0
    # The eval is protected until its start (60) + min_runtime (3600), not a second less.
    assert by_id["nlp-eval"].time == 3660.0
    assert segments(record, "nlp-eval") == [(60.0, 3960.0), (3960.0, 10860.0)]
    # Work on a healthy host is untouched.
    assert segments(record, "vision-train") == [(0.0, 10800.0)]
    # Healthy capacity: 24, 16 from t=1800, 24 again from t=14400.
    capacity = report["timeseries"]["capacity_gpu_h"]
    assert capacity[:5] == [20.0, 16.0, 16.0, 16.0, 24.0]
    assert report["completed"] == report["workloads"] == 4


def check_gang(record: SimRecord, report: dict[str, Any]) -> None:
    assert report["preemptions"] == 2
    # Only unallocated fillers are preempted, and only those on the two cleared hosts.
    assert {p.workload_id for p in record.preemptions} == {"fill-a", "fill-c"}
    assert {p.reason for p in record.preemptions} == {"displaced-unallocated"}
    assert all(p.allocation is None and p.time == 600.0 for p in record.preemptions)
    assert sum(p.gpus for p in record.preemptions) == 12
    # Gang 1 waits out the unallocated victims' grace (30 s) rather than starting on the 4
    # free fragments.
    assert first_start(record, "pt-gang-1") == 630.0
    # Gang 2 cannot clear two hosts and waits for gang 1's two whole hosts.
    assert first_start(record, "pt-gang-2") == segments(record, "pt-gang-1")[0][1] == 7830.0
    for protected in ("evals-run", "pt-probe", "fill-b"):
        assert len(segments(record, protected)) == 1, f"{protected} was interrupted"
    assert report["completed"] == report["workloads"] == 7


def check_short_lane(record: SimRecord, report: dict[str, Any]) -> None:
    # Short work starts in the lane: after the filler's 30 s grace, then on free GPUs.
    assert first_start(record, "alpha-dbg-1") == 930.0
    assert first_start(record, "alpha-dbg-2") == 1200.0
    # The filler was the lane's one victim; beta's protected work was nobody's until 8 h.
    notices = [(p.workload_id, p.time, p.reason) for p in record.preemptions]
    assert notices == [
        ("fill-1", 900.0, "displaced-unallocated"),
        ("beta-1", 28800.0, "reclaimed-for-entitlement"),
    ]
    # Long allocated work never takes the lane, even its unallocated work: it waits for
    # beta's protection to end, then the grace.
    assert first_start(record, "alpha-long") == 29100.0
    # The filler resumes once the first debug job has left and its GPU settled (60 s).
    assert segments(record, "fill-1") == [(0.0, 930.0), (1890.0, 22560.0)]
    assert report["completed"] == report["workloads"] == 6


def check_fifo(record: SimRecord, report: dict[str, Any]) -> None:
    assert report["preemptions"] == 0
    assert first_start(record, "red-1") == 7200.0
    assert first_start(record, "red-2") == 7200.0


def check_partitioned(record: SimRecord, report: dict[str, Any]) -> None:
    assert report["preemptions"] == 0
    assert first_start(record, "red-1") == 60.0
    assert first_start(record, "red-2") == 3660.0
    assert first_start(record, "blue-2") == 7200.0


def check_priority(record: SimRecord, report: dict[str, Any]) -> None:
    assert report["preemptions"] == 1
    (notice,) = record.preemptions
    assert (notice.workload_id, notice.reason, notice.time) == ("blue-1", "higher-class", 60.0)
    assert first_start(record, "red-1") == 360.0
    assert segments(record, "blue-2") == [(0.0, 7200.0)]  # opted out: never touched
    assert first_start(record, "red-2") == 7200.0


FACTS: dict[tuple[str, str], Callable[[SimRecord, dict[str, Any]], None]] = {
    ("reclaim", "fairshare"): check_reclaim,
    ("drain", "fairshare"): check_drain,
    ("gang", "fairshare"): check_gang,
    ("short-lane", "fairshare"): check_short_lane,
    ("baselines", "fifo"): check_fifo,
    ("baselines", "partitioned"): check_partitioned,
    ("baselines", "priority"): check_priority,
}


def test_every_case_and_policy_has_hand_checked_facts() -> None:
    assert set(FACTS) == {(name, policy) for name, policies in CASES.items() for policy in policies}


@pytest.mark.parametrize(("name", "policy"), list(FACTS), ids=[f"{n}-{p}" for n, p in FACTS])
def test_hand_reasoned_facts(name: str, policy: str) -> None:
    record, report = simulate_case(name, policy)
    FACTS[name, policy](record, report)
