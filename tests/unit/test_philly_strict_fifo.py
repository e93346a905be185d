"""Head-of-line FIFO per VC on the Philly 7-day window reproduces the published per-VC FIFO
means of HeliosArtifact's simulator (mean queueing delay 289.0 s, mean JCT 8,118 s), and
the backfilling ``partitioned`` does not (it starts small jobs behind a blocked head)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
PUBLISHED = {"wait": 289.0, "jct": 8118.0}  # HeliosArtifact, per-VC FIFO, same 10,650 jobs


def test_partitioned_strict_reproduces_the_published_per_vc_fifo_means(tmp_path: Path) -> None:
    out = tmp_path / "week"
    done = subprocess.run(
        [
            sys.executable, "-m", "allot.cli.main", "simulate",
            "--philly", str(TRACES), "--philly-window", "2017-10-01:2017-10-08",
            "--compare", "partitioned,partitioned-strict", "--out", str(out), "--quiet",
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    strict = json.loads((out / "partitioned-strict" / "report.json").read_text())
    backfill = json.loads((out / "partitioned" / "report.json").read_text())
    assert strict["workloads"] == backfill["workloads"] == 10_650
    assert strict["wait_s"]["all"]["mean"] == pytest.approx(PUBLISHED["wait"], rel=0.01)
    assert strict["jct_s"]["mean"] == pytest.approx(PUBLISHED["jct"], rel=0.01)
    assert backfill["wait_s"]["all"]["mean"] < 0.5 * PUBLISHED["wait"]  # backfill is not FIFO


@pytest.mark.parametrize(
    ("window", "reason"),
    [("2017-10-01", "FROM:TO"), ("2017-10-08:2017-10-01", "ends before it starts")],
)
def test_a_bad_window_is_refused_naming_the_flag(window: str, reason: str) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "allot.cli.main", "simulate", "--philly", str(TRACES),
            "--philly-window", window, "--out", "/nonexistent/never", "--quiet",
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--philly-window" in done.stderr and reason in done.stderr
