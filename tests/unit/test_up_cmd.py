"""``allot up``'s printed hints point the CLI at the stack it started."""

from __future__ import annotations

import shlex

import pytest

from allot.cli.main import build_parser
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
