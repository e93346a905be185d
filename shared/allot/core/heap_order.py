"""Reading a binary heap in ascending order without popping it.

A heap's node is no larger than its children, so a best-first walk of the tree (a small
frontier heap of ``(item, position)``) yields the items in order: the first ``k`` cost
O(k log k), whatever the heap's size. The heap must not change while the walk runs.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Iterable, Iterator
from typing import Any


def ascending(heap: list[Any]) -> Iterator[Any]:
    """The items of ``heap`` (a ``heapq`` list) in ascending order, lazily."""
    if not heap:
        return
    frontier = [(heap[0], 0)]
    size = len(heap)
    while frontier:
        item, i = heapq.heappop(frontier)
        yield item
        left = 2 * i + 1
        if left < size:
            heapq.heappush(frontier, (heap[left], left))
            if left + 1 < size:
                heapq.heappush(frontier, (heap[left + 1], left + 1))


class OrderedIds(set[int]):
    """A set of host indices that also reads in ascending order for the price of the
    items read: a heap built on the first ordered read, pushed to on ``add``; discarded
    items stay in it until they reach the top (reads skip them), and it is rebuilt when
    they outnumber the members."""

    __slots__ = ("_heap",)

    def __init__(self, items: Iterable[int] = ()) -> None:
        super().__init__(items)
        self._heap: list[int] | None = None

    def add(self, idx: int) -> None:
        if idx not in self:
            super().add(idx)
            if self._heap is not None:
                heapq.heappush(self._heap, idx)

    def _ordered(self) -> list[int]:
        heap = self._heap
        if heap is None or len(heap) > 2 * len(self) + 32:
            heap = self._heap = sorted(self)
        while heap and heap[0] not in self:
            heapq.heappop(heap)
        return heap

    def ascending(self) -> Iterator[int]:
        """The members, smallest first, lazily. Do not change the set while reading."""
        heap = self._ordered()
        if not heap:
            return
        top = heap[0]  # a member: ``_ordered`` dropped what was above it
        yield top  # most readers need only this one
        seen = {top}
        for idx in ascending(heap):
            if idx in self and idx not in seen:
                seen.add(idx)
                yield idx

    def first(self, exclude: Container[int] = ()) -> int | None:
        """The smallest member not in ``exclude``."""
        for idx in self.ascending():
            if idx not in exclude:
                return idx
        return None
