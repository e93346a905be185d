"""``allot.long_lived``: the collector settings a service process takes after its replay
(``tune_gc``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from allot.long_lived import GC_YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_freezes_what_exists_and_raises_only_the_young_threshold() -> None:
    older = gc.get_threshold()[1:]
    kept = [[i] for i in range(1000)]  # long-lived, like a folded log
    tune_gc()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *older)
    # A cycle made afterwards is still found and freed.
    a: list[object] = []
    a.append(a)
    del a
    assert gc.collect() >= 1
