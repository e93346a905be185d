"""The live commands' printing and argument parsing, without NATS."""

from __future__ import annotations

import argparse
import json

import msgspec
import pytest

from allot.cli import live_cmds
from allot.cli.durations import parse_duration
from allot.cli.main import main as cli_main
from allot.core.errors import ValidationError
from allot.proto import codec
from allot.proto import messages as m
from allot.render import live_format as fmt
from allot.sdk.lifecycle import Ending

T0 = 1_800_000_000.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="allot")
    live_cmds.register(parser.add_subparsers(dest="command", required=True))
    return parser


# -- tables -------------------------------------------------------------------------------------


def test_render_table_aligns_text_left_and_numbers_right() -> None:
    cols = (fmt.Column("NAME"), fmt.Column("N", ">"), fmt.Column("NOTE"))
    out = fmt.render_table(cols, [("a", "1", "x"), ("long-name", "1234", "")])
    assert out.splitlines() == [
        "NAME          N  NOTE",
        "---------  ----  ----",
        "a             1  x",
        "long-name  1234",
    ]


def test_render_table_rejects_a_short_row() -> None:
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        fmt.render_table((fmt.Column("A"), fmt.Column("B"), fmt.Column("C")), [("1", "2")])


def _queue() -> m.QueueSnapshot:
    return m.QueueSnapshot(
        at=T0 + 3 * 3600 + 5 * 60,
        epoch=4,
        free_gpus=6,
        rows=(
            m.QueueRow(
                position=1,
                workload_id="wl-a",
                allocation="nlp",
                user="ann",
                gpus=8,
                kind="training",
                tier="under-entitlement",
                rank=2,
                fairshare=0.5,
                sort_metric=0.5,
                submitted_at=T0,
                why="room only behind protected work",
                reason="protected-until",
                reason_numbers={"until": T0 + 4 * 3600, "held": 0, "hosts": "h1"},
                est_start=T0 + 4 * 3600,
            ),
            m.QueueRow(
                position=2,
                workload_id="wl-b",
                user="bob",
                gpus=1,
                kind="eval",
                tier="unallocated",
                sort_metric=2.0,
                submitted_at=T0 + 3 * 3600 + 4 * 60 + 30,
            ),
            m.QueueRow(
                position=3,
                workload_id="wl-c",
                allocation="nlp",
                user="ann",
                gpus=2,
                kind="training",
                tier="under-entitlement",
                sort_metric=0.5,
                submitted_at=T0,
                why="starts at the next cycle on h2",
                reason="starts-next-cycle",
                est_start=T0 + 3 * 3600 + 5 * 60,  # the snapshot's own time
            ),
        ),
    )


def test_queue_table_columns_and_cells() -> None:
    lines = fmt.queue_table(_queue()).splitlines()
    assert lines[0].split() == [
        "POS",
        "WORKLOAD",
        "ALLOC",
        "USER",
        "GPUS",
        "TIER",
        "FAIRSHARE",
        "REASON",
        "EST.START*",
        "WHY",
    ]
    # the estimate is relative to the snapshot's time: 4h00m after T0 is 55m from 3h05m
    assert lines[2].split(None, 9) == [
        "1",
        "wl-a",
        "nlp",
        "ann",
        "8",
        "under-entitlement",
        "0.500",
        "protected-until",
        "~55.0m",
        "room only behind protected work",
    ]
    # unallocated shows "~"; missing factor, reason and estimate "-"
    assert lines[3].split() == ["2", "wl-b", "~", "bob", "1", "unallocated", "-", "-", "-", "-"]
    assert lines[4].split(None, 9)[7:] == [
        "starts-next-cycle",
        "now",
        "starts at the next cycle on h2",
    ]
    # numbers right-aligned: the GPUS cells end where the GPUS title ends
    gpus_end = lines[0].index("GPUS") + len("GPUS")
    assert lines[2][gpus_end - 1] == "8" and lines[3][gpus_end - 1] == "1"
    assert lines[-3] == "3 pending, 6 GPUs free (epoch 4, at 2027-01-15T11:05:00Z)"
    # the legend says which way the order goes, the footnote that the start is an estimate
    assert lines[-2] == fmt.ORDER_NOTE
    assert lines[-1].startswith("* EST.START is an estimate")


def test_queue_and_prio_say_which_way_each_column_serves_first() -> None:
    """One direction everywhere: position 1 and factor 1 are served first; no column
    counts the other way (Slurm's rank is only in share -l, with its legend)."""
    assert "POS order (1 = served first)" in fmt.ORDER_NOTE
    assert "FAIRSHARE factor (1 = served first)" in fmt.ORDER_NOTE
    for columns in (fmt.QUEUE_COLUMNS, fmt.QUEUE_LONG_COLUMNS, fmt.PRIO_COLUMNS):
        titles = {c.title for c in columns}
        assert not titles & {"RANK", "ORDER", "SORT"}, titles


