"""generate_ai2 / write_scenario: byte-identical per seed, demand 2-3x capacity, the job mix,
bursty teams, files that load back; and the Philly budget and cluster configs."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml

from allot.core.errors import ValidationError
from allot.core.model import MAX_MIN_RUNTIME_S
from allot.sim.cluster import load_cluster
from allot.sim.scenario import (
    TEAMS,
    Ai2Knobs,
    Scenario,
    dump_budgets_yaml,
    generate_ai2,
    philly_budgets,
    philly_cluster,
    write_scenario,
)
from allot.sim.trace import read_trace

VC_CSV = (
    Path(__file__).resolve().parents[3] / "shared" / "traces" / "philly_vc_nodes_heliosartifact.csv"
)
FILES = ("budgets.yaml", "cluster.yaml", "trace.csv")


@pytest.fixture(scope="module")
def month() -> Scenario:
    return generate_ai2(11)


def read_files(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in FILES}


def test_same_seed_gives_identical_bytes_and_another_seed_differs(tmp_path: Path) -> None:
    knobs = Ai2Knobs(days=5)
    write_scenario(generate_ai2(3, knobs), tmp_path / "a")
    write_scenario(generate_ai2(3, knobs), tmp_path / "b")
    write_scenario(generate_ai2(4, knobs), tmp_path / "c")
    a, b, c = (read_files(tmp_path / d) for d in "abc")
    assert a == b
    assert a["trace.csv"] != c["trace.csv"]
    assert a["budgets.yaml"] == c["budgets.yaml"]  # the tree is fixed; only jobs vary


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_demand_is_two_to_three_times_capacity(seed: int) -> None:
    s = generate_ai2(seed)
    factor = s.requested_gpu_h / s.knobs.capacity_gpu_h
    assert 2.0 <= factor <= 3.0
    assert factor == pytest.approx(2.5, rel=0.05)


@pytest.mark.parametrize("target", [1.0, 2.0, 3.0])
def test_demand_factor_knob_is_met(target: float) -> None:
    s = generate_ai2(5, Ai2Knobs(days=10, demand_factor=target))
    assert s.requested_gpu_h / s.knobs.capacity_gpu_h == pytest.approx(target, rel=0.08)


def test_every_kind_is_present_with_its_contract(month: Scenario) -> None:
    by_kind: dict[str, list[object]] = defaultdict(list)
    for job in month.jobs:
        by_kind[job.workload.kind].append(job)
    assert set(by_kind) == {"debug", "interactive", "eval", "training", "filler"}
    counts = Counter({k: len(v) for k, v in by_kind.items() if k != "filler"})
    assert counts.most_common(1)[0][0] == "debug"  # debug jobs are the many funded ones
    for job in month.jobs:
        w = job.workload
        assert 0 <= w.min_runtime_s <= MAX_MIN_RUNTIME_S
        assert w.allocation is not None
        if w.kind == "filler":
            assert (w.min_runtime_s, w.allocated, w.resumable) == (0, False, True)
        else:
            assert w.allocated
        if w.kind == "debug":
            assert w.gpus in (1, 2)
            assert 300 <= job.duration_s <= 1800
            assert 300 <= w.min_runtime_s <= 900
        if w.kind == "interactive":
            assert 3600 <= w.min_runtime_s <= 7200
            assert not w.resumable
        if w.kind == "training":
            assert w.gpus >= 8
            assert 6 * 3600 - 1 <= job.duration_s <= 48 * 3600 + 1
            assert 2 * 3600 <= w.min_runtime_s <= 4 * 3600


def test_multi_host_gangs_of_64_and_128_are_present(month: Scenario) -> None:
    gangs = Counter(j.workload.gpus for j in month.jobs if j.workload.gpus >= 64)
    assert gangs[64] > 0
    assert gangs[128] > 0
    assert all(j.workload.kind == "training" for j in month.jobs if j.workload.gpus >= 64)


def test_max_gang_gives_every_team_gangs_up_to_it_whatever_its_entitlement() -> None:
    """``allot scenario ai2 --max-gang 128``: the fragmentation stress (issue 37)."""
    default = generate_ai2(1, Ai2Knobs(days=10))
    stressed = generate_ai2(1, Ai2Knobs(days=10, max_gang=128))

    def gang_teams(s: Scenario) -> set[str]:
        return {j.workload.allocation or "" for j in s.jobs if j.workload.gpus >= 64}

    assert len(gang_teams(stressed)) > len(gang_teams(default))
    assert max(j.workload.gpus for j in stressed.jobs) <= 128
    assert generate_ai2(1, Ai2Knobs(days=10, max_gang=64)).jobs != stressed.jobs


def test_the_tree_has_fifteen_teams_under_four_programs_with_unequal_shares(
    month: Scenario,
) -> None:
    programs = month.budgets["children"]
    assert isinstance(programs, list)
    assert len(programs) == 4
    teams = [team for program in programs for team in program["children"]]
    assert len(teams) == 15
    assert len({team["shares"] for team in teams}) > 5
    assert all(isinstance(team["shares"], int) and team["shares"] > 0 for team in teams)
    assert {j.workload.allocation for j in month.jobs} == {team["name"] for team in teams}


def test_teams_are_bursty_and_sometimes_want_less_than_their_share(month: Scenario) -> None:
    knobs = month.knobs
    program_total = sum(shares for _, shares, _ in TEAMS)
    share = {
        team: p / program_total * s / sum(x for _, x in members)
        for _, p, members in TEAMS
        for team, s in members
    }
    daily_capacity = knobs.hosts * knobs.gpus_per_host * 24
    demand: dict[str, list[float]] = defaultdict(lambda: [0.0] * knobs.days)
    for job in month.jobs:
        w = job.workload
        if w.allocated:
            demand[str(w.allocation)][int(w.submit_time // 86400)] += w.gpus * job.duration_s / 3600
    for team, days in demand.items():
        below = sum(1 for d in days if d < share[team] * daily_capacity)
        above = sum(1 for d in days if d > share[team] * daily_capacity)
        assert below >= 3, team
        assert above >= 3, team


def test_legacy_columns_show_priority_inflation(month: Scenario) -> None:
    funded = [j for j in month.jobs if j.workload.kind != "filler"]
    high = sum(1 for j in funded if j.legacy_class == "HIGH") / len(funded)
    protected = sum(1 for j in funded if j.legacy_protected) / len(funded)
    assert high == pytest.approx(0.8, abs=0.03)
    assert protected > 0.25
    assert not any(j.workload.priority for j in month.jobs)  # the baseline applies them
    assert not any(j.legacy_protected for j in month.jobs if j.workload.kind == "filler")


def test_files_load_back_into_the_same_scenario(tmp_path: Path) -> None:
    s = generate_ai2(2, Ai2Knobs(days=3))
    write_scenario(s, tmp_path)
    assert tuple(read_trace(tmp_path / "trace.csv")) == s.jobs
    assert yaml.safe_load((tmp_path / "budgets.yaml").read_text()) == s.budgets
    cluster_data = yaml.safe_load((tmp_path / "cluster.yaml").read_text())
    assert cluster_data == s.cluster
    spec = load_cluster(cluster_data)
    assert len(spec.hosts) == 48
    assert spec.total_gpus == 384
    assert sum(len(hosts) for hosts in spec.partitions.values()) == 48
    assert len(spec.health_events) >= 4  # 4 failures, most also repaired in the span
    assert '- name: "pretraining"' in (tmp_path / "budgets.yaml").read_text()


def test_budgets_yaml_quotes_names_and_writes_leaves_on_one_line() -> None:
    tree = {
        "name": "root",
        "children": [
            {"name": "nlp", "shares": 40, "children": [{"name": "103959", "shares": 30}]},
            {"name": "vision", "shares": 10},
        ],
    }
    assert dump_budgets_yaml(tree) == (
        'name: "root"\n'
        "children:\n"
        '  - name: "nlp"\n'
        "    shares: 40\n"
        "    children:\n"
        '      - {name: "103959", shares: 30}\n'
        '  - {name: "vision", shares: 10}\n'
    )
    assert yaml.safe_load(dump_budgets_yaml(tree)) == tree


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        pytest.param({"days": 0}, "knobs.days", id="no-days"),
        pytest.param({"demand_factor": 0.0}, "knobs.demand_factor", id="no-demand"),
        pytest.param({"demand_factor": float("inf")}, "knobs.demand_factor", id="demand-never-met"),
        pytest.param({"demand_factor": float("nan")}, "knobs.demand_factor", id="nan-demand"),
        pytest.param({"filler_fraction": 1.5}, "knobs.filler_fraction", id="fraction-above-one"),
        pytest.param(
            {"filler_fraction": 0.5, "eval_fraction": 0.5}, "knobs", id="no-room-for-training"
        ),
        pytest.param({"busy_days": (5.0, 2.0)}, "knobs.busy_days", id="inverted-phase-range"),
        pytest.param({"host_failures": 49}, "knobs.host_failures", id="more-failures-than-hosts"),
        pytest.param({"max_gang": 32}, "knobs.max_gang", id="gang-smaller-than-a-gang"),
        pytest.param({"max_gang": 400}, "knobs.max_gang", id="gang-larger-than-the-cluster"),
    ],
)
def test_bad_knobs_are_rejected(knobs: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        Ai2Knobs(**knobs)  # type: ignore[arg-type]
    assert err.value.field == field


def write_vc_csv(tmp_path: Path) -> Path:
    path = tmp_path / "vc.csv"
    path.write_text("vc,node num\n6214e9,4\n103959,2\n", encoding="utf-8")
    return path


def test_philly_budgets_use_node_counts_and_one_share_for_missing_vcs(tmp_path: Path) -> None:
    tree = philly_budgets(write_vc_csv(tmp_path), ["103959", "zz", "6214e9", "aa", "zz"])
    assert tree == {
        "name": "root",
        "children": [
            {"name": "6214e9", "shares": 4},
            {"name": "103959", "shares": 2},
            {"name": "aa", "shares": 1},
            {"name": "zz", "shares": 1},
        ],
    }


def test_philly_cluster_partitions_by_node_count_and_gives_missing_vcs_none(
    tmp_path: Path,
) -> None:
    data = philly_cluster(write_vc_csv(tmp_path), ["aa"], hosts=7, gpus=8)
    spec = load_cluster(data)
    assert len(spec.hosts) == 7
    assert [len(spec.partitions[t]) for t in ("6214e9", "103959", "aa")] == [4, 2, 0]
    with pytest.raises(ValidationError):
        philly_cluster(write_vc_csv(tmp_path), hosts=5)


@pytest.mark.skipif(not VC_CSV.exists(), reason="../shared/traces is absent (it is present in CI)")
def test_philly_configs_from_the_helios_file() -> None:
    trace_teams = ["ee9e8c", "23dbec", "51b7ef", "795a4c", "925e2b", "6214e9"]
    tree = philly_budgets(VC_CSV, trace_teams)
    children = tree["children"]
    assert isinstance(children, list)
    shares = {c["name"]: c["shares"] for c in children}
    assert len(shares) == 15
    assert sum(shares.values()) == 352 + 4
    assert shares["6214e9"] == 64
    assert shares["23dbec"] == 1
    spec = load_cluster(philly_cluster(VC_CSV, trace_teams))
    assert spec.total_gpus == 2816
    assert sum(len(h) for h in spec.partitions.values()) == 352
    assert spec.partitions["925e2b"] == ()
