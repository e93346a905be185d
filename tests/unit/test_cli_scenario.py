"""``allot scenario`` as a user runs it (a subprocess of ``allot.cli.main``): a bad flag
ends in exit 2 and one line on stderr naming the flag the user typed (not a field of
``Ai2Knobs``), and ``--hosts`` alone never clashes with the default host failures."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from allot.sim.cluster import load_cluster

EXIT_BAD_INPUT = 2


def allot(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    # The timeout turns a generator that never stops (--demand inf) into a failure.
    return subprocess.run(
        [sys.executable, "-m", "allot.cli.main", *map(str, argv)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def existing_file(tmp: Path) -> Path:
    path = tmp / "existing.yaml"
    path.write_text("not a folder\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        pytest.param(["--days", "0"], ("--days", "positive"), id="no-days"),
        pytest.param(["--days", "-2"], ("--days", "positive"), id="negative-days"),
        pytest.param(["--demand", "0"], ("--demand", "> 0"), id="no-demand"),
        pytest.param(["--demand", "inf"], ("--demand", "finite"), id="infinite-demand"),
        pytest.param(["--demand", "nan"], ("--demand",), id="nan-demand"),
        pytest.param(["--hosts", "0"], ("--hosts", "positive"), id="no-hosts"),
        pytest.param(["--max-gang", "32"], ("--max-gang", "from 64"), id="gang-too-small"),
        pytest.param(["--debug-share", "0.9"], ("--debug-share", "room"), id="debug-too-big"),
        pytest.param(["--short-lane", "-1"], ("--short-lane", "from 0"), id="negative-lane"),
        pytest.param(["--short-lane", "48"], ("--short-lane", "hosts - 1"), id="all-in-the-lane"),
    ],
)
def test_bad_knob_flag_is_exit_2_and_one_line_naming_the_flag(
    flags: list[str], names: tuple[str, ...], tmp_path: Path
) -> None:
    done = allot("scenario", "ai2", "--seed", "1", "--out", tmp_path / "out", *flags)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("allot scenario: ")
    assert "knobs" not in lines[0]
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    assert not (tmp_path / "out" / "trace.csv").exists()


@pytest.mark.parametrize(
    ("out_of", "names"),
    [
        pytest.param(existing_file, ("existing.yaml", "a file, not a folder"), id="a-regular-file"),
        pytest.param(
            lambda tmp: existing_file(tmp) / "sub",
            ("existing.yaml/sub", "is a file"),
            id="under-a-file",
        ),
        pytest.param(lambda _: Path("/proc/x"), ("/proc/x", "cannot"), id="nothing-can-be-created"),
    ],
)
def test_unwritable_out_is_exit_2_and_one_line_naming_out(
    out_of: Callable[[Path], Path], names: tuple[str, ...], tmp_path: Path
) -> None:
    out = out_of(tmp_path)
    done = allot("scenario", "ai2", "--seed", "1", "--days", "1", "--out", out)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("allot scenario: --out: ")
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"


@pytest.mark.parametrize(
    ("hosts", "failures"),
    [
        pytest.param(1, 1, id="one-host-fails-once"),
        pytest.param(3, 3, id="fewer-hosts-than-the-default-failures"),
        pytest.param(48, 4, id="the-default-cluster-keeps-four"),
    ],
)
def test_host_failures_follow_hosts(hosts: int, failures: int, tmp_path: Path) -> None:
    done = allot("scenario", "ai2", "--days", "1", "--hosts", str(hosts), "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    cluster = yaml.safe_load((tmp_path / "cluster.yaml").read_text(encoding="utf-8"))
    failing = {e["host"] for e in cluster["health_events"] if e["event"] == "unhealthy"}
    assert len(failing) == failures


@pytest.mark.parametrize(
    ("flags", "lane"),
    [
        pytest.param([], ["node-0047"], id="one-host-by-default"),
        pytest.param(["--short-lane", "2"], ["node-0046", "node-0047"], id="two"),
        pytest.param(["--short-lane", "0"], [], id="none"),
        pytest.param(["--hosts", "1"], [], id="a-one-host-cluster-keeps-its-host"),
    ],
)
def test_the_short_lane_is_written_with_the_cluster(
    flags: list[str], lane: list[str], tmp_path: Path
) -> None:
    done = allot("scenario", "ai2", "--days", "1", *flags, "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load((tmp_path / "cluster.yaml").read_text(encoding="utf-8"))
    assert list(load_cluster(data).short_lane) == lane
