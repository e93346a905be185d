"""``allot accounting usage``'s table: GPU-hours labelled with their window, and a legend
saying what was charged as of when (it lags the log that ``allot owed`` reads)."""

from __future__ import annotations

from allot.cli.accounting_cmd import usage_text

AT = 1_800_000_000.0


def test_usage_is_labelled_gpu_hours_of_its_window_and_says_as_of_when() -> None:
    lines = usage_text(AT, 7 * 86400, {"nlp": 0.408, "vision": 0.00123}).splitlines()
    assert lines[0].split() == ["allocation", "GPU-h", "(last", "7d)"]
    assert lines[1].split() == ["nlp", "0.41"]
    assert lines[2].split() == ["vision", "0.00123"]  # not 0.001: three significant digits
    legend = " ".join(lines[3:])
    assert legend.startswith("Charged as of 2027-01-15T08:00:00Z: ended runs in full")
    assert "whole slots" in legend and "allot owed counts from the log" in legend
    assert "not yet" in legend  # no accrual so far


def test_the_legend_says_until_when_running_work_was_charged() -> None:
    legend = " ".join(usage_text(AT, 3600, {"nlp": 1.0}, AT - 120).splitlines()[2:])
    assert "running ones in whole slots up to 2027-01-15T07:58:00Z" in legend


def test_an_hour_window_is_labelled_1h() -> None:
    assert usage_text(AT, 3600, {}).splitlines()[0].split() == [
        "allocation",
        "GPU-h",
        "(last",
        "1h)",
    ]
