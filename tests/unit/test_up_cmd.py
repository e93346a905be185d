"""`allot up`'s printed hints point the CLI at the stack it started; the CLI's own noise
filter (asyncio's TLS warning)."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

import pytest

from allot.cli.main import build_parser, main
from allot.cli.up_cmd import redis_export


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
    assert args.redis_url == url


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