def test_queue_table_long_adds_the_last_inputs_of_the_order() -> None:
    lines = fmt.queue_table(_queue(), long=True).splitlines()
    assert lines[0].split() == [
        "POS",
        "WORKLOAD",
        "ALLOC",
        "USER",
        "GPUS",
        "TIER",
        "FAIRSHARE",
        "PRIO",
        "AGE",
        "REASON",
        "EST.START*",
        "WHY",
    ]
    assert lines[2].split(None, 11)[6:] == [
        "0.500",
        "0",
        "3.1h",
        "protected-until",
        "~55.0m",
        "room only behind protected work",
    ]
    # missing fairshare "-"; age under a minute in seconds
    assert lines[3].split()[6:9] == ["-", "0", "30s"]


@pytest.mark.parametrize(
    ("hours", "cell"),
    [
        (0.0, "0.00"),
        (120.25, "120.25"),
        (0.5, "0.50"),
        (0.0412, "0.0412"),
        (0.00412, "0.00412"),
        (1e-9, "0.000000"),
        (None, "-"),
    ],
)
def test_gpu_hours_keep_three_significant_digits_below_a_tenth(
    hours: float | None, cell: str
) -> None:
    assert fmt.gpu_h_cell(hours) == cell


@pytest.mark.parametrize(
    ("est", "cell"),
    [(None, "-"), (T0 - 5, "now"), (T0 + 0.5, "now"), (T0 + 90, "~1.5m"), (T0 + 7200, "~2.0h")],
)
def test_est_start_cell(est: float | None, cell: str) -> None:
    assert fmt.est_start_cell(est, T0) == cell


def test_share_table_shows_gpu_hours_parent_and_inf() -> None:
    ranking = m.RankingUpdated(
        at=T0,
        window_s=7 * 86400,
        nodes=(
            m.RankRow(
                path="root/nlp",
                name="nlp",
                leaf=False,
                raw_shares=None,
                norm_shares=0.5,
                raw_usage=7200.0,
                effective_usage=0.25,
                level_fs="inf",
            ),
            m.RankRow(
                path="root/nlp/pretrain",
                name="pretrain",
                leaf=True,
                raw_shares=3,
                norm_shares=0.75,
                raw_usage=5400.0,
                effective_usage=0.1875,
                level_fs=4.0,
                rank=1,
                fairshare=1.0,
            ),
        ),
    )
    lines = fmt.share_table(ranking).splitlines()
    assert lines[0].split() == [
        "Account",
        "RawShares",
        "NormShares",
        "RawUsage(GPU-h)",
        "EffectvUsage",
        "LevelFS",
        "FairShare",
    ]
    assert lines[2].split() == [
        "root/nlp",
        "parent",
        "0.500000",
        "2.00",
        "0.250000",
        "inf",
        "-",
    ]
    assert lines[3].split() == [
        "root/nlp/pretrain",
        "3",
        "0.750000",
        "1.50",
        "0.187500",
        "4.000000",
        "1.000000",
    ]
    assert lines[-2].startswith("window 7.0d")
    assert "RawUsage: GPU-hours charged in the window by then" in lines[-2]
    assert lines[-1] == fmt.FAIRSHARE_NOTE and "1 = served first" in lines[-1]


def _ranking_for_long() -> m.RankingUpdated:
    # nlp is a `parent` account: its children's Fair Tree parent is the root.
    def row(path: str, leaf: bool, shares: int | None, usage: float, **kw: object) -> m.RankRow:
        return m.RankRow(
            path=path,
            name=path.rsplit("/", 1)[1],
            leaf=leaf,
            raw_shares=shares,
            norm_shares=0.5,
            raw_usage=usage,
            effective_usage=usage / 36_000.0,
            **kw,  # type: ignore[arg-type]
        )

    return m.RankingUpdated(
        at=T0,
        window_s=7 * 86400,
        nodes=(
            row("root/nlp", False, None, 27_000.0, level_fs=None),
            row("root/nlp/pretrain", True, 3, 18_000.0, level_fs=1.0, rank=1, fairshare=0.5),
            row("root/nlp/eval", True, 1, 9_000.0, level_fs=2.0, rank=2, fairshare=1.0),
            row("root/vision", True, 1, 9_000.0, level_fs="inf", rank=2, fairshare=1.0),
        ),
    )


