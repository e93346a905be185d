"""`allot up`'s printed hints point the CLI at the stack it started; the CLI's own noise
filter (asyncio's TLS warning)."""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path

import pytest

from allot.cli import stack_url
from allot.cli.main import build_parser, main
from allot.cli.up_cmd import redis_export, wait_for_stop


@pytest.mark.parametrize("command", [["accounting", "usage"], ["accounting", "rebuild"]])
def test_the_printed_redis_export_is_what_allot_accounting_reads(
    monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """An embedded Redis is not on the default port: a user who pastes the printed line
    gets the stack's counters, not another server's."""
    url = "redis://127.0.0.1:16380"
    words = shlex.split(redis_export(url), comments=True)
    assert words[0] == "export"
    name, value = words[1].split("=", 1)
    monkeypatch.setenv(name, value)
    args = build_parser().parse_args(command)
    assert stack_url.redis_url(args.redis_url, os.environ, Path.cwd()) == url


def test_the_cli_drops_asyncios_ssl_eof_warning_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncio's "returning true from eof_received() ..." came with every command run over
    TLS (``allot up --secure``); other asyncio warnings still show."""
    assert main(["simulate", "--out", str(tmp_path)]) == 2  # any command installs the filter
    asyncio_log = logging.getLogger("asyncio")
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        asyncio_log.warning("returning true from eof_received() has no effect when using ssl")
        asyncio_log.warning("Executing <Task ...> took 0.2 seconds")
    assert [r.getMessage() for r in caplog.records] == ["Executing <Task ...> took 0.2 seconds"]


def test_a_death_during_the_asked_stop_is_not_reported() -> None:
    """A TERM to the whole process group reaches the services with allot up's own: they may
    exit before the loop sees its flag, and that is the stop, not a death (exit 1)."""
    stopping: list[int] = []

    def dead() -> str | None:
        stopping.append(15)  # the handler ran while the loop slept; the services are gone
        return "service intake exited with 0"

    assert wait_for_stop(dead, stopping, pause_s=0) is None


def test_a_death_without_a_stop_is_reported() -> None:
    deaths = iter([None, None, "service ranking exited with 2"])
    assert wait_for_stop(lambda: next(deaths), [], pause_s=0) == "service ranking exited with 2"


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--grace-s", "-4"], "--grace-s"),
        (["--rank-every-s", "0"], "--rank-every-s"),
        (["--rank-every-s", "inf"], "--rank-every-s"),
        (["--nats-url", "http://127.0.0.1:4222"], "--nats-url"),
        (["--redis-url", "http://127.0.0.1:6379"], "--redis-url"),
        (["--run-dir", "/proc/allot-no-such/run"], "--run-dir"),
        (["--restart-limit", "-1"], "--restart-limit"),
        (["--restart-window-s", "0"], "--restart-window-s"),
        (["--restart-backoff-s", "nan"], "--restart-backoff-s"),
    ],
)
def test_bad_stack_options_are_refused_before_anything_starts(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    if "--run-dir" not in argv:
        argv = [*argv, "--run-dir", str(tmp_path / "run")]
    assert main(["up", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"allot up: {field}: "), err


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("name: root\nchildren:\n  - {name: a, shares: -1}\n", "negative shares"),
        ("name: [\n", "invalid YAML"),
    ],
)
def test_a_bad_budget_file_is_refused_naming_the_option(
    text: str, reason: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(text, encoding="utf-8")
    assert main(["up", "--budgets", str(budgets), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("allot up: --budgets: ") and reason in err


def test_a_run_dir_that_is_a_file_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "file"
    run_dir.write_text("x", encoding="utf-8")
    assert main(["demo", "--run-dir", str(run_dir)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"allot demo: --run-dir: {run_dir} is a file, not a folder"
    )
