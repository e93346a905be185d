"""``allot simulate`` end to end, as a user runs it (a subprocess of ``allot.cli.main``):
the files it writes, ``--compare``, and bad input ending in exit 2 with one line on stderr
that names the field."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

EXIT_BAD_INPUT = 2

REPORT_KEYS = {  # allot.sim.report's module docstring, "Keys"
    "policy",
    "seed",
    "span_s",
    "submissions_s",
    "drain_s",
    "scenario",  # the trace was made by `allot scenario`: its scenario.json is beside it
    "workloads",
    "completed",
    "preemptions",
    "requeues",
    "occupancy",
    "unallocated_fraction_observed",
    "occupancy_observed",
    "unallocated_fraction",
    "owed_delivered",
    "wait_s",
    "jct_s",
    "timeseries",
    "final_fairshare",
    "preemption_rate",
    "unallocated_goodput",
    "reservations",
    "checkpointing",
    "lost_to_preemption",
}
OWED_KEYS = {"overall", "by_allocation", "by_program", "teams", "teams_at_or_above_095"}
WAIT_KEYS = {
    "all",
    "allocated",
    "unallocated",
    "by_kind",
    "by_size",
    "by_allocation",
    "cdf_by_kind",
}
TIMESERIES_KEYS = {
    "bucket_s",
    "start_s",
    "buckets",
    "observed_buckets",
    "capacity_gpu_h",
    "busy_gpu_h",
    "occupancy",
    "unallocated_share",
    "preemptions",
    "owed_gpu_h",
    "delivered_gpu_h",
}


def allot(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "allot.cli.main", *map(str, argv)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-day Ai2-like scenario (about 1,200 jobs on 48 hosts)."""
    out = tmp_path_factory.mktemp("ai2")
    done = allot("scenario", "ai2", "--seed", "2", "--days", "1", "--out", out)
    assert done.returncode == 0, done.stderr
    return out


def inputs(scenario: Path) -> list[str | Path]:
    return [
        "--cluster",
        scenario / "cluster.yaml",
        "--budgets",
        scenario / "budgets.yaml",
        "--trace",
        scenario / "trace.csv",
    ]


def trace_rows(path: Path) -> int:
    with path.open(newline="") as handle:
        return sum(1 for _ in csv.DictReader(handle))


