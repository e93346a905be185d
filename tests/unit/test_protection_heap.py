"""``next_protection_end`` walks the protection heap as a tree; it must equal a full scan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from allot.core.model import Host, Workload
from allot.core.state import ClusterState

ops = st.lists(
    st.tuples(
        st.sampled_from(["start", "finish", "prune"]), st.integers(0, 40), st.integers(1, 50)
    ),
    max_size=60,
)


def brute(state: ClusterState, now: float) -> float | None:
    ends = [r.protected_until for r in state.running.values() if r.workload.allocated]
    later = [t for t in ends if t > now]
    return min(later) if later else None


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(0, 100))
def test_matches_a_full_scan(steps: list[tuple[str, int, int]], now: int) -> None:
    state = ClusterState([Host(f"h{i}", 8) for i in range(8)])
    clock = 0.0
    pruned_at = 0.0  # callers' clocks only move forward: never ask about before a prune
    for n, (op, k, runtime) in enumerate(steps):
        clock += 1
        running = sorted(state.running)
        if op == "start":
            host = f"h{k % 8}"
            free = state.free[host]
            if not free:
                continue
            w = Workload(f"w{n}", "a" if k % 3 else None, "u", 1, runtime, submit_time=clock)
            state.start(w, ((host, (free[0],)),), clock)
        elif op == "finish" and running:
            state.finish(running[k % len(running)])
        elif op == "prune":
            state.prune_protection(clock)
            pruned_at = clock
    query = max(float(now), pruned_at)
    assert state.next_protection_end(query) == brute(state, query)