def _allocations() -> m.AllocationsSnapshot:
    return m.AllocationsSnapshot(
        at=T0 + 60,
        healthy_gpus=16,
        total_gpus=24,
        rows=(
            m.AllocationRow(
                allocation="pretrain", effective_share=0.375, entitlement_gpus=6.0, held_gpus=8
            ),
            m.AllocationRow(
                allocation="eval", effective_share=0.125, entitlement_gpus=2.0, held_gpus=0
            ),
            m.AllocationRow(
                allocation="vision", effective_share=0.5, entitlement_gpus=8.0, held_gpus=4
            ),
        ),
    )


def test_share_long_mirrors_sshare_l_and_adds_budget_entitlement_held() -> None:
    lines = fmt.share_long_table(_ranking_for_long(), _allocations()).splitlines()
    assert lines[0].split() == [
        "Account",
        "RawShares",
        "NormShares",
        "RawUsage(GPU-h)",
        "NormUsage",
        "EffectvUsage",
        "FairShare",
        "LevelFS",
        "Rank",
        "Budget",
        "Entitlement",
        "Held",
    ]
    # the account sums its leaves; a parent account has no level usage of its own; usage
    # in GPU-hours as in `allot share` (27,000 GPU-seconds)
    assert lines[2].split() == [
        "root/nlp",
        "parent",
        "0.500000",
        "7.50",
        "0.750000",
        "-",
        "-",
        "-",
        "-",
        "50.0%",
        "8.0",
        "8",
    ]
    # pretrain's Fair Tree parent is the root (nlp is `parent`): U = 18000 / 36000
    assert lines[3].split() == [
        "root/nlp/pretrain",
        "3",
        "0.500000",
        "5.00",
        "0.500000",
        "0.500000",
        "0.500000",
        "1.000000",
        "1",
        "37.5%",
        "6.0",
        "8",
    ]
    assert lines[5].split()[5:] == ["0.250000", "1.000000", "inf", "2", "50.0%", "8.0", "4"]
    assert "16 healthy GPUs (of 24)" in lines[-3]
    # Slurm's rank is explained where it is shown: the highest is served first
    assert lines[-2] == fmt.FAIRSHARE_NOTE
    assert lines[-1].startswith("Rank: Slurm's Fair Tree rank, 3 (the number of allocations)")
    assert "= served first" in lines[-1]


def test_share_long_without_the_placement_leader_shows_dashes() -> None:
    lines = fmt.share_long_table(_ranking_for_long(), None).splitlines()
    assert lines[3].split()[9:] == ["-", "-", "-"]
    assert "placement leader did not answer" in lines[-3]


def test_level_usage_under_a_real_account_is_over_the_account() -> None:
    ranking = m.RankingUpdated(
        at=T0,
        window_s=60,
        nodes=tuple(
            m.RankRow(
                path=p,
                name=p.rsplit("/", 1)[1],
                leaf=leaf,
                raw_shares=1,
                norm_shares=0.5,
                raw_usage=u,
                effective_usage=u / 4000.0,
                level_fs=1.0,
            )
            for p, leaf, u in (
                ("root/a", False, 4000.0),
                ("root/a/x", True, 1000.0),
                ("root/a/y", True, 3000.0),
            )
        ),
    )
    lines = fmt.share_long_table(ranking, None).splitlines()
    assert [line.split()[5] for line in lines[2:5]] == ["1.000000", "0.250000", "0.750000"]


def test_envelope_lines_is_one_compact_envelope_per_line() -> None:
    text = fmt.envelope_lines([_ranking_for_long(), _allocations()], T0)
    first, second = (json.loads(line) for line in text.splitlines())
    assert (first["kind"], second["kind"]) == ("RankingUpdated", "AllocationsSnapshot")
    assert second["data"]["rows"][0]["held_gpus"] == 8 and second["at"] == T0 + 60


def test_queue_and_share_take_long() -> None:
    parser = _parser()
    assert parser.parse_args(["queue", "-l"]).long
    assert parser.parse_args(["share", "--long", "--json"]).long
    assert not parser.parse_args(["share"]).long


def test_hosts_table() -> None:
    snap = m.HostsSnapshot(
        at=T0,
        hosts=(
            m.HostRow(host="h01", state="healthy", gpus=8, free_gpus=2, workloads=("a", "b")),
            m.HostRow(host="h02", state="drained", gpus=8, free_gpus=8),
            m.HostRow(host="h03", state="healthy", gpus=8, free_gpus=7, short_lane=True),
        ),
    )
    lines = fmt.hosts_table(snap).splitlines()
    assert lines[0].split() == ["HOST", "STATE", "GPUS", "FREE", "LANE", "WORKLOADS"]
    assert lines[2].split() == ["h01", "healthy", "8", "2", "-", "a,b"]
    assert lines[3].split() == ["h02", "drained", "8", "8", "-", "-"]
    assert lines[4].split() == ["h03", "healthy", "8", "7", "short", "-"]


