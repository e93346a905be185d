"""The CLI talks to the stack it was started with, or says what to export (issue 36).

``make up`` runs its stack in ``out/up`` and ``allot up --run-dir DIR`` anywhere; both
record the run dir in ``<folder>/.allot/stacks`` so an ``allot queue`` typed in that
folder (or below it) finds the stack. ``ALLOT_RUN_DIR`` names one from anywhere. With no
stack and no server named, a command connects to nothing and exits 1 with one line that
says what to export; it used to ask nats://127.0.0.1:4222, often another team's server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from allot.cli import stack_url
from allot.cli.main import main
from allot.ops.run_dir import (
    LOCK_FILE,
    PORTS_FILE,
    NoStackError,
    find_stack,
    forget_stack,
    record_stack,
    stacks_from,
)


def _running(run_dir: Path, nats: int | None = 4567, redis: int | None = 16379) -> Path:
    """A run dir that looks like a live ``allot up``'s: this process holds its lock."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_FILE).write_text(f"{os.getpid()}\n", encoding="utf-8")
    ports = {k: v for k, v in {"nats": nats, "redis": redis}.items() if v is not None}
    (run_dir / PORTS_FILE).write_text(json.dumps(ports), encoding="utf-8")
    return run_dir


def _stopped(run_dir: Path) -> Path:
    """A run dir whose ``allot up`` has exited (its lock names a dead pid)."""
    _running(run_dir)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    (run_dir / LOCK_FILE).write_text(f"{child.pid}\n", encoding="utf-8")
    return run_dir


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ALLOT_NATS_URL", "ALLOT_RUN_DIR", "ALLOT_REDIS_URL", "ALLOT_NATS_USER"):
        monkeypatch.delenv(name, raising=False)


def test_make_ups_run_dir_is_found_from_its_folder_and_below(tmp_path: Path) -> None:
    run_dir = _running(tmp_path / "out" / "up")
    record_stack(run_dir, tmp_path)
    assert (tmp_path / ".allot" / ".gitignore").read_text() == "*\n"  # run state: never committed
    for folder in (tmp_path, tmp_path / "docs" / "deep"):
        folder.mkdir(parents=True, exist_ok=True)
        assert find_stack({}, folder).nats_url == "nats://127.0.0.1:4567"
    forget_stack(run_dir, tmp_path)
    assert stacks_from(tmp_path) == []


def test_the_default_run_dir_is_found_without_a_record(tmp_path: Path) -> None:
    _running(tmp_path / ".allot", nats=4999)
    assert find_stack({}, tmp_path).nats_url == "nats://127.0.0.1:4999"


def test_a_stopped_stacks_record_is_ignored_and_dropped_at_the_next_record(
    tmp_path: Path,
) -> None:
    old = _stopped(tmp_path / "old")
    record_stack(old, tmp_path)
    with pytest.raises(NoStackError):
        find_stack({}, tmp_path)
    new = _running(tmp_path / "new")
    record_stack(new, tmp_path)
    recorded = (tmp_path / ".allot" / "stacks").read_text().splitlines()
    assert recorded == [str(new.resolve())]


@pytest.mark.parametrize(
    ("layout", "environ", "says"),
    [
        pytest.param(
            "none",
            {},
            ["no Allot stack found", "make up", "export ALLOT_RUN_DIR=", "export ALLOT_NATS_URL="],
            id="nothing-runs-here: says what to start or export",
        ),
        pytest.param(
            "none",
            {"ALLOT_RUN_DIR": "/nowhere"},
            ["no Allot stack runs in ALLOT_RUN_DIR=/nowhere", "unset ALLOT_RUN_DIR"],
            id="ALLOT_RUN_DIR-names-a-dir-where-nothing-runs",
        ),
        pytest.param(
            "two",
            {},
            ["2 Allot stacks run from here", "export ALLOT_RUN_DIR=<one of them>"],
            id="two-stacks-from-one-folder: choose one",
        ),
        pytest.param(
            "secure",
            {},
            ["runs --secure", "set -a; .", "auth/users/<user>.env; set +a"],
            id="a-secure-stack-needs-a-users-credentials",
        ),
        pytest.param(
            "given-nats",
            {},
            ["uses a NATS server it was given", "export ALLOT_NATS_URL=<that URL>"],
            id="a-stack-on-a-given-server-remembers-no-port",
        ),
    ],
)
def test_without_a_usable_stack_the_error_says_what_to_export(
    tmp_path: Path, layout: str, environ: dict[str, str], says: list[str]
) -> None:
    if layout == "two":
        record_stack(_running(tmp_path / "a"), tmp_path)
        record_stack(_running(tmp_path / "b"), tmp_path)
    elif layout == "secure":
        (_running(tmp_path / ".allot") / "auth").mkdir()
    elif layout == "given-nats":
        _running(tmp_path / ".allot", nats=None)
    with pytest.raises(NoStackError) as caught:
        stack_url.nats_url(None, environ, tmp_path)
    for words in says:
        assert words in str(caught.value)


