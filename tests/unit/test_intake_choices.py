"""What counts as "the same submission" when a ``client_id`` comes again: every field the
submitter chose (``allot.services.intake.CHOSEN_FIELDS``), never the server's time."""

from __future__ import annotations

import msgspec
import pytest

from allot.core.budgets import parse_tree
from allot.proto import messages as m
from allot.services.intake import (
    CHOSEN_FIELDS,
    _not_an_allocation,
    differing_choices,
    submitted_record,
)

FIRST = m.SubmitWorkload(
    client_id="run-42",
    user="ann",
    gpus=2,
    allocation="nlp",
    min_runtime_s=3600,
    resumable=False,
    kind="eval",
    priority=5,
    command=("python", "train.py"),
    env={"HF_HOME": "/data/hf"},
    duration_s=30.0,
)
LOGGED = submitted_record(FIRST, "w1", now=1000.0)


def test_every_chosen_field_is_logged_with_the_submission() -> None:
    logged = set(m.WorkloadSubmitted.__struct_fields__)
    assert set(CHOSEN_FIELDS) <= logged
    assert set(CHOSEN_FIELDS) == set(m.SubmitWorkload.__struct_fields__)
    for name in CHOSEN_FIELDS:  # copied, not left at its default
        assert getattr(LOGGED, name) == getattr(FIRST, name), name


def test_a_retry_differs_in_nothing_even_at_another_time() -> None:
    assert differing_choices(submitted_record(FIRST, "w1", now=5000.0), FIRST) == []
    assert differing_choices(LOGGED, FIRST) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param({"gpus": 1}, ["gpus 2, not 1"], id="fewer GPUs"),
        pytest.param({"user": "bob"}, ["user 'ann', not 'bob'"], id="another user"),
        pytest.param({"min_runtime_s": 60}, ["min_runtime_s 3600, not 60"], id="shorter min"),
        pytest.param({"resumable": True}, ["resumable False, not True"], id="now resumable"),
        pytest.param({"kind": "training"}, ["kind 'eval', not 'training'"], id="another kind"),
        pytest.param({"priority": 0}, ["priority 5, not 0"], id="another priority"),
        pytest.param(
            {"command": ("python", "eval.py")},
            ["command ['python', 'train.py'], not ['python', 'eval.py']"],
            id="another command",
        ),
        pytest.param({"duration_s": None}, ["duration_s 30.0, not unset"], id="duration dropped"),
        pytest.param(
            {"env": {"HF_HOME": "/data/hf", "TOKEN": "s3cret"}},
            ["env differs in TOKEN"],
            id="another env: the names, never the values",
        ),
        pytest.param(
            {"env": {"HF_HOME": "/scratch/s3cret"}},
            ["env differs in HF_HOME"],
            id="same env names, another value: not quoted",
        ),
        pytest.param(
            {"gpus": 8, "user": "bob"},
            ["user 'ann', not 'bob'", "gpus 2, not 8"],
            id="two fields: both named, in the message's field order",
        ),
        pytest.param(
            {"command": ("x" * 200,)},
            ["command ['python', 'train.py'], not ['" + "x" * 55 + "..."],
            id="a long value is cut",
        ),
    ],
)
def test_each_differing_choice_is_named(change: dict[str, object], expected: list[str]) -> None:
    again = msgspec.structs.replace(FIRST, **change)
    assert differing_choices(LOGGED, again) == expected


@pytest.mark.parametrize(
    ("name", "said"),
    [
        (
            "research",
            "'research' is an account of the budget tree, not an allocation: submit to one "
            "of its allocations (nlp, vision)",
        ),
        ("chem", "unknown allocation 'chem' (allocations: nlp, vision, ads)"),
    ],
)
def test_a_submission_to_no_allocation_says_which_names_take_work(name: str, said: str) -> None:
    """A newcomer submits to a budget manager's node (an account), or to a typo."""
    tree = parse_tree(
        {
            "name": "root",
            "children": [
                {
                    "name": "research",
                    "shares": 3,
                    "children": [{"name": "nlp", "shares": 1}, {"name": "vision", "shares": 1}],
                },
                {"name": "ads", "shares": 1},
            ],
        }
    )
    assert _not_an_allocation(tree, name) == said
