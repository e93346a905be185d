"""``allot fairshare TREE.yaml [--json]`` and the YAML loader behind it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from allot.cli import fairshare_cmd
from allot.config.yaml_io import load_yaml
from allot.core.errors import ValidationError

REPO = Path(__file__).resolve().parents[2]

EXAMPLE = """\
name: root
children:
  - name: nlp            # an account: has children
    shares: 40
    children:
      - {name: pretrain, shares: 30, usage: 20}    # a leaf: usage in GPU-seconds
      - {name: evals, shares: parent, usage: 5}
  - {name: vision, shares: 10, usage: 0}
"""


def write(tmp_path: Path, text: str, name: str = "tree.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def run_cli(argv: list[str]) -> int:
    """Parse like ``allot`` does (subparsers + register) and dispatch ``args.func``."""
    parser = argparse.ArgumentParser(prog="allot")
    fairshare_cmd.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


# -- the table and the JSON ----------------------------------------------------------------


def test_table_is_sshare_long_style(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["fairshare", str(write(tmp_path, EXAMPLE))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "Account",
        "User",
        "RawShares",
        "NormShares",
        "RawUsage",
        "EffectvUsage",
        "LevelFS",
        "Rank",
        "FairShare",
    ]
    assert set(lines[1]) == {"-", " "}
    rows = [line.split() for line in lines[2:-1]]
    assert lines[-1].startswith("Rank: Slurm's Fair Tree rank, 3 (the number of allocations)")
    assert rows == [
        ["root", "1.000000", "25", "1.000000"],
        ["nlp", "40", "0.800000", "25", "1.000000", "0.800000"],
        ["nlp", "pretrain", "30", "1.000000", "20", "0.800000", "1.250000", "1", "0.333333"],
        ["nlp", "evals", "parent", "0.800000", "5", "0.200000", "inf", "2", "0.666667"],
        ["root", "vision", "10", "0.200000", "0", "0.000000", "inf", "3", "1.000000"],
    ]
    # Accounts are indented one space per level, as sshare does.
    assert lines[3].startswith(" nlp ")


def test_json_has_one_object_per_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["fairshare", str(write(tmp_path, EXAMPLE)), "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)
    assert nodes == [
        {
            "path": "root/nlp",
            "leaf": False,
            "raw_shares": 40,
            "norm_shares": 0.8,
            "raw_usage": 25.0,
            "effective_usage": 1.0,
            "level_fs": 0.8,
            "rank": None,
            "fairshare": None,
        },
        {
            "path": "root/nlp/pretrain",
            "leaf": True,
            "raw_shares": 30,
            "norm_shares": 1.0,
            "raw_usage": 20.0,
            "effective_usage": 0.8,
            "level_fs": 1.25,
            "rank": 1,
            "fairshare": pytest.approx(1 / 3),
        },
        {
            "path": "root/nlp/evals",
            "leaf": True,
            "raw_shares": "parent",
            "norm_shares": 0.8,
            "raw_usage": 5.0,
            "effective_usage": 0.2,
            "level_fs": "inf",
            "rank": 2,
            "fairshare": pytest.approx(2 / 3),
        },
        {
            "path": "root/vision",
            "leaf": True,
            "raw_shares": 10,
            "norm_shares": 0.2,
            "raw_usage": 0.0,
            "effective_usage": 0.0,
            "level_fs": "inf",
            "rank": 3,
            "fairshare": 1.0,
        },
    ]


def test_json_gives_a_parent_account_a_null_level_fs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = """\
        name: root
        children:
          - name: pool
            shares: parent
            children: [{name: a, shares: 1, usage: 3}]
          - {name: b, shares: 1, usage: 1}
        """
    assert run_cli(["fairshare", str(write(tmp_path, text)), "--json"]) == 0
    pool = json.loads(capsys.readouterr().out)[0]
    assert (pool["path"], pool["raw_shares"], pool["level_fs"]) == ("root/pool", "parent", None)


def test_names_that_look_like_numbers_stay_as_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = """\
        name: root
        children:
          - name: 6214e9
            shares: 2
            children:
              - {name: 103959, shares: 1, usage: 1.5e3}
              - {name: 0e4a51, shares: 1}
          - {name: 0755, shares: 1, usage: 7}
        """
    assert run_cli(["fairshare", str(write(tmp_path, text)), "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)
    assert [n["path"] for n in nodes] == [
        "root/6214e9",
        "root/6214e9/103959",
        "root/6214e9/0e4a51",
        "root/0755",
    ]
    assert nodes[1]["raw_usage"] == 1500.0  # a YAML 1.2 exponent is still a number


# -- bad files: one line on stderr, exit 2 -------------------------------------------------

BAD_FILES = [
    (
        "negative-shares",
        "name: root\nchildren:\n  - name: nlp\n    shares: 4\n    children:\n"
        "      - {name: evals, shares: -3}\n",
        "root/nlp/evals.shares: negative shares -3",
    ),
    (
        "duplicate-name",
        "name: root\nchildren:\n  - {name: a, shares: 1}\n  - {name: a, shares: 2}\n",
        "root/a: duplicate name 'a'",
    ),
    (
        "usage-on-an-account",
        "name: root\nchildren:\n  - name: a\n    shares: 1\n    usage: 5\n"
        "    children: [{name: b, shares: 1}]\n",
        "root/a.usage: usage is only allowed on leaf",
    ),
    (
        "name-with-a-dot",
        "name: root\nchildren:\n  - {name: a.b, shares: 1}\n",
        "root/children[0].name: name 'a.b' may only contain",
    ),
    (
        "unknown-field",
        "name: root\nchildren:\n  - {name: a, shares: 1, gpu: 8}\n",
        "root/a: unknown field 'gpu'",
    ),
    ("empty-tree", "name: root\n", "root: empty tree"),
    ("not-a-mapping", "- a\n- b\n", "tree: the file must hold one mapping"),
    ("yaml-syntax", "name: root\nchildren: [\n  - a\n", "invalid YAML at line 3, column 3"),
    (
        "duplicate-yaml-key",
        "name: root\nchildren:\n  - name: a\n    shares: 1\n    shares: 2\n",
        "duplicate key 'shares' (first at line 4)",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_a_bad_file_prints_one_line_naming_the_node_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = write(tmp_path, text)
    assert run_cli(["fairshare", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"allot fairshare: {path}: ")
    assert message in err


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert run_cli(["fairshare", str(missing)]) == 2
    assert capsys.readouterr().err == f"allot fairshare: {missing}: no such file\n"


def test_the_installed_entry_point_behaves_the_same(tmp_path: Path) -> None:
    """End to end through ``python -m allot.cli.main`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "shared")}
    good = subprocess.run(
        [
            sys.executable,
            "-m",
            "allot.cli.main",
            "fairshare",
            str(write(tmp_path, EXAMPLE)),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert good.returncode == 0, good.stderr
    assert [n["rank"] for n in json.loads(good.stdout)] == [None, 1, 2, 3]

    bad = write(tmp_path, EXAMPLE.replace("shares: 30", "shares: 2.5"), "bad.yaml")
    result = subprocess.run(
        [sys.executable, "-m", "allot.cli.main", "fairshare", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"allot fairshare: {bad}: root/nlp/pretrain.shares: non-integer shares 2.5; "
        "shares must be an integer"
    ]


# -- the loader ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("6214e9", "6214e9"),
        ("103959", "103959"),
        ("0e4a51", "0e4a51"),
        ("0755", "0755"),
        ("1_000", "1_000"),
        ("1.5e+3", "1.5e+3"),
        ("yes", "yes"),
        ("'quoted'", "quoted"),
    ],
    ids=[
        "exponent",
        "digits",
        "hex-ish",
        "octal-looking",
        "underscored",
        "float",
        "bool",
        "quoted",
    ],
)
def test_names_and_parents_load_as_typed(tmp_path: Path, typed: str, expected: str) -> None:
    data = load_yaml(write(tmp_path, f"- name: {typed}\n  parent: {typed}\n  shares: 12\n"))
    assert data == [{"name": expected, "parent": expected, "shares": 12}]


def test_other_values_keep_their_yaml_types(tmp_path: Path) -> None:
    data = load_yaml(
        write(tmp_path, "shares: 40\nusage: 6214e9\nflag: yes\nnothing: ~\nname: ~\n7: x\n")
    )
    assert data == {
        "shares": 40,
        "usage": 6.214e12,
        "flag": True,
        "nothing": None,
        "name": None,  # a null name stays null, so it is reported as missing
        "7": "x",  # mapping keys are text
    }


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p / "absent.yaml", "no such file"),
        (lambda p: p, "is a directory"),
        (lambda p: write(p, "a: [1,\n"), "invalid YAML at line 2"),
        (lambda p: write(p, "count: " + "9" * 5000 + "\n"), "out of range"),
    ],
    ids=["missing", "directory", "syntax", "an-int-of-5000-digits"],
)
def test_loader_errors_name_the_file(tmp_path: Path, make: object, reason: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(ValidationError) as err:
        load_yaml(path)
    assert err.value.field == str(path)
    assert reason in err.value.reason
    assert "\n" not in err.value.reason