def test_one_policy_writes_report_json_and_html(scenario: Path, tmp_path: Path) -> None:
    out = tmp_path / "fifo"
    done = allot("simulate", *inputs(scenario), "--policy", "fifo", "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert set(report) == REPORT_KEYS
    assert set(report["owed_delivered"]) == OWED_KEYS
    assert set(report["wait_s"]) == WAIT_KEYS
    assert set(report["timeseries"]) == TIMESERIES_KEYS
    assert report["policy"] == "fifo"
    assert report["workloads"] == trace_rows(scenario / "trace.csv") > 0
    made = json.loads((scenario / "scenario.json").read_text())
    assert report["scenario"] == {"name": "ai2", "seed": made["seed"]}
    assert report["submissions_s"] + report["drain_s"] == pytest.approx(report["span_s"])
    waits = report["wait_s"]
    assert waits["allocated"]["n"] + waits["unallocated"]["n"] == waits["all"]["n"]
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "fifo" in html
    assert f"scenario ai2 seed {made['seed']}, simulation seed" in html
    assert "wait of allocated work" in html and "wait of unallocated work" in html
    assert sorted(p.name for p in out.iterdir()) == ["jobs.csv", "report.html", "report.json"]
    with (out / "jobs.csv").open(newline="") as handle:
        jobs = list(csv.DictReader(handle))
    assert len(jobs) == report["workloads"]
    started = [j for j in jobs if j["first_start_s"]]
    assert started and all(
        float(j["wait_s"]) == pytest.approx(float(j["first_start_s"]) - float(j["submit_s"]))
        for j in started
    )
    assert sum(int(j["preemptions"]) for j in jobs) == report["preemptions"]
    assert "fifo" in done.stdout.splitlines()[0]  # the summary table's header


def test_compare_writes_a_folder_per_policy_and_compare_json(
    scenario: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cmp"
    done = allot("simulate", *inputs(scenario), "--compare", "fifo,partitioned", "--out", out)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "compare.html",
        "compare.json",
        "fifo",
        "partitioned",
    ]
    for policy in ("fifo", "partitioned"):
        report = json.loads((out / policy / "report.json").read_text(encoding="utf-8"))
        assert report["policy"] == policy
        assert (out / policy / "report.html").is_file()
    compare = json.loads((out / "compare.json").read_text(encoding="utf-8"))
    assert set(compare) == {"fifo", "partitioned"}
    assert compare["fifo"]["workloads"] == compare["partitioned"]["workloads"]
    header = done.stdout.splitlines()[0].split()
    assert header == ["fifo", "partitioned"]
    # one side-by-side page, each column linking its policy's own report
    page = (out / "compare.html").read_text(encoding="utf-8")
    assert '<a href="fifo/report.html">fifo</a>' in page
    assert '<a href="partitioned/report.html">partitioned</a>' in page
    for label in ("allocated wait p90", "unallocated wait p90", "drain after them"):
        assert f"<td>{label}</td>" in page
        assert any(line.startswith(label) for line in done.stdout.splitlines())


class BadInput(NamedTuple):
    argv: list[str | Path]
    names: tuple[str, ...]  # what the one stderr line must mention


def bad_inputs(scenario: Path, tmp: Path) -> dict[str, BadInput]:
    stray = tmp / "stray.csv"
    with (scenario / "trace.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[3]["allocation"] = "nobody"
    with stray.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows[:10])
    latin1 = tmp / "latin1.csv"  # the decode error comes while the rows are read
    latin1.write_bytes(b"job_id,submit_time_s,gpus,duration_s,user\n1,0,1,60,Ren\xe9\n")
    listed = tmp / "list.yaml"
    listed.write_text("- {prefix: node-, count: 2, gpus: 8}\n", encoding="utf-8")
    negative = tmp / "negative.yaml"
    negative.write_text(
        "name: root\nchildren:\n  - {name: vision, shares: -30}\n", encoding="utf-8"
    )
    base = inputs(scenario)
    return {
        "budget tree with a negative share": BadInput(
            [*base[:2], "--budgets", negative, *base[4:]],
            ("--budgets", str(negative), "vision", "shares"),
        ),
        "unknown policy in --compare": BadInput(
            [*base, "--compare", "fifo,bogus"], ("--compare", "bogus")
        ),
        "trace names an allocation the tree lacks": BadInput(
            [*base[:4], "--trace", stray],
            (str(stray), rows[3]["job_id"], "allocation", "nobody"),
        ),
        "cluster YAML is a list, not a mapping": BadInput(
            ["--cluster", listed, *base[2:]], (str(listed), "mapping")
        ),
        "no --cluster and no --philly": BadInput(base[2:], ("--cluster", "--philly")),
        "--philly folder without the trace": BadInput(
            ["--philly", tmp], ("--philly", str(tmp), "philly_pollux.csv", "README")
        ),
        "--trace that does not exist": BadInput(
            [*base[:4], "--trace", tmp / "absent.csv"], (str(tmp / "absent.csv"), "no such file")
        ),
        "--trace that is a folder": BadInput([*base[:4], "--trace", tmp], (str(tmp), "directory")),
        "--trace that is not UTF-8 after its header": BadInput(
            [*base[:4], "--trace", latin1], (str(latin1), "not UTF-8")
        ),
        "--window 0": BadInput([*base, "--window", "0"], ("--window", "more than 0")),
        "--half-life 0": BadInput([*base, "--half-life", "0s"], ("--half-life", "more than 0")),
        "--rank-every 0 (an interval)": BadInput(
            [*base, "--rank-every", "0"], ("--rank-every", "more than 0")
        ),
        "--short-lane as many hosts as the cluster": BadInput(
            [*base, "--short-lane", "9999"], ("--short-lane", "outside the lane")
        ),
        "--short-lane -1": BadInput([*base, "--short-lane", "-1"], ("--short-lane", ">= 0")),
        "--short-lane with baselines only": BadInput(
            [*base, "--compare", "fifo,priority", "--short-lane", "1"],
            ("--short-lane", "only Fair Tree"),
        ),
        "--jobs 0 (would read as the CPU count)": BadInput(
            [*base, "--jobs", "0"], ("--jobs", "at least 1")
        ),
        "--jobs -1": BadInput([*base, "--jobs", "-1"], ("--jobs", "at least 1")),
        "--unallocated-settle beyond what the state remembers": BadInput(
            [*base, "--unallocated-settle", "2h"], ("--unallocated-settle", "from 0 to 3600")
        ),
        "--min-runtime above the 8 h contract": BadInput(
            [*base, "--min-runtime", "9h"], ("--min-runtime", "8.0h", "9.0h")
        ),
        "--compare with no policy at all": BadInput([*base, "--compare", ","], ("--compare",)),
        "--compare that is empty": BadInput([*base, "--compare", ""], ("--compare",)),
        "--compare with an empty name": BadInput(
            [*base, "--compare", "fifo,,partitioned"], ("--compare", "fifo,,partitioned")
        ),
        "--compare naming a policy twice": BadInput(
            [*base, "--compare", "fifo,fifo"], ("--compare", "twice")
        ),
        "--policy with --compare": BadInput(
            [*base, "--policy", "fifo", "--compare", "fifo,partitioned"],
            ("--compare", "not allowed with", "--policy"),
        ),
        "--philly with --cluster": BadInput(
            ["--philly", tmp, *base[:2]], ("--philly", "not allowed with", "--cluster")
        ),
        "--philly with --budgets": BadInput(
            ["--philly", tmp, *base[2:4]], ("--philly", "not allowed with", "--budgets")
        ),
        "--philly with --trace": BadInput(
            ["--philly", tmp, *base[4:]], ("--philly", "not allowed with", "--trace")
        ),
    }


BAD_IDS = [
    "budget tree with a negative share",
    "unknown policy in --compare",
    "trace names an allocation the tree lacks",
    "cluster YAML is a list, not a mapping",
    "no --cluster and no --philly",
    "--philly folder without the trace",
    "--trace that does not exist",
    "--trace that is a folder",
    "--trace that is not UTF-8 after its header",
    "--window 0",
    "--half-life 0",
    "--rank-every 0 (an interval)",
    "--jobs 0 (would read as the CPU count)",
    "--jobs -1",
    "--short-lane as many hosts as the cluster",
    "--short-lane -1",
    "--short-lane with baselines only",
    "--unallocated-settle beyond what the state remembers",
    "--min-runtime above the 8 h contract",
    "--compare with no policy at all",
    "--compare that is empty",
    "--compare with an empty name",
    "--compare naming a policy twice",
    "--policy with --compare",
    "--philly with --cluster",
    "--philly with --budgets",
    "--philly with --trace",
]


def test_a_trace_that_names_no_allocation_gets_a_note(scenario: Path, tmp_path: Path) -> None:
    """Every job then runs unallocated and the report's owed->delivered is empty: said
    once on stderr rather than left for the reader to notice (a new user's walkthrough)."""
    with (scenario / "trace.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))[:20]
    trace = tmp_path / "no-alloc.csv"
    with trace.open("w", newline="") as handle:
        fields = [f for f in rows[0] if f != "allocation"]
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    base = inputs(scenario)
    done = allot("simulate", *base[:4], "--trace", trace, "--out", tmp_path / "out", "--quiet")
    assert done.returncode == 0, done.stderr
    assert f"no job of {trace} names an allocation" in done.stderr
    plain = allot("simulate", *base, "--out", tmp_path / "out2", "--quiet")
    assert plain.returncode == 0 and "names an allocation" not in plain.stderr


def test_short_lane_replaces_the_cluster_files_lane(scenario: Path, tmp_path: Path) -> None:
    """``--short-lane`` sets the lane: the file's count is not read, so one too large for
    the cluster (refused without the flag) does not stop a run that names its own."""
    data = yaml.safe_load((scenario / "cluster.yaml").read_text(encoding="utf-8"))
    data["short_lane"] = 9999
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(data), encoding="utf-8")
    argv = [
        "simulate",
        "--cluster",
        cluster,
        "--budgets",
        scenario / "budgets.yaml",
        "--trace",
        scenario / "trace.csv",
        "--quiet",
    ]
    refused = allot(*argv, "--out", tmp_path / "refused")
    assert refused.returncode == EXIT_BAD_INPUT
    assert "short_lane" in refused.stderr and "outside the lane" in refused.stderr
    done = allot(*argv, "--short-lane", "1", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert report["short_lane"] == ["node-0047"]  # the last of the scenario's 48 hosts


@pytest.mark.parametrize("case", BAD_IDS)
def test_bad_input_is_exit_2_and_one_line_naming_the_field(
    case: str, scenario: Path, tmp_path: Path
) -> None:
    bad = bad_inputs(scenario, tmp_path)[case]
    out = tmp_path / "out"
    done = allot("simulate", *bad.argv, "--out", out, "--quiet")
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("allot simulate: ")
    for name in bad.names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    assert "Traceback" not in done.stderr
    assert not (out / "report.json").exists()


def bad_outs(tmp: Path) -> dict[str, tuple[Path, str, tuple[str, ...]]]:
    """Each case: the --out to pass, the --compare list, and what the stderr line names."""
    a_file = tmp / "existing.yaml"
    a_file.write_text("not a folder\n", encoding="utf-8")
    taken = tmp / "taken"
    taken.mkdir(exist_ok=True)
    (taken / "partitioned").write_text("", encoding="utf-8")
    return {
        "--out that is a regular file": (a_file, "fifo", (str(a_file), "a file, not a folder")),
        "--out under a regular file": (a_file / "sub", "fifo", (str(a_file / "sub"), "is a file")),
        "--out where nothing can be created": (Path("/proc/x"), "fifo", ("/proc/x", "cannot")),
        "--compare folder that is a regular file": (
            taken,
            "fifo,partitioned",
            (str(taken / "partitioned"), "a file, not a folder"),
        ),
    }


OUT_IDS = [
    "--out that is a regular file",
    "--out under a regular file",
    "--out where nothing can be created",
    "--compare folder that is a regular file",
]


@pytest.mark.parametrize("case", OUT_IDS)
def test_unwritable_out_is_exit_2_and_one_line_naming_out(
    case: str, scenario: Path, tmp_path: Path
) -> None:
    out, compare, names = bad_outs(tmp_path)[case]
    done = allot("simulate", *inputs(scenario), "--compare", compare, "--out", out, "--quiet")
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("allot simulate: --out: ")
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
