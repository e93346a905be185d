"""``allot.proto.env_vars.check_env``: what a workload's own environment may hold, each
refusal naming the variable at fault; the CLI runs it before connecting."""

from __future__ import annotations

import pytest

from allot.cli.live_cmds import parse_env_options
from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.proto.env_vars import MAX_ENV_BYTES, MAX_VALUE_CHARS, check_env


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ("A=b", "must be a mapping of NAME to VALUE strings, got str"),
        (["A=b"], "must be a mapping of NAME to VALUE strings, got list"),
        (5, "must be a mapping of NAME to VALUE strings, got int"),
        ({5: "x"}, "a name must be a string, got 5"),
        ({"1ABC": "x"}, "'1ABC' is not a variable name (letters, digits and '_', not"),
        ({"A-B": "x"}, "'A-B' is not a variable name"),
        ({"é": "x"}, "'é' is not a variable name"),
        ({"": "x"}, "'' is not a variable name"),
        ({"A" * 129: "x"}, "is not a variable name"),
        ({"A": b"x"}, "A's value must be a string, got bytes"),
        ({"A": 1}, "A's value must be a string, got int"),
        ({"A": "x\x00y"}, "A's value holds a NUL character"),
        ({"LONG": "x" * (MAX_VALUE_CHARS + 1)}, "LONG's value is 4097 characters; at most 4096"),
        ({f"V{i}": "x" for i in range(m.MAX_ENV + 1)}, "65 variables; at most 64"),
        (
            {f"V{i}": "x" * 4000 for i in range(5)},
            f"20010 bytes of names and values; at most {MAX_ENV_BYTES} in all",
        ),
        ({"CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES: set by the agent"),
        ({"ALLOT_HOST": "h", "ALLOT_AGENT": "1"}, "ALLOT_AGENT, ALLOT_HOST: set by the agent"),
    ],
)
def test_each_refusal_names_env_and_the_variable(env: object, reason: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check_env(env)
    assert caught.value.field == "env"
    assert caught.value.reason.startswith(reason) or reason in caught.value.reason


def test_a_good_env_is_returned_as_a_plain_dict() -> None:
    env = {"A": "x=y", "EMPTY": "", "U": "é名", "_B2": "x" * MAX_VALUE_CHARS}
    assert check_env(env) == env
    assert check_env({}) == {}


@pytest.mark.parametrize(
    ("values", "array", "reason"),
    [
        (["NOEQUALS"], False, "'NOEQUALS' is not NAME=VALUE"),
        (["1A=x"], False, "'1A' is not a variable name"),
        (["ALLOT_ARRAY_TASK_ID=7"], False, "ALLOT_ARRAY_TASK_ID is set by --array"),
        (["ALLOT_ARRAY_TASK_COUNT=3"], True, "ALLOT_ARRAY_TASK_COUNT is set by --array"),
        ([f"V{i}=x" for i in range(63)], True, "63 variables; at most 62"),
        (["CUDA_VISIBLE_DEVICES=1"], True, "CUDA_VISIBLE_DEVICES: set by the agent"),
    ],
)
def test_the_cli_refuses_bad_env_before_connecting(
    values: list[str], array: bool, reason: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_env_options(values, array=array)
    assert caught.value.field == "--env"
    assert reason in caught.value.reason


def test_the_cli_keeps_the_last_of_a_repeated_name() -> None:
    assert parse_env_options(["A=1", "B=x=y", "A=2"]) == {"A": "2", "B": "x=y"}
    assert len(parse_env_options([f"V{i}=x" for i in range(62)], array=True)) == 62
