"""The compiled core's reads of the model's records (``allot.core.running.is_allocated``,
``allot.core.state.schedulable``) answer exactly as the records' own properties do: the
core calls them instead of the properties, which run in the interpreter. ``Running``
copies what the cycle reads of its workload when it is made, and its protection's end:
each copy equals the workload's own field or property, the end the contract's."""

from __future__ import annotations

import copy
import pickle

from hypothesis import given
from hypothesis import strategies as st

from allot.core.model import MAX_MIN_RUNTIME_S, Host, HostState, Workload
from allot.core.running import Running, is_allocated
from allot.core.state import schedulable

workloads = st.builds(
    Workload,
    id=st.just("w"),
    allocation=st.one_of(st.none(), st.sampled_from(["a", "team-b"])),
    user=st.just("u"),
    gpus=st.integers(1, 64),
    min_runtime_s=st.one_of(st.just(0), st.integers(0, MAX_MIN_RUNTIME_S)),
)
times = st.floats(-1e9, 1e10, allow_nan=False, allow_infinity=False)


@given(workloads, times)
def test_the_reads_of_a_run_match_its_properties(w: Workload, start: float) -> None:
    run = Running(w, start, (("h", tuple(range(w.gpus))),))
    assert is_allocated(w) is w.allocated
    assert run.allocated is w.allocated
    assert (run.wid, run.allocation, run.gpus) == (w.id, w.allocation, w.gpus)
    # The contract's protection end, bit for bit: the heap of protection ends compares
    # them with ==.
    expected = start + w.min_runtime_s if w.allocated else start
    assert run.protected_until == expected
    assert repr(run.protected_until) == repr(float(expected))


def test_a_noticed_run_keeps_its_copies_and_compares_by_its_fields() -> None:
    w = Workload("w", "a", "u", 2, 600)
    run = Running(w, 10.0, (("h", (0, 1)),))
    noticed = Running(w, 10.0, run.assignment, preempt_at=40.0)
    assert noticed.protected_until == run.protected_until == 610.0
    assert noticed != run and hash(noticed) != hash(run)
    assert noticed == Running(w, 10.0, (("h", (0, 1)),), 40.0)
    assert hash(noticed) == hash(Running(w, 10.0, (("h", (0, 1)),), 40.0))
    for copied in (pickle.loads(pickle.dumps(noticed)), copy.copy(noticed), copy.deepcopy(noticed)):
        assert copied == noticed and copied.protected_until == 610.0
    assert repr(noticed) == (
        f"Running(workload={w!r}, start_time=10.0, assignment=(('h', (0, 1)),), preempt_at=40.0)"
    )


def test_a_host_is_schedulable_only_when_healthy() -> None:
    for state in HostState:
        host = Host("h", 8, state)
        assert schedulable(host) is host.schedulable
    assert [s for s in HostState if schedulable(Host("h", 8, s))] == [HostState.HEALTHY]


def test_unallocated_work_is_never_protected() -> None:
    """No allocation, or no minimum runtime: free and preemptible at once."""
    for w in (Workload("w", None, "u", 1, 3600), Workload("w", "a", "u", 1, 0)):
        assert not is_allocated(w)
        assert Running(w, 100.0, (("h", (0,)),)).protected_until == 100.0
    allocated = Workload("w", "a", "u", 1, 3600)
    assert is_allocated(allocated)
    assert Running(allocated, 100.0, (("h", (0,)),)).protected_until == 3700.0
