"""The collector settings of a long-lived process that holds a large state (a service after
its replay; the benchmarks that time the core as a service runs it).

``tune_gc`` once the state is loaded: what exists then (imports, the folded log: tens of
thousands of objects in placement) lives as long as the process, so ``gc.freeze`` takes it
out of every collection and a full collection no longer walks it (a pause of tens of ms
between two messages). Each message or cycle allocates many short-lived objects; a higher
young threshold collects them in fewer, equally cheap passes. Reference counting frees
almost everything anyway: the collector only finds cycles. Standard library only, so a
core-only benchmark imports it without the services' dependencies.
"""

from __future__ import annotations

import gc

GC_YOUNG_THRESHOLD = 50_000
"""Allocations between two young-generation collections (CPython's default: 700)."""


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
