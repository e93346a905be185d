"""Reading the smallest items of a heap without sorting or scanning it all.

``ascending``: a heap's node is no larger than its children, so a best-first walk of the
tree (a small frontier heap of ``(item, position)``) yields the items in order without
popping them: the first ``k`` cost O(k log k), whatever the heap's size. The heap must not
change while the walk runs. ``OrderedIds``: a set of host indices that keeps such a heap
beside it, for the planner's host buckets.
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


class OrderedIds:
    """A set of host indices whose smallest members cost O(k log n) to read: a heap built
    on the first read, pushed to on ``add``. A discarded member stays in the heap until a
    read pops it (each is popped once), and the heap is rebuilt when such entries
    outnumber the members. It holds its set rather than subclassing ``set`` so that the
    compiled core compiles it (decision 0070)."""

    __slots__ = ("_heap", "_members")

    def __init__(self, items: Iterable[int] = ()) -> None:
        self._members: set[int] = set(items)
        self._heap: list[int] | None = None

    def __contains__(self, idx: object) -> bool:
        return idx in self._members

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[int]:
        return iter(self._members)

    def add(self, idx: int) -> None:
        members = self._members
        if idx not in members:
            members.add(idx)
            if self._heap is not None:
                heapq.heappush(self._heap, idx)

    def discard(self, idx: int) -> None:
        self._members.discard(idx)

    def smallest(self, k: int, exclude: Container[int] = ()) -> list[int]:
        """The ``k`` smallest members not in ``exclude``, ascending (fewer if there are
        not that many)."""
        members = self._members
        heap = self._heap
        if heap is None or len(heap) > 2 * len(members) + 32:
            heap = self._heap = sorted(members)
        found: list[int] = []
        kept: list[int] = []  # members popped on the way, pushed back below
        while heap and len(found) < k:
            idx = heapq.heappop(heap)
            if idx not in members or (kept and kept[-1] == idx):
                continue  # discarded, or a second entry of a member re-added
            kept.append(idx)
            if idx not in exclude:
                found.append(idx)
        for idx in kept:
            heapq.heappush(heap, idx)
        return found

    def first(self, exclude: Container[int] = ()) -> int | None:
        """The smallest member not in ``exclude``."""
        found = self.smallest(1, exclude)
        return found[0] if found else None
