"""``GroupCommit``'s settings are checked when it is made (no server needed)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from allot.bus.group_commit import MAX_BATCH, THRESHOLD, GroupCommit

NO_SERVER = cast(Any, None)


def _made(threshold: int, max_batch: int, linger_s: float) -> GroupCommit:
    return GroupCommit(
        NO_SERVER,
        NO_SERVER,
        atomic=True,
        threshold=threshold,
        max_batch=max_batch,
        linger_s=linger_s,
    )


@pytest.mark.parametrize(
    ("threshold", "max_batch", "linger_s"),
    [
        (0, MAX_BATCH, 0.0),
        (THRESHOLD, 1, 0.0),
        (THRESHOLD, 1001, 0.0),
        (THRESHOLD, MAX_BATCH, -0.01),
    ],
)
def test_a_setting_out_of_range_is_refused(threshold: int, max_batch: int, linger_s: float) -> None:
    with pytest.raises(ValueError, match="threshold must be >= 1, max_batch 2-1000 and linger_s"):
        _made(threshold, max_batch, linger_s)


@pytest.mark.parametrize(("threshold", "max_batch", "linger_s"), [(1, 2, 0.0), (8, 1000, 0.025)])
def test_settings_in_range_are_kept(threshold: int, max_batch: int, linger_s: float) -> None:
    g = _made(threshold, max_batch, linger_s)
    assert (g.threshold, g.max_batch, g.linger_s) == (threshold, max_batch, linger_s)