def test_status_text_skips_empty_fields() -> None:
    status = m.WorkloadStatus(
        workload_id="wl-a",
        state="running",
        allocation="nlp",
        user="ann",
        gpus=4,
        attempt=1,
        started_at=T0,
        assignment=(m.HostGpus(host="h01", gpus=(0, 1, 2, 3)),),
    )
    text = fmt.status_text(status)
    assert "state:" in text and "running" in text
    assert "assignment:      h01:0,1,2,3" in text
    assert "preempt at" not in text and "position" not in text
    # Placed is not running until its host reports the start.
    lines = dict(line.split(":", 1) for line in text.splitlines())
    assert lines["started"].strip() == "not yet (placed; its host has not reported it)"
    reported = msgspec.structs.replace(status, run_started_at=T0 + 2)
    lines = dict(line.split(":", 1) for line in fmt.status_text(reported).splitlines())
    assert lines["placed"].strip() == "2027-01-15T08:00:00Z"
    assert lines["started"].strip() == "2027-01-15T08:00:02Z"


def test_status_text_of_an_ended_workload_shows_its_run_and_its_end() -> None:
    """Like sacct: where it ran, when it started and ended, its exit code and why."""
    status = m.WorkloadStatus(
        workload_id="wl-a",
        state="failed",
        allocation="nlp",
        user="ann",
        gpus=4,
        attempt=2,
        started_at=T0,
        assignment=(m.HostGpus(host="h01", gpus=(0, 1, 2, 3)),),
        ended_at=T0 + 3600,
        exit_code=137,
        reason="killed by signal 9",
    )
    lines = dict(line.split(":", 1) for line in fmt.status_text(status).splitlines())
    assert lines["placed"].strip() == "2027-01-15T08:00:00Z"
    assert "started" not in lines  # its host never reported a start
    assert lines["assignment"].strip() == "h01:0,1,2,3"
    assert lines["ended"].strip() == "2027-01-15T09:00:00Z"
    assert lines["exit code"].strip() == "137"
    assert lines["reason"].strip() == "killed by signal 9"
    assert "cancelled by" not in lines
    cancelled = msgspec.structs.replace(
        status, state="cancelled", exit_code=None, reason="not needed", cancelled_by="ann"
    )
    text = fmt.status_text(cancelled)
    assert "cancelled by:    ann" in text and "exit code" not in text
    # A free-text reason or argument never breaks the one-line-per-field layout.
    two_lines = msgspec.structs.replace(
        cancelled, reason="line1\nline2", command=("sh", "-c", "a\tb\nc")
    )
    text = fmt.status_text(two_lines)
    assert len(text.splitlines()) == len(fmt.status_text(cancelled).splitlines()) + 1
    assert "reason:          line1\\nline2" in text
    assert "command:         sh -c 'a\\tb\\nc'" in text


def test_hosts_table_shows_each_drain_like_sinfo_r() -> None:
    snap = m.HostsSnapshot(
        at=T0,
        hosts=(
            m.HostRow(host="h01", state="healthy", gpus=8, free_gpus=8),
            m.HostRow(
                host="h02",
                state="drained",
                gpus=8,
                free_gpus=8,
                drain_reason="bad fan",
                drain_by="ops",
                drain_at=T0,
            ),
            m.HostRow(
                host="h03",
                state="draining",
                gpus=8,
                free_gpus=0,
                drain_reason="missed heartbeats for 12.0 s",
                drain_at=T0 + 60,
            ),
        ),
    )
    lines = fmt.hosts_table(snap).splitlines()
    assert lines[5] == ""
    assert lines[6].split() == ["HOST", "STATE", "SINCE", "BY", "REASON"]
    assert lines[8].split() == ["h02", "drained", "2027-01-15T08:00:00Z", "ops", "bad", "fan"]
    assert lines[9].split()[:4] == ["h03", "draining", "2027-01-15T08:01:00Z", "-"]
    assert lines[9].endswith("missed heartbeats for 12.0 s") and len(lines) == 10
    healthy = m.HostsSnapshot(at=T0, hosts=snap.hosts[:1])
    assert len(fmt.hosts_table(healthy).splitlines()) == 3  # no drains, no second table


