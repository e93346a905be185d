"""``allot twin --from FILE``: a recorded history replayed with no server, its figures and
differences printed; bad input is one line naming the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_twin import a_run_end_in_flight, other_grace_settings

from allot.cli import main as cli_main
from allot.eventlog.record_file import encode_records


def allot(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    path = tmp_path / "log.jsonl"
    path.write_bytes(encode_records(a_run_end_in_flight().records))
    return path


# The unit tests' leader runs these knobs (test_twin.POLICY).
KNOBS = ("--grace-s", "10", "--unallocated-grace-s", "5", "--unallocated-settle-s", "0")


def test_a_recorded_history_prints_its_figures_and_kinds(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = allot(capsys, "twin", "--from", str(recorded), *KNOBS)
    assert code == 0, err
    assert "2 live cycles" in out
    assert "placements identical: 2 of 2 (100.0%): 1 at the cycle's time, 1 within" in out
    assert "run-end-in-flight  1 cycle, 1 placement: a run's end" in out
    assert "largest lag used: 250 ms" in out


def test_json_holds_the_figures_and_every_cycle_not_identical(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = allot(capsys, "twin", "--from", str(recorded), "--json", *KNOBS)
    assert code == 0
    document = json.loads(out)
    assert document["kind"] == "TwinParity"
    data = document["data"]
    assert data["fraction_identical"] == 1.0
    assert data["window"] == {"since": None, "until": None}
    [difference] = data["differences"]
    assert difference["kind"] == "run-end-in-flight"
    assert difference["live"]["placements"][0]["workload"] == "small"


def test_other_grace_settings_show_as_notice_deadlines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(encode_records(other_grace_settings().records))
    code, out, _ = allot(capsys, "twin", "--from", str(path), *KNOBS)
    assert code == 0
    assert "notice-deadline" in out and "cycles that differ:" in out
    code, out, _ = allot(capsys, "twin", "--from", str(path), "--json", *KNOBS[:2])
    assert json.loads(out)["data"]["kinds"].keys() == {"notice-deadline"}


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--tolerance-s", "-1"), "--tolerance-s"),
        (("--tolerance-s", "inf"), "--tolerance-s"),
        (("--grace-s", "-5"), "--grace-s"),
        (("--unallocated-settle-s", "-1"), "--unallocated-settle-s"),
        (("--save", "x.jsonl"), "--save"),
    ],
)
def test_bad_options_are_one_line_naming_them(
    recorded: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], named: str
) -> None:
    code, out, err = allot(capsys, "twin", "--from", str(recorded), *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"allot twin: {named}") and err.count("\n") == 1


def test_a_file_that_is_not_a_recorded_log_is_refused_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"type": "HostRegistered", "host": "a", "gpus": 8, "at": 1}\nnot json\n')
    code, _, err = allot(capsys, "twin", "--from", str(path))
    assert code == 2
    assert f"--from {path}: line 2:" in err
    code, _, err = allot(capsys, "twin", "--from", str(tmp_path / "none.jsonl"))
    assert code == 2 and "--from" in err and "No such file" in err
