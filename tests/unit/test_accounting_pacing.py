"""Accounting's pull pacing: a drained consumer is pulled at most every ``FETCH_EVERY_S``,
a backlog at once (``pull_delay``)."""

from __future__ import annotations

import pytest

from allot.services.accounting import BATCH, FETCH_EVERY_S, pull_delay

# (events the last pull gave, seconds since it was sent, expected wait)
CASES = [
    (0, 0.0, FETCH_EVERY_S),  # nothing new: wait the whole interval
    (1, 0.0, FETCH_EVERY_S),
    (BATCH - 1, 0.25, FETCH_EVERY_S - 0.25),  # drained by this pull: the rest of it
    (BATCH - 1, FETCH_EVERY_S + 3.0, 0.0),  # the pull itself took longer: no wait
    (BATCH, 0.0, 0.0),  # a full batch: more are waiting, pull again now
    (BATCH, 0.5, 0.0),
]


@pytest.mark.parametrize(("fetched", "elapsed", "expected"), CASES)
def test_pull_delay(fetched: int, elapsed: float, expected: float) -> None:
    pulled_at = 100.0
    assert pull_delay(fetched, pulled_at, pulled_at + elapsed) == pytest.approx(expected)


def test_a_backlog_is_read_faster_than_one_batch_per_interval() -> None:
    """Three full batches then a partial one, pulled in the loop's order: the backlog takes
    no waiting at all, where pacing every pull took three intervals (the cap it had)."""
    now, waited = 0.0, 0.0
    for fetched in (BATCH, BATCH, BATCH, 10):
        wait = pull_delay(fetched, now, now)
        waited += wait
        now += wait
    assert waited == pytest.approx(FETCH_EVERY_S)  # only after the partial batch