def test_event_line_shows_non_default_fields() -> None:
    notice = m.PreemptionNotice(
        workload_id="wl-a",
        allocation="nlp",
        at=T0,
        reason="better-ranked",
        grace_deadline=T0 + 300,
        requeue=True,
        gpus=8,
    )
    line = fmt.event_line(notice)
    assert line.startswith("2027-01-15T08:00:00Z  PreemptionNotice  ")
    assert "reason=better-ranked" in line
    assert "grace_deadline=2027-01-15T08:05:00Z(+5.0m)" in line
    assert "requeue=True" in line and "gpus=8" in line
    assert "workload_id" not in line and "attempt" not in line  # context and defaults
    placed = m.WorkloadPlaced(
        workload_id="wl-a",
        at=T0,
        gpus=2,
        assignment=(m.HostGpus(host="h01", gpus=(0, 1)),),
    )
    assert fmt.event_line(placed).endswith("gpus=2 assignment=h01:0,1")


def test_envelope_is_kind_at_data_without_the_tag() -> None:
    reply = m.WorkloadAccepted(workload_id="wl-a", client_id="c1", at=T0, duplicate=True)
    env = json.loads(fmt.envelope_json(reply, now=5.0))
    assert env == {
        "kind": "WorkloadAccepted",
        "at": T0,
        "data": {
            "workload_id": "wl-a",
            "client_id": "c1",
            "allocation": None,
            "at": T0,
            "duplicate": True,
            "allocated": False,
            "note": "",
        },
    }
    status = m.WorkloadStatus(workload_id="wl-a", state="unknown")
    assert fmt.envelope(status, now=5.0)["at"] == 5.0


# -- argument parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("15m", 900), ("2h", 7200), ("45", 45)])
def test_durations(text: str, seconds: int) -> None:
    assert live_cmds.parse_duration_option("--duration", text) == seconds


def test_bad_duration_names_the_option() -> None:
    with pytest.raises(ValidationError) as err:
        live_cmds.parse_duration_option("--duration", "2 weeks")
    assert err.value.field == "--duration"
    with pytest.raises(ValidationError) as err:
        live_cmds.parse_min_runtime("9h")
    assert err.value.field == "--min-runtime" and "8 h" in err.value.reason


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0.5m", 30), ("1.5h", 5400), ("0.1h", 360), ("2h", 7200), ("1.0s", 1)],
    ids=["half-a-minute", "hour-and-a-half", "a-tenth-of-an-hour-exactly", "hours", "1.0s"],
)
def test_min_runtime_in_whole_seconds(text: str, seconds: int) -> None:
    assert live_cmds.parse_min_runtime(text) == seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1h30m", 5400), ("2d12h", 216_000), ("1m30s", 90), ("1h0.5m", 3630), ("7h59m60s", 28_800)],
)
def test_parts_largest_unit_first_add_up(text: str, seconds: int) -> None:
    """As Slurm's ``--time`` and Go's durations write them (``1h30m`` was refused while
    ``1.5h`` worked)."""
    assert parse_duration(text) == seconds
    if seconds <= m.MAX_MIN_RUNTIME_S:
        assert live_cmds.parse_min_runtime(text) == seconds


@pytest.mark.parametrize(
    ("text", "reason"),
    [("30m1h", "largest first"), ("1h1h", "each unit once"), ("1h30", "not a duration")],
)
def test_parts_out_of_order_or_without_a_unit_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ValidationError) as err:
        live_cmds.parse_min_runtime(text)
    assert err.value.field == "--min-runtime" and reason in err.value.reason


@pytest.mark.parametrize(
    "text",
    ["0.4s", "0.9s", "1.5", "0.0001m"],
    ids=["was-rounded-to-0", "was-rounded-to-1", "plain-seconds", "a-minute-fraction"],
)
def test_a_fractional_second_is_refused_not_rounded(text: str) -> None:
    with pytest.raises(ValidationError) as err:
        live_cmds.parse_min_runtime(text)
    assert err.value.field == "--min-runtime"
    assert "whole number of seconds" in err.value.reason and repr(text) in err.value.reason
    with pytest.raises(ValidationError) as err:
        live_cmds.parse_duration_option("--duration", text)
    assert err.value.field == "--duration"


