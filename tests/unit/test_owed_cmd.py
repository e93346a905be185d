"""``allot owed``: its tables, its JSON lines and its options, without NATS."""

from __future__ import annotations

import json

import pytest

from allot.cli import main as cli_main
from allot.cli import owed_cmd
from allot.cli.durations import duration_label
from allot.core.errors import ValidationError
from allot.proto import messages as m

AT = 1_800_000_000.0
DAY = 86400.0


def snapshot(window_s: float = DAY, overall: float | None = 0.95) -> m.OwedSnapshot:
    return m.OwedSnapshot(
        at=AT,
        since=AT - window_s,
        window_s=window_s,
        bucket_s=3600,
        overall=overall,
        rows=(
            m.OwedRow(
                allocation="nlp",
                owed_gpu_h=120.25,
                delivered_gpu_h=110.0,
                ratio=0.914761,
                effective_share=0.25,
                idle_gpu_h=2.5,
                lost_gpu_h=1.25,
            ),
            m.OwedRow(
                allocation="ops",
                owed_gpu_h=0.0,
                delivered_gpu_h=0.0,
                ratio=None,
                effective_share=0.5,
            ),
            m.OwedRow(
                allocation="vision",
                owed_gpu_h=1000.0,
                delivered_gpu_h=1000.0,
                ratio=1.0,
                effective_share=0.25,
            ),
        ),
    )


def test_the_table_shows_budget_owed_delivered_ratio_and_overall() -> None:
    assert owed_cmd.owed_table(snapshot()).splitlines() == [
        "last 1d: 2027-01-14T08:00:00Z .. 2027-01-15T08:00:00Z, 1h buckets",
        "ALLOCATION  BUDGET %  OWED GPU-h  DELIVERED GPU-h  DELIVERED/OWED  IDLE GPU-h  LOST GPU-h",
        "----------  --------  ----------  ---------------  --------------  ----------  ----------",
        "nlp             25.0      120.25           110.00           91.5%        2.50        1.25",
        "ops             50.0        0.00             0.00               -        0.00        0.00",
        "vision          25.0     1000.00          1000.00          100.0%        0.00        0.00",
        "overall        100.0     1120.25          1110.00           95.0%        2.50        1.25",
    ]


def test_a_young_stacks_hundredths_are_not_printed_as_zeros_beside_their_ratio() -> None:
    """The issue's ``0.00 0.00 0.977``: small figures keep three significant digits."""
    row = m.OwedRow(
        allocation="nlp",
        owed_gpu_h=0.00412,
        delivered_gpu_h=0.00403,
        ratio=0.977,
        effective_share=0.3,
    )
    snap = m.OwedSnapshot(at=AT, since=AT - 3600, window_s=3600, bucket_s=3600, rows=(row,))
    assert owed_cmd.owed_table(snap).splitlines()[3].split() == [
        "nlp",
        "30.0",
        "0.00412",
        "0.00403",
        "97.7%",
        "0.00",
        "0.00",
    ]


def test_the_legend_says_what_each_figure_counts_and_as_of_when() -> None:
    text = owed_cmd.owed_text([snapshot()])
    legend = text.split("\n\n")[-1]
    assert legend.startswith("GPU-hours from the log up to 2027-01-15T08:00:00Z")
    assert "DELIVERED = allocated GPU-h it ran, from each placement, at most OWED" in legend
    assert "allot accounting usage" in legend and "whole slots" in legend


def test_nothing_owed_shows_a_dash_for_the_overall_ratio() -> None:
    empty = m.OwedSnapshot(at=AT, since=AT - DAY, window_s=DAY, bucket_s=600)
    lines = owed_cmd.owed_table(empty).splitlines()
    assert lines[0].endswith("10m buckets")
    assert lines[-1].split() == ["overall", "0.0", "0.00", "0.00", "-", "0.00", "0.00"]
    assert owed_cmd.owed_text([]) == ""


def test_two_windows_are_two_tables_and_two_json_lines() -> None:
    day, week = snapshot(DAY), snapshot(7 * DAY, overall=0.9)
    text = owed_cmd.owed_text([day, week])
    assert [line for line in text.splitlines() if line.startswith("last ")] == [
        "last 1d: 2027-01-14T08:00:00Z .. 2027-01-15T08:00:00Z, 1h buckets",
        "last 7d: 2027-01-08T08:00:00Z .. 2027-01-15T08:00:00Z, 1h buckets",
    ]
    lines = owed_cmd.owed_json_lines([day, week]).splitlines()
    envelopes = [json.loads(line) for line in lines]
    assert [(e["kind"], e["at"], e["data"]["window_s"]) for e in envelopes] == [
        ("OwedSnapshot", AT, DAY),
        ("OwedSnapshot", AT, 7 * DAY),
    ]
    assert envelopes[1]["data"]["overall"] == 0.9
    assert envelopes[0]["data"]["rows"][0] == {
        "allocation": "nlp",
        "owed_gpu_h": 120.25,
        "delivered_gpu_h": 110.0,
        "ratio": 0.914761,
        "effective_share": 0.25,
        "idle_gpu_h": 2.5,
        "lost_gpu_h": 1.25,
    }


@pytest.mark.parametrize(
    ("seconds", "label"),
    [(7 * DAY, "7d"), (DAY, "1d"), (12 * 3600.0, "12h"), (5400.0, "90m"), (45.0, "45s")],
)
def test_duration_labels(seconds: float, label: str) -> None:
    assert duration_label(seconds) == label


@pytest.mark.parametrize(
    ("parse", "text", "expected"),
    [
        (owed_cmd.parse_window, "1d", 86400),
        (owed_cmd.parse_window, "12h", 43200),
        (owed_cmd.parse_window, "90d", 90 * 86400),
        (owed_cmd.parse_bucket, "1h", 3600),
        (owed_cmd.parse_bucket, "1m", 60),
    ],
)
def test_options_parse(parse: object, text: str, expected: int) -> None:
    assert callable(parse)
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("parse", "text", "option", "reason"),
    [
        (owed_cmd.parse_window, "91d", "--window", "outside"),
        (owed_cmd.parse_window, "0", "--window", "outside"),
        (owed_cmd.parse_window, "a week", "--window", "not a duration"),
        (owed_cmd.parse_bucket, "30s", "--bucket", "outside 1m..1d"),
        (owed_cmd.parse_bucket, "2d", "--bucket", "outside 1m..1d"),
    ],
)
def test_bad_options_name_the_option(parse: object, text: str, option: str, reason: str) -> None:
    assert callable(parse)
    with pytest.raises(ValidationError, match=reason) as info:
        parse(text)
    assert info.value.field == option


def test_allot_owed_is_registered_with_the_common_options() -> None:
    args = cli_main.build_parser().parse_args(
        ["owed", "--window", "7d", "--json", "--nats-url", "nats://h:1"]
    )
    assert (args.window, args.bucket, args.json, args.nats_url) == ("7d", "1h", True, "nats://h:1")
    assert args.func is owed_cmd.run_owed


def test_a_bad_window_exits_2_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["owed", "--window", "100d", "--nats-url", "nats://127.0.0.1:1"]) == 2
    assert capsys.readouterr().err.strip() == "allot owed: --window: '100d' is outside (0, 90d]"
