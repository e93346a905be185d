"""``allot up`` against given servers that do not answer: one line within seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from allot.cli.main import main

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("broken", ["nats", "redis"])
def test_an_unreachable_given_server_is_one_line_within_seconds(
    broken: str,
    fresh_log: str,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # Before 2026-12-03 an unreachable --nats-url spun for two minutes of tracebacks.
    nats_url = "nats://u:secret@127.0.0.1:1" if broken == "nats" else fresh_log
    redis = "redis://127.0.0.1:1" if broken == "redis" else redis_url
    argv = ["up", "--nats-url", nats_url, "--redis-url", redis]
    assert main([*argv, "--run-dir", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    want = (
        "cannot reach NATS at nats://u:***@127.0.0.1:1"
        if broken == "nats"
        else ("cannot reach Redis at redis://127.0.0.1:1")
    )
    assert len(err) == 1 and err[0].startswith(f"allot up: {want}"), err
    assert "secret" not in err[0]
