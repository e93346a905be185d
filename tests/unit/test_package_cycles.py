"""``tools/package_cycles.py``: the cycle check that ``make lint`` runs finds cycles."""

from __future__ import annotations

import pytest

from package_cycles import cycles

PAIR = ("x", "y")  # the module pair an edge records; not read by ``cycles``


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({}, []),
        ({"a": {"b": PAIR}, "b": {"c": PAIR}}, []),
        ({"a": {"b": PAIR}, "b": {"a": PAIR}}, [["a", "b"]]),
        (
            {"a": {"b": PAIR}, "b": {"c": PAIR}, "c": {"a": PAIR}, "d": {"a": PAIR}},
            [["a", "b", "c"]],
        ),
        (
            {"a": {"b": PAIR}, "b": {"a": PAIR}, "c": {"d": PAIR}, "d": {"c": PAIR}},
            [["a", "b"], ["c", "d"]],
        ),
    ],
)
def test_cycles_are_the_groups_of_packages_that_reach_each_other(
    edges: dict[str, dict[str, tuple[str, str]]], expected: list[list[str]]
) -> None:
    assert sorted(cycles(edges)) == expected
