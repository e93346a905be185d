"""``allot whatif`` without a server: a history exported to a folder is replayed under the
current and a proposed tree (``--from``); raising an allocation's shares on a contended
history raises what it is delivered; a replay is reported over the window only
(``allot.sim.record_window``); bad input names the option."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from allot.cli import history_cmds
from allot.core.errors import ValidationError
from allot.eventlog.window_history import WindowHistory
from allot.proto import messages as m
from allot.sim.record import CapacityChange, JobOutcome, Preemption, Segment, SimRecord, Waiting
from allot.sim.record_window import window_record

T0 = 1_800_000_000.0
WINDOW = 3600.0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="allot")
    history_cmds.register(ap.add_subparsers(dest="command", required=True))
    return ap


def run(*argv: str) -> int:
    args = parser().parse_args(list(argv))
    code: int = args.func(args)
    return code


def write_history(tmp_path: Path, hosts: tuple[str, ...], name: str) -> Path:
    """An hour of history on 8-GPU ``hosts``: nlp and cv each keep 8 GPUs' worth of 4-GPU,
    10-minute work waiting, submitted at the window's start; exported to ``name``."""
    window = WindowHistory(T0, T0 + WINDOW)
    spec = m.BudgetNodeSpec(
        name="root",
        children=(m.BudgetNodeSpec(name="nlp", shares=1), m.BudgetNodeSpec(name="cv", shares=1)),
    )
    records: list[object] = [m.HostRegistered(host=h, gpus=8, at=T0) for h in hosts]
    records.append(m.BudgetTreeSet(at=T0, by="bootstrap", tree=spec))
    for alloc in ("nlp", "cv"):
        for i in range(12):
            records.append(
                m.WorkloadSubmitted(
                    workload_id=f"{alloc}-{i:02d}",
                    client_id=f"{alloc}-{i:02d}",
                    user=alloc,
                    gpus=4,
                    allocation=alloc,
                    min_runtime_s=60,
                    duration_s=600.0,
                    at=T0 + i,
                )
            )
    for record in records:
        window.apply(record)  # type: ignore[arg-type]
    folder = tmp_path / name
    folder.mkdir()
    history_cmds.write_export(window.result(), folder)
    return folder


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    """The history on one 8-GPU host (twice what it holds waits)."""
    return write_history(tmp_path, ("h1",), "export")


