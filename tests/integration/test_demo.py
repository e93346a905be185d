"""The README's main job, ``allot demo`` (``make run``), end to end on embedded servers: it
runs to its summary, and runs again in the same run directory (the previous run's log must
not answer the new run's submissions as duplicates of long-ended work)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _demo(run_dir: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "allot.cli.main", "demo", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_demo_runs_twice_in_one_run_dir(tmp_path: Path) -> None:
    for _ in range(2):
        out = _demo(tmp_path / "demo")
        assert "NOTICE" in out and "reclaimed-for-entitlement" in out
        # One request, one round of notices: speech's 4 GPUs cost vision one run, and
        # vision's requeued run takes no one else's (it used to cascade to search, nlp).
        taken = [
            line
            for line in out.splitlines()
            if "NOTICE" in line and "displaced-unallocated" not in line
        ]
        assert len(taken) == 1 and "for speech's" in taken[0], taken
        assert "$ allot queue" in out and "$ allot owed" in out
        assert out.rstrip().endswith("== stack stopped")