def test_the_simulators_durations_refuse_a_fractional_second_naming_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="allot")
    parser.add_argument("--grace", type=parse_duration)
    with pytest.raises(SystemExit):
        parser.parse_args(["--grace", "0.4s"])
    assert "argument --grace: '0.4s' is 0.4 s: give a whole" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("alloc", "min_runtime_s", "words"),
    [
        (None, 3600, "--min-runtime 1h protects nothing without an allocation (--alloc)"),
        ("~", 3600, "--min-runtime 1h protects nothing without an allocation (--alloc)"),
        ("nlp", 0, "--min-runtime 0: this work runs unallocated"),
        ("nlp", 3600, None),
        (None, 0, None),
    ],
    ids=[
        "min-runtime-without-alloc",
        "min-runtime-with-alloc-tilde",
        "alloc-without-min-runtime",
        "allocated-no-note",
        "plainly-unallocated-no-note",
    ],
)
def test_a_submission_half_allocated_gets_a_note(
    alloc: str | None, min_runtime_s: int, words: str | None
) -> None:
    note = live_cmds.unallocated_note(alloc, min_runtime_s, "1h" if min_runtime_s else "0")
    if words is None:
        assert note is None
    else:
        assert note is not None and note.startswith("allot submit: note: ") and words in note


def _accepted(client_id: str, duplicate: bool = False) -> m.WorkloadAccepted:
    return m.WorkloadAccepted(
        workload_id=f"w-{client_id}", client_id=client_id, at=T0, duplicate=duplicate
    )


def test_every_line_of_an_array_names_its_task() -> None:
    # A re-submission with --array 4 after --array 3: three tasks differ (their task
    # count), the fourth is new; the refusal's client_id is left out, as intake may.
    conflict = m.WorkloadRejected(
        at=T0, field="workloads[1].client_id", reason="client_id 'arr-1' was already used"
    )
    results: list[m.WorkloadAccepted | m.WorkloadRejected] = [
        _accepted("arr-0", duplicate=True),
        conflict,
        msgspec.structs.replace(conflict, field="gpus", reason="asks for 9 GPUs"),
        _accepted("arr-3"),
    ]
    assert live_cmds.array_lines([f"arr-{i}" for i in range(4)], results) == [
        "arr-0: w-arr-0 (duplicate)",
        "arr-1: refused: --client-id: client_id 'arr-1' was already used",
        "arr-2: refused: --gpus: asks for 9 GPUs",
        "arr-3: w-arr-3",
    ]


def test_the_array_help_states_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["submit", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "exit status 0 when every task is accepted or a duplicate, 2 when any" in help_text


def test_budget_path() -> None:
    assert live_cmds.parse_budget_path("root/nlp/pretrain") == ("root", "nlp", "pretrain")
    assert live_cmds.parse_budget_path("nlp/pretrain") == ("root", "nlp", "pretrain")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("root", "names the root"),
        ("root//nlp", "empty level"),
        ("root/nlp/", "empty level"),
        ("root/n.lp", "not a budget node name"),
        ("root/" + "x" * 65, "not a budget node name"),
    ],
)
def test_bad_budget_path_names_path(text: str, reason: str) -> None:
    with pytest.raises(ValidationError) as err:
        live_cmds.parse_budget_path(text)
    assert err.value.field == "PATH" and reason in err.value.reason


def test_shares() -> None:
    assert live_cmds.parse_shares("parent") is None
    assert live_cmds.parse_shares("40") == 40
    for bad in ("-1", "x", "1.5", "1000001"):
        with pytest.raises(ValidationError) as err:
            live_cmds.parse_shares(bad)
        assert err.value.field == "SHARES"


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["submit", "--user", "u", "--gpus", "0"], "--gpus"),
        (["submit", "--user", "u", "--gpus", "two"], "--gpus"),
        (["submit", "--user", "u", "--gpus", "1", "--priority", "5000"], "--priority"),
        (["submit", "--user", "u", "--gpus", "1", "--min-runtime", "soon"], "--min-runtime"),
        (["submit", "--user", "u", "--gpus", "1", "--duration", "0"], "--duration"),
        (["submit", "--user", "u", "--gpus", "1"], "CMD"),  # nothing to run, no fake duration
        (["queue", "--timeout", "0"], "--timeout"),
        (["budgets", "set", "root", "3", "--by", "me"], "PATH"),
        (["budgets", "set", "root/nlp", "lots", "--by", "me"], "SHARES"),
    ],
)
def test_bad_values_fail_before_connecting(argv: list[str], option: str) -> None:
    # The NATS url is unreachable: an error naming the option proves nothing was sent.
    args = _parser().parse_args([*argv, "--nats-url", "nats://127.0.0.1:1"])
    with pytest.raises(ValidationError) as err:
        args.func(args)
    assert err.value.field == option