def test_raising_an_allocations_shares_raises_what_it_is_delivered(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "whatif"
    code = run("whatif", "--from", str(exported), "--set", "nlp=3", "--out", str(out), "--json")
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["kind"] == "WhatIf"
    data = document["data"]
    assert data["proposed_changes"] == [{"path": "root/nlp", "old": 1, "new": 3}]
    nlp, cv = data["by_allocation"]["nlp"], data["by_allocation"]["cv"]
    assert nlp["proposed"]["delivered_gpu_h"] > nlp["current"]["delivered_gpu_h"]
    assert cv["proposed"]["delivered_gpu_h"] < cv["current"]["delivered_gpu_h"]
    assert nlp["proposed"]["owed_gpu_h"] > nlp["current"]["owed_gpu_h"]
    # Nothing delivered beyond the window: an hour of 8 GPUs at most, on either side.
    for side in ("current", "proposed"):
        assert nlp[side]["delivered_gpu_h"] + cv[side]["delivered_gpu_h"] <= 8.0 + 1e-6
    assert set(data["waits_by_kind"]) == {"training"}
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk == data
    html = (out / "report.html").read_text()
    assert "root/nlp 1 -&gt; 3" in html and 'href="proposed/report.html"' in html
    for side in ("current", "proposed"):
        assert (out / side / "report.html").is_file() and (out / side / "jobs.csv").is_file()


def test_the_printed_table_shows_both_sides_per_allocation(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("whatif", "--from", str(exported), "--set", "root/cv=0", "--out", str(tmp_path)) == 0
    text = capsys.readouterr().out
    assert "proposed: root/cv 1 -> 0" in text
    rows = {
        line.split()[0]: line.split() for line in text.splitlines() if line[:3] in ("nlp", "cv ")
    }
    # cells: owed, delivered, waits, preemptions, each "current -> proposed"
    assert rows["cv"][2] == "->" and rows["cv"][5] == "->"
    assert float(rows["cv"][6]) < float(rows["cv"][4])  # cv delivered less with no shares


BAD = [
    pytest.param(["--set", "nlp"], "--set", "is not PATH=SHARES", id="an edit without ="),
    pytest.param(["--set", "nlp=lots"], "--set", "'parent'", id="shares not a number"),
    pytest.param(["--set", "nlp=-1"], "--set", "0..", id="negative shares"),
    pytest.param(
        ["--set", "root/astro=3"], "--set", "no child named 'astro'", id="an unknown path"
    ),
    pytest.param(["--set", "root=3"], "--set", "names the root", id="the root"),
    pytest.param([], "--set", "give the proposed change", id="no proposed change"),
    pytest.param(
        ["--set", "nlp=2", "--rank-every", "0"],
        "--rank-every",
        "more than 0",
        id="a bad engine knob",
    ),
]


@pytest.mark.parametrize(("argv", "option", "reason"), BAD)
def test_bad_input_names_the_option(
    exported: Path, tmp_path: Path, argv: list[str], option: str, reason: str
) -> None:
    with pytest.raises(ValidationError) as err:
        run("whatif", "--from", str(exported), "--out", str(tmp_path / "o"), *argv)
    assert err.value.field == option
    assert reason in err.value.reason


def test_a_proposed_tree_without_an_allocation_of_the_history_is_refused(
    exported: Path, tmp_path: Path
) -> None:
    budgets = tmp_path / "new.yaml"
    budgets.write_text("name: root\nchildren:\n  - {name: nlp, shares: 1}\n")
    with pytest.raises(ValidationError) as err:
        run("whatif", "--from", str(exported), "--budgets", str(budgets), "--out", str(tmp_path))
    assert err.value.field == "--budgets"
    assert "'cv'" in err.value.reason


def test_a_folder_without_the_export_files_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as err:
        run("whatif", "--from", str(tmp_path), "--set", "nlp=2", "--out", str(tmp_path / "o"))
    assert err.value.field == "--from"
    assert "trace.csv" in err.value.reason


@pytest.mark.parametrize("since", ["yesterday", "0", "1.5s"])
def test_an_unparsable_since_is_refused_before_connecting(since: str, tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as err:
        run("export", "--since", since, "--out", str(tmp_path), "--nats-url", "nats://127.0.0.1:1")
    assert err.value.field == "--since"


# -- a replay cut to its window ------------------------------------------------------------------


def test_a_record_cut_to_a_window_keeps_only_what_lies_inside() -> None:
    record = SimRecord(
        policy="fairshare",
        seed=0,
        first_submit=0.0,
        last_submit=50.0,
        end_time=500.0,
        segments=[
            Segment("a", "nlp", True, 2, 0.0, 80.0),
            Segment("b", "nlp", True, 2, 90.0, 400.0),  # runs past the window
            Segment("c", None, False, 1, 150.0, 200.0),  # after it
        ],
        waits=[Waiting("b", "nlp", True, 2, 0.0, 90.0), Waiting("c", None, False, 1, 50.0, 150.0)],
        preemptions=[
            Preemption(60.0, "a", "nlp", 2, "better-ranked", True),
            Preemption(120.0, "b", "nlp", 2, "better-ranked", True),
        ],
        jobs=[
            JobOutcome("a", "nlp", "training", 2, 0.0, 0.0, 80.0, "completed"),
            JobOutcome("b", "nlp", "training", 2, 0.0, 90.0, 400.0, "completed"),
            JobOutcome("c", None, "debug", 1, 50.0, 150.0, 200.0, "completed"),
        ],
        capacity=[CapacityChange(0.0, 8), CapacityChange(70.0, 4), CapacityChange(300.0, 8)],
        requeues=2,
    )
    cut = window_record(record, 0.0, 100.0)
    assert (cut.first_submit, cut.last_submit, cut.end_time) == (0.0, 100.0, 100.0)
    assert [(s.workload_id, s.start, s.end) for s in cut.segments] == [
        ("a", 0.0, 80.0),
        ("b", 90.0, 100.0),
    ]
    assert [(w.workload_id, w.start, w.end) for w in cut.waits] == [
        ("b", 0.0, 90.0),
        ("c", 50.0, 100.0),
    ]
    assert [p.workload_id for p in cut.preemptions] == ["a"]
    assert cut.requeues == 1
    assert cut.capacity == [CapacityChange(0.0, 8), CapacityChange(70.0, 4)]
    assert [(j.workload_id, j.first_start, j.end_time, j.state) for j in cut.jobs] == [
        ("a", 0.0, 80.0, "completed"),
        ("b", 90.0, None, "running"),
        ("c", None, None, "pending"),
    ]


def test_the_short_lane_is_replayed_as_the_placement_service_runs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # h2 as the lane: the history's 4-GPU work is not short, so it runs on h1 alone.
    history = write_history(tmp_path, ("h1", "h2"), "export2")
    argv = ["--from", str(history), "--set", "nlp=3", "--json"]
    assert run("whatif", *argv, "--out", str(tmp_path / "a"), "--short-lane", "h2") == 0
    laned = json.loads(capsys.readouterr().out)["data"]["by_allocation"]
    assert run("whatif", *argv, "--out", str(tmp_path / "b")) == 0
    plain = json.loads(capsys.readouterr().out)["data"]["by_allocation"]
    for side in ("current", "proposed"):
        on_h1 = sum(laned[a][side]["delivered_gpu_h"] for a in ("nlp", "cv"))
        assert 0 < on_h1 <= 8.0 + 1e-6
        assert on_h1 < sum(plain[a][side]["delivered_gpu_h"] for a in ("nlp", "cv"))


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--short-lane", "h1"], "outside"),  # the history's only host
        (["--short-lane", "h9"], "no host of the history"),
        (["--short-lane", "h1", "--policy", "fifo"], "only Fair Tree"),
    ],
)
def test_a_lane_the_history_cannot_have_is_refused(
    exported: Path, tmp_path: Path, argv: list[str], reason: str
) -> None:
    with pytest.raises(ValidationError) as err:
        run("whatif", "--from", str(exported), "--set", "nlp=2", "--out", str(tmp_path), *argv)
    assert err.value.field == "--short-lane"
    assert reason in err.value.reason


def test_a_short_lane_in_the_folder_is_refused_not_dropped(exported: Path, tmp_path: Path) -> None:
    """The lane is named with ``--short-lane HOSTS`` (as placement takes it); a count left in
    the folder's cluster.yaml (by hand: ``allot export`` writes none) would be ignored."""
    cluster = exported / history_cmds.CLUSTER
    cluster.write_text(cluster.read_text(encoding="utf-8") + "short_lane: 1\n", encoding="utf-8")
    with pytest.raises(ValidationError) as err:
        run("whatif", "--from", str(exported), "--set", "nlp=2", "--out", str(tmp_path / "o"))
    assert err.value.field.endswith("cluster.yaml: short_lane")
    assert "--short-lane" in err.value.reason