@pytest.mark.parametrize(
    ("given", "environ", "url"),
    [
        pytest.param(
            "nats://flag:1", {"ALLOT_NATS_URL": "nats://env:2"}, "nats://flag:1", id="flag"
        ),
        pytest.param(None, {"ALLOT_NATS_URL": "nats://env:2"}, "nats://env:2", id="env-url"),
        pytest.param(None, {"ALLOT_RUN_DIR": "RUN"}, "nats://127.0.0.1:5001", id="env-run-dir"),
        pytest.param(None, {}, "nats://127.0.0.1:5002", id="recorded-here"),
    ],
)
def test_the_server_named_wins_then_allot_run_dir_then_the_stack_started_here(
    tmp_path: Path, given: str | None, environ: dict[str, str], url: str
) -> None:
    elsewhere = _running(tmp_path / "elsewhere", nats=5001)
    record_stack(_running(tmp_path / "here" / "out" / "up", nats=5002), tmp_path / "here")
    environ = {k: str(elsewhere) if v == "RUN" else v for k, v in environ.items()}
    assert stack_url.nats_url(given, environ, tmp_path / "here") == url


def test_a_clustered_stack_is_found_with_every_node_so_any_one_may_be_down(
    tmp_path: Path,
) -> None:
    run_dir = _running(tmp_path / ".allot", nats=4999)
    ports = json.loads((run_dir / PORTS_FILE).read_text(encoding="utf-8"))
    ports["nats_nodes"] = [4999, 5001, 5003]  # allot up --nats-cluster 3
    (run_dir / PORTS_FILE).write_text(json.dumps(ports), encoding="utf-8")
    assert find_stack({}, tmp_path).nats_url == (
        "nats://127.0.0.1:4999,nats://127.0.0.1:5001,nats://127.0.0.1:5003"
    )


def test_the_redis_of_the_stack_is_found_for_allot_accounting(tmp_path: Path) -> None:
    record_stack(_running(tmp_path / "out" / "up", redis=16400), tmp_path)
    assert stack_url.redis_url(None, {}, tmp_path) == "redis://127.0.0.1:16400"
    assert stack_url.redis_url(None, {"ALLOT_REDIS_URL": "redis://r:1"}, tmp_path) == "redis://r:1"


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["queue"], id="queue"),
        pytest.param(["submit", "--user", "ann", "--gpus", "1", "--duration", "1m"], id="submit"),
        pytest.param(["owed"], id="owed"),
        pytest.param(["accounting", "usage"], id="accounting-usage"),
    ],
)
def test_a_command_with_no_stack_connects_to_nothing_and_exits_1_saying_what_to_export(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"allot {argv[0]}: no Allot stack found")
    assert "export ALLOT_NATS_URL=" in err and "4222" not in err.split("compose")[0]
    assert err.count("\n") == 1  # one line


@pytest.mark.usefixtures("clean_env")
def test_allot_up_runs_in_allot_run_dir_when_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from allot.cli.main import build_parser

    assert build_parser().parse_args(["up"]).run_dir == Path(".allot")
    monkeypatch.setenv("ALLOT_RUN_DIR", str(tmp_path / "x"))
    assert build_parser().parse_args(["up"]).run_dir == tmp_path / "x"
