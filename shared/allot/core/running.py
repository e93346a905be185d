"""``Running``: a workload holding GPUs, the record a cycle reads most.

It was a frozen dataclass of ``model``, which is interpreted (``tools/build_core.py`` says
why): every read of its fields from the compiled core was a generic attribute lookup. Here
it is a plain class with a written-out ``__init__``, so that mypyc compiles it and the
core reads its fields directly (decision 0071). It keeps the dataclass's behaviour: its
fields are ``Final`` (never assigned after ``__init__``; the compiled class refuses it at
run time too; the source core leaves that to mypy), equality and hash by its four fields,
the same ``repr``, pickling and ``copy``. It also copies what a cycle reads of its workload
on every visit (id, allocation, GPUs, whether it is allocated) and its protection's end.
"""

from __future__ import annotations

from typing import Final

from allot.core.model import Assignment, Workload


def is_allocated(w: Workload) -> bool:
    """``Workload.allocated`` (charged to a budget and protected for its minimum runtime),
    computed here: ``model`` is interpreted (``tools/build_core.py`` says why), and a call
    of one of its properties from compiled code runs an interpreter frame, millions of them
    per simulated month (decision 0069). The same expression, so the same answer
    (``tests/unit/test_record_reads.py``)."""
    return w.allocation is not None and w.min_runtime_s > 0


class Running:
    """A workload holding GPUs since ``start_time``.

    ``preempt_at`` is set once a preemption notice has been issued: the GPUs count as free
    from that moment (end of the grace period); until then nobody else may use them.
    """

    __slots__ = (
        "allocated",
        "allocation",
        "assignment",
        "gpus",
        "preempt_at",
        "protected_until",
        "start_time",
        "wid",
        "workload",
    )

    def __init__(
        self,
        workload: Workload,
        start_time: float,
        assignment: Assignment,
        preempt_at: float | None = None,
    ) -> None:
        self.workload: Final = workload
        self.start_time: Final = start_time
        self.assignment: Final = assignment
        self.preempt_at: Final = preempt_at
        # What the cycle reads of the workload on every visit, copied once here: reading
        # them from the interpreted ``Workload`` is a generic lookup each time.
        self.wid: Final = workload.id
        self.allocation: Final = workload.allocation
        self.gpus: Final = workload.gpus
        self.allocated: Final = is_allocated(workload)
        # The end of the protected window; unallocated work is never protected.
        self.protected_until: Final[float] = (
            start_time + workload.min_runtime_s if self.allocated else start_time
        )

    def _fields(self) -> tuple[Workload, float, Assignment, float | None]:
        return (self.workload, self.start_time, self.assignment, self.preempt_at)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Running):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __reduce__(self) -> tuple[type[Running], tuple[Workload, float, Assignment, float | None]]:
        # Pickling and ``copy`` as the dataclass allowed (a compiled class has no default).
        return (Running, self._fields())

    def __repr__(self) -> str:
        return (
            f"Running(workload={self.workload!r}, start_time={self.start_time!r}, "
            f"assignment={self.assignment!r}, preempt_at={self.preempt_at!r})"
        )

    def protected(self, now: float) -> bool:
        return now < self.protected_until

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(h for h, _ in self.assignment)