NOWHERE = "nats://127.0.0.1:1"
"""No server: an error before connecting proves nothing was sent."""


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # `--duration 10 minutes`: the bare number is refused before `minutes` is run
        (["--duration", "10", "minutes"], "allot submit: --duration: '10' has no unit"),
        (["--duration", "10m", "sleep", "5"], "allot submit: CMD: put the command after --"),
        (["--duration", "1m", "--min-runtime", "1"], "--min-runtime: '1' has no unit: write 1s"),
        (["--duration", "60.0", "--", "true"], "--duration: '60.0' has no unit"),
        (["--duration", "1m", "sleep", "5", "--"], "CMD: put the command after --"),
        (["--duration", "1m", "sleep", "--", "5"], "CMD: put the command after --"),
        # a budget path, as `allot budgets set` takes it, names the allocation to give
        (
            ["--duration", "1m", "--alloc", "root/research/nlp"],
            "--alloc: 'root/research/nlp' is a path of the budget tree: give the allocation's "
            "own name ('nlp')",
        ),
    ],
)
def test_submit_refuses_what_a_newcomer_types_by_mistake(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each was accepted and meant something else: `minutes` became the command, and a
    bare 1 was one second where a Slurm user means a minute."""
    code = cli_main(["submit", "--user", "u", "--gpus", "1", *argv, "--nats-url", NOWHERE])
    assert code != 0 and said in capsys.readouterr().err


def test_a_command_after_double_dash_and_a_bare_zero_pass_the_checks() -> None:
    args = _parser().parse_args(
        ["submit", "--user", "u", "--gpus", "1", "--min-runtime", "0", "--", "sleep", "5"]
    )
    args.argv = ["submit", "--user", "u", "--gpus", "1", "--min-runtime", "0", "--", "sleep", "5"]
    live_cmds.check_command_after_dashes(args)
    assert live_cmds.parse_min_runtime("0") == 0 and live_cmds.parse_min_runtime("90s") == 90


def test_submit_arguments_after_double_dash() -> None:
    args = _parser().parse_args(
        ["submit", "--alloc", "nlp", "--user", "u", "--gpus", "2", "--", "python", "-m", "x"]
    )
    assert args.cmd == ["python", "-m", "x"] and args.alloc == "nlp"


def test_renamed_maps_wire_fields_to_options() -> None:
    exc = live_cmds.renamed(ValidationError("min_runtime_s", "too long"), live_cmds.SUBMIT_OPTIONS)
    assert (exc.field, exc.reason) == ("--min-runtime", "too long")
    same = ValidationError("body", "bad")
    assert live_cmds.renamed(same, live_cmds.SUBMIT_OPTIONS) is same


@pytest.mark.parametrize(
    ("msg", "options", "option"),
    [
        (m.SubmitWorkload(client_id="c", user="", gpus=1), live_cmds.SUBMIT_OPTIONS, "--user"),
        (
            m.SubmitWorkload(client_id="c", user="u", gpus=1, kind=""),
            live_cmds.SUBMIT_OPTIONS,
            "--kind",
        ),
        (m.DrainHost(host="h1", operator=""), live_cmds.HOST_OPTIONS, "--operator"),
        (m.UndrainHost(host="h1", operator=""), live_cmds.HOST_OPTIONS, "--operator"),
        (
            m.CancelWorkload(workload_id="w", user=""),
            live_cmds.OPERATOR_CANCEL_OPTIONS,
            "--operator",
        ),
        (m.SetBudget(path=("root", "nlp"), shares=1, set_by=""), live_cmds.BUDGET_OPTIONS, "--by"),
    ],
    ids=["submit-user", "submit-kind", "drain-operator", "undrain-operator", "cancel", "by"],
)
def test_an_empty_name_is_refused_in_plain_words_naming_the_option(
    msg: msgspec.Struct, options: dict[str, str], option: str
) -> None:
    # The SDK checks a message by decoding it as intake does: msgspec's own wording comes
    # back, and the CLI must not show it.
    with pytest.raises(ValidationError) as wire:
        codec.decode_as(type(msg), codec.encode(msg))
    exc = live_cmds.renamed(wire.value, options)
    assert str(exc) == f"{option}: must not be empty (a name of letters, digits, '_' and '-')"


def test_unreachable_stack_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = live_cmds.main(["queue", "--nats-url", "nats://127.0.0.1:1"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach NATS at nats://127.0.0.1:1" in err[0]


# -- when watch stops ---------------------------------------------------------------------------


def _notice(requeue: bool) -> m.PreemptionNotice:
    return m.PreemptionNotice(
        workload_id="w",
        at=T0,
        reason="better-ranked",
        grace_deadline=T0 + 1,
        requeue=requeue,
        gpus=1,
    )


def test_ending_final_states_and_preemption() -> None:
    preempted = m.WorkloadPreempted(workload_id="w", at=T0, reason="better-ranked")
    assert Ending().ends(m.WorkloadCompleted(workload_id="w", at=T0))
    assert Ending().ends(m.WorkloadFailed(workload_id="w", at=T0))
    assert Ending().ends(m.WorkloadCancelled(workload_id="w", at=T0))
    e = Ending()
    assert not e.ends(_notice(requeue=True)) and not e.ends(preempted)
    e = Ending()
    assert not e.ends(_notice(requeue=False)) and e.ends(preempted)
    e = Ending()  # requeued logged before the agent's report: not the end
    e.ends(_notice(requeue=False))
    e.ends(m.WorkloadRequeued(workload_id="w", at=T0, attempt=2))
    assert not e.ends(preempted)
    e = Ending()  # no notice seen: the submission's resumable decides
    e.ends(
        m.WorkloadSubmitted(
            workload_id="w", client_id="c", user="u", gpus=1, at=T0, resumable=False
        )
    )
    assert e.ends(preempted)


def test_prio_table_lists_the_inputs_of_each_position() -> None:
    snap = m.PrioSnapshot(
        at=1000.0,
        rows=(
            m.PrioRow(
                position=1,
                workload_id="w1",
                allocation="nlp",
                user="ann",
                gpus=8,
                tier=0,
                tier_name="under-entitlement",
                held=4,
                entitlement=9.6,
                order_key=2,
                rank=3,
                fairshare=0.6,
                priority=5,
                age_s=125.0,
            ),
            m.PrioRow(
                position=2,
                workload_id="w2",
                user="bo",
                gpus=1,
                tier=2,
                tier_name="unallocated",
                age_s=3.0,
            ),
        ),
        total=2,
    )
    text = fmt.prio_table(snap)
    header, _, first, second, footer, legend = text.splitlines()
    assert header.split() == [
        "POS",
        "WORKLOAD",
        "ALLOC",
        "USER",
        "GPUS",
        "TIER",
        "HELD",
        "ENTITLED",
        "FAIRSHARE",
        "PRIO",
        "AGE",
    ]
    assert first.split() == [
        "1",
        "w1",
        "nlp",
        "ann",
        "8",
        "under-entitlement",
        "4",
        "9.6",
        "0.600",
        "5",
        "2.1m",
    ]
    assert second.split()[2] == fmt.alloc_cell(None)
    assert second.split()[6:10] == ["0", "0.0", fmt.NONE, "0"]
    assert footer.startswith("2 pending (at ")
    assert legend == fmt.ORDER_NOTE
    # A capped answer says so, as allot queue's does (2,584 pending, 2,000 rows).
    capped = fmt.prio_table(msgspec.structs.replace(snap, total=2584)).splitlines()[-2]
    assert capped.startswith("2584 pending (first 2 shown) (at ")


def test_status_text_of_pending_work_says_why_it_waits_and_when_it_may_start() -> None:
    queue = _queue()
    row = queue.rows[0]
    status = m.WorkloadStatus(workload_id="wl-a", state="pending", allocation="nlp", gpus=8)
    lines = dict(line.split(":", 1) for line in fmt.status_text(status, row, queue.at).splitlines())
    assert lines["waiting for"].strip() == "room only behind protected work"
    assert lines["waiting code"].strip() == "protected-until"
    assert lines["est. start"].strip() == "2027-01-15T12:00:00Z (~55.0m)"
    assert "waiting for" not in fmt.status_text(status)  # no row: nothing invented


@pytest.mark.parametrize(
    ("argv", "usage", "said"),
    [
        (
            ["submit", "--gpus", "1", "--min-runtme", "1h"],
            "usage: allot submit ",
            "allot submit: error: unrecognized arguments: --min-runtme (did you mean "
            "--min-runtime?)",
        ),
        (
            ["budgets", "set", "root/nlp", "3", "--bye", "me"],
            "usage: allot budgets set ",
            "unrecognized arguments: --bye (did you mean --by?) me",
        ),
        (  # a right option in the wrong place: no "did you mean" the same word
            ["--json", "queue"],
            "usage: allot queue ",
            "unrecognized arguments: --json (an option of allot queue: put it after allot queue)",
        ),
    ],
)
def test_a_misspelt_option_gets_its_commands_usage_and_the_option_meant(
    argv: list[str], usage: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse reported it with `allot`'s own usage (`allot [-h] COMMAND ...`)."""
    with pytest.raises(SystemExit) as exit_:
        cli_main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and usage in err and said in err, err
