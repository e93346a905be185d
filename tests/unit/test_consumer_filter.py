"""``bus.consumer_filter``: one subject goes in ``filter_subject`` (any server), several in
``filter_subjects`` (nats-server 2.10 and later), never both."""

from __future__ import annotations

import pytest

from allot.bus import consumer_filter


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        (">", (">", None)),
        (("allot.v1.events.>",), ("allot.v1.events.>", None)),
        (["a.>", "b.>"], (None, ["a.>", "b.>"])),
        (("a.>", "b.>", "c"), (None, ["a.>", "b.>", "c"])),
    ],
)
def test_one_subject_or_several(
    wanted: str | tuple[str, ...] | list[str], expected: tuple[str | None, list[str] | None]
) -> None:
    assert consumer_filter(wanted) == expected
