"""The compiled core's reads of the model's records (``allot.core.state``: ``is_allocated``,
``protected_until``, ``schedulable``) answer exactly as the records' own properties do:
the core calls them instead of the properties, which run in the interpreter."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from allot.core.model import MAX_MIN_RUNTIME_S, Host, HostState, Running, Workload
from allot.core.state import is_allocated, protected_until, schedulable

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
    assert protected_until(run) == run.protected_until
    # Bit for bit: the heap of protection ends compares them with ==.
    assert repr(protected_until(run)) == repr(run.protected_until)


def test_a_host_is_schedulable_only_when_healthy() -> None:
    for state in HostState:
        host = Host("h", 8, state)
        assert schedulable(host) is host.schedulable
    assert [s for s in HostState if schedulable(Host("h", 8, s))] == [HostState.HEALTHY]


def test_unallocated_work_is_never_protected() -> None:
    """No allocation, or no minimum runtime: free and preemptible at once."""
    for w in (Workload("w", None, "u", 1, 3600), Workload("w", "a", "u", 1, 0)):
        assert not is_allocated(w)
        assert protected_until(Running(w, 100.0, (("h", (0,)),))) == 100.0
    allocated = Workload("w", "a", "u", 1, 3600)
    assert is_allocated(allocated)
    assert protected_until(Running(allocated, 100.0, (("h", (0,)),))) == 3700.0
