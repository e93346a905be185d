"""The README's counts are the code's (issue 36: it said "6 services" and "seven
services" while ``allot up`` printed 10 processes, and the demo took "~30 s" in the README
and "about a minute" in its ``--help``)."""

from __future__ import annotations

import re
from pathlib import Path

from allot.cli import demo_cmd
from allot.ops.stack import Stack, StackConfig

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
WORDS = {"six": 6, "seven": 7, "eight": 8}


def _default_stack(tmp_path: Path) -> Stack:
    stack = Stack(StackConfig(run_dir=tmp_path))
    stack.budgets_path = tmp_path / "budgets.yaml"  # what start() sets; commands() reads it
    return stack


def test_the_services_and_processes_the_readme_counts_are_those_allot_up_starts(
    tmp_path: Path,
) -> None:
    names = list(_default_stack(tmp_path).commands())
    agents = [n for n in names if n.startswith("agent-")]
    services = {re.sub(r"-\d+$", "", n) for n in names if n not in agents} - {"dashboard"}
    said = {WORDS[w] for w in re.findall(r"\b(six|seven|eight) services\b", README)}
    assert said == {len(services)}
    assert re.findall(r"\b(\d+) processes\b", README) == [str(len(names))]
    config = StackConfig(run_dir=tmp_path)
    hosts = sum(a.hosts for a in config.agents)
    gpus = {a.gpus for a in config.agents}
    assert f"{hosts} fake hosts of {gpus.pop()} GPUs" in README


def test_the_demos_length_is_said_the_same_way_everywhere() -> None:
    assert demo_cmd.__doc__ is not None
    assert "about half a minute" in demo_cmd.__doc__.splitlines()[0]
    assert "about half a minute" in README
    run_help = next(
        line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("run:")
    )
    assert "~30 s" in run_help
